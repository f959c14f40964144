"""The low-bit schemes (int3, int2, ternary): packing, the bytes each code really takes, the rounding rules,
and the layers they refuse. Everything a scheme goes through (quantize -> bench -> export) is in
test_schemes.py, which walks the registry."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specpress.compress.quantize.api import quantize
from specpress.errors import ConfigError
from specpress.models.quantized import primitives as P
from specpress.models.quantized.lowbit import LowBitLinear, quantize_lowbit
from specpress.models.quantized.scheme import config_for


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_dense_packing_round_trips_least_significant_bits_first(bits):
    q = torch.randint(0, 2 ** bits, (5, 64), generator=torch.Generator().manual_seed(bits))
    p = P.pack_bits(q, bits)
    assert p.shape == (5, 64 * bits // 8) and torch.equal(P.unpack_bits(p, bits, 64), q.to(torch.uint8))
    stream = "".join(format(int(b), "08b")[::-1] for b in p[0])  # row 0's bits, LSB of byte 0 first
    assert [int(stream[bits * j:bits * j + bits][::-1], 2) for j in range(64)] == q[0].tolist()
    if bits == 4:
        assert torch.equal(p, P.pack_int4(q))  # the int4 layout is the same stream


def test_trits_pack_five_per_byte():
    q = torch.randint(0, 3, (3, 17), generator=torch.Generator().manual_seed(0))
    p = P.pack_trits(q)
    assert p.shape == (3, 4) and int(p.max()) <= 242 and torch.equal(P.unpack_trits(p, 17), q.to(torch.uint8))
    assert int(P.pack_trits(torch.tensor([[2, 1, 0, 0, 1]]))[0, 0]) == 2 + 1 * 3 + 1 * 81


@pytest.mark.parametrize("word,bits_per_code", [("int3", 3.0), ("int2", 2.0), ("ternary", 8 * 103 / 512)])
def test_bytes_per_weight_are_what_the_codes_take(word, bits_per_code):
    """Codes at their width (ternary: 5 per byte, a row of 512 in 103 bytes), plus an fp16 scale per 64."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(512, 256, bias=False))
    quantize(m, config_for(word))
    mod = m[0]
    sd = mod.state_dict()
    assert sd["qweight"].numel() * 8 / (256 * 512) == pytest.approx(bits_per_code)
    assert sd["scales"].dtype == torch.float16 and sd["scales"].numel() == 256 * 512 // 64
    total = sum(t.numel() * t.element_size() for t in sd.values()) * 8 / (256 * 512)
    assert total == pytest.approx(bits_per_code + 16 / 64)


def test_rounding_rules():
    torch.manual_seed(0)
    w = torch.randn(8, 64)
    for word, lo, hi in (("int3", 0, 7), ("int2", 0, 3)):
        bits = {"int3": 3, "int2": 2}[word]
        q, s, z = quantize_lowbit(w, word, 64, True)
        assert int(q.min()) >= lo and int(q.max()) <= hi and torch.all(z == 2 ** (bits - 1))
        # the largest-magnitude weight of each row maps exactly to the most negative code (llama.cpp's rule)
        big = w.abs().argmax(1)
        assert torch.all(q[torch.arange(8), big] == 0)
        assert torch.equal(s.to(torch.float16).float(), s)  # scales are what fp16 stores
        qa, sa, za = quantize_lowbit(w, word, 64, False)
        assert P.sqnr(w, P.dequantize_int(qa, sa, za)) > 0 and int(za.max()) <= hi
    q, s, z = quantize_lowbit(w, "ternary", 64, True)
    assert set(q.unique().tolist()) <= {0, 1, 2} and torch.all(z == 1)
    torch.testing.assert_close(s, w.abs().mean(1, keepdim=True), rtol=1e-3, atol=0)  # BitNet b1.58's absmean
    zeros = torch.zeros(2, 64)
    for word in ("int3", "int2", "ternary"):
        q, s, z = quantize_lowbit(zeros, word, 64, True)
        assert torch.all(P.dequantize_int(q, s, z) == 0)


def test_low_bit_configs_refuse_what_they_cannot_do():
    with pytest.raises(ConfigError, match="ternary codes are .* --asymmetric does not apply"):
        config_for("ternary", symmetric=False)
    with pytest.raises(ConfigError, match="int2 is weight-only"):
        config_for("int2", activations="dynamic")
    with pytest.raises(ConfigError, match="does not take --method awq"):
        config_for("int3", "awq")
    m = nn.Sequential(nn.Linear(96, 8))
    with pytest.raises(ConfigError, match="group size 64 does not divide 0's in_features 96"):
        quantize(m, config_for("int2"))
    m = nn.Sequential(nn.Linear(12, 8))
    with pytest.raises(ConfigError, match="in_features 12 is not a multiple of 8; int3 packs"):
        quantize(m, config_for("int3", group_size=4))
    assert isinstance(quantize(nn.Sequential(nn.Linear(12, 8)), config_for("ternary", group_size=4))[0], LowBitLinear)
