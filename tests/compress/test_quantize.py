"""quantize: SQNR floors per scheme, the quantized modules against their CPU reference and against
bitsandbytes' own modules, packing, GPTQ vs RTN, configs and bad input. (Families, the speculative loop,
artifacts, inspect and the CLI: test_quantize_artifacts.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from specpress.compress.quantize.api import quantize, select_modules
from specpress.compress.quantize.gptq import gptq_codes
from specpress.errors import ConfigError, RequestError
from specpress.models.quantized import primitives as P
from specpress.models.quantized.bnb import Bnb4bitLinear, Bnb8bitLinear, BnbConfig
from specpress.models.quantized.fp8 import Fp8Config, Fp8Linear
from specpress.models.quantized.integer import GPTQConfig, IntConfig, IntLinear
from specpress.models.quantized.scheme import config_for, config_from_dict

SHAPES = [(64, 128), (96, 256), (256, 512)]


def weight(shape, seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.02


def linear(w: torch.Tensor, bias: bool = False) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=bias)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias:
            lin.bias.normal_(0, 0.1)
    return lin


def rtn(lin: nn.Linear, bits: int, group_size: int | None, symmetric: bool) -> IntLinear:
    q, s, z = P.quantize_int(lin.weight.detach(), bits, group_size, symmetric)
    return IntLinear.from_codes(lin, q, s, z, bits=bits, group_size=group_size, symmetric=symmetric)


# ------------------------------------------------------------------------------------ SQNR floors
# Measured on N(0, 0.02) weights over these shapes and 3 seeds (min dB): int8 42.0 (asym 42.6);
# int4 sym g32/g64/g128 21.2/20.3/19.5, asym 21.8/20.8/19.8; nf4 b32/64/128 21.1/20.7/20.3;
# fp4 18.8/18.2/17.7; bnb int8 42.0; fp8 31.5. Floors sit ~0.5 dB below.

INT_FLOORS = [(8, None, True, 41.0), (8, None, False, 41.0), (4, 32, True, 20.5), (4, 64, True, 19.8),
              (4, 128, True, 19.0), (4, 32, False, 21.3), (4, 64, False, 20.3), (4, 128, False, 19.4)]


def test_round_floats_rounds_every_float_in_place_in_blocks_or_whole():
    """round_floats rounds a block at a time where it can (past one block of 2**20 here) and a non-contiguous
    tensor whole: every float ends as its bfloat16 value, in its own dtype and storage."""
    from specpress.compress.quantize.api import round_floats

    m = nn.Module()
    m.big = nn.Parameter(weight((1100, 1000)))
    m.strided = nn.Parameter(weight((64, 48), seed=2).t())  # not contiguous
    want = {k: v.detach().to(torch.bfloat16).float() for k, v in m.state_dict().items()}
    ptrs = {k: v.data_ptr() for k, v in m.state_dict().items()}
    assert not torch.equal(want["big"], m.big.detach())
    round_floats(m, torch.bfloat16)
    for k, v in m.state_dict().items():
        assert v.dtype == torch.float32 and v.data_ptr() == ptrs[k] and torch.equal(v, want[k]), k


def test_sqnr_in_blocks_is_the_whole_tensor_formula():
    """sqnr sums float64 a block at a time (a large Linear never gets whole float64 copies): same value as the
    formula over the whole tensor, across a block edge, and inf when nothing changed."""
    import math

    ref = weight((1030, 1100))  # 1,133,000 elements: past one block of 2**20
    approx = ref + 1e-3 * weight((1030, 1100), seed=1)
    r, a = ref.double(), approx.double()
    whole = 10 * math.log10(r.pow(2).sum().item() / (r - a).pow(2).sum().item())
    assert P.sqnr(ref, approx) == pytest.approx(whole, rel=1e-12)
    assert P.sqnr(ref, ref.clone()) == math.inf


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bits,group_size,symmetric,floor", INT_FLOORS)
def test_int_sqnr_floor(shape, bits, group_size, symmetric, floor):
    w = weight(shape)
    m = rtn(linear(w), bits, group_size, symmetric)
    assert P.sqnr(w, m.dequantize(torch.float32)) >= floor


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("quant_type,blocksize,floor", [("nf4", 32, 20.5), ("nf4", 64, 20.2), ("nf4", 128, 19.8),
                                                        ("fp4", 32, 18.3), ("fp4", 64, 17.8), ("fp4", 128, 17.2)])
def test_bnb4_sqnr_floor(shape, quant_type, blocksize, floor):
    w = weight(shape)
    assert P.sqnr(w, Bnb4bitLinear.from_linear(linear(w), quant_type, blocksize).dequantize(torch.float32)) >= floor


@pytest.mark.parametrize("shape", SHAPES)
def test_bnb8_and_fp8_sqnr_floors(shape):
    w = weight(shape)
    assert P.sqnr(w, Bnb8bitLinear.from_linear(linear(w)).dequantize(torch.float32)) >= 41.0
    assert P.sqnr(w, Fp8Linear.from_linear(linear(w)).dequantize(torch.float32)) >= 31.0


# ------------------------------------------------------------------------------------ primitives


def test_int4_packing_and_code_ranges():
    q = torch.randint(0, 16, (6, 10), generator=torch.Generator().manual_seed(0), dtype=torch.int16)
    p = P.pack_int4(q)
    assert p.dtype == torch.uint8 and p.shape == (6, 5)
    assert torch.equal(P.unpack_int4(p).to(torch.int16), q)
    assert int(p[0, 0]) == int(q[0, 0]) | (int(q[0, 1]) << 4)  # column 0 in the low nibble
    w = weight((16, 64))
    q4, s, _ = P.quantize_int(w, 4, 32, True)
    assert 0 <= int(q4.min()) and int(q4.max()) <= 15
    # Q4_0's rule: the largest-magnitude weight of each group is reproduced exactly
    deq = P.dequantize_int(q4, s, torch.full_like(s, 8)).view(16, 2, 32)
    g = w.view(16, 2, 32)
    idx = g.abs().argmax(-1, keepdim=True)
    assert torch.allclose(deq.gather(-1, idx), g.gather(-1, idx), atol=1e-7)
    q8, _, _ = P.quantize_int(w, 8, None, True)
    assert 1 <= int(q8.min()) and int(q8.max()) <= 255


def test_zero_rows_and_groups_are_exact():
    w = weight((8, 64))
    w[2] = 0
    w[3, :32] = 0
    for bits, g, sym in ((4, 32, True), (4, 32, False), (8, None, True)):
        deq = rtn(linear(w), bits, g, sym).dequantize(torch.float32)
        assert torch.equal(deq[2], w[2]) and torch.equal(deq[3, :32], w[3, :32])


# ------------------------------------------------------------------------------------ modules


def modules_for(lin: nn.Linear) -> dict[str, nn.Module]:
    return {"int4-sym": rtn(lin, 4, 32, True), "int4-asym": rtn(lin, 4, 32, False), "int8": rtn(lin, 8, None, True),
            "int8-asym": rtn(lin, 8, None, False), "fp8": Fp8Linear.from_linear(lin),
            "nf4": Bnb4bitLinear.from_linear(lin, "nf4", 64), "fp4": Bnb4bitLinear.from_linear(lin, "fp4", 32),
            "bnb-int8": Bnb8bitLinear.from_linear(lin)}


@pytest.mark.parametrize("rows", [1, 7])
def test_forward_equals_dequantize_then_matmul(rows):
    lin = linear(weight((48, 128)), bias=True)
    x = torch.randn(2, rows, 128, generator=torch.Generator().manual_seed(1))
    for name, m in modules_for(lin).items():
        ref = x @ m.dequantize(torch.float32).T + lin.bias
        # per-row int8 and int4 (groups of 32, N = 48) multiply their codes with bf16-rounded activations
        # in aten's kernels (IntLinear.forward; tests/compress/test_int4_kernel.py)
        tol = 1e-2 * float(ref.abs().max()) if name in ("int8", "int4-sym", "int4-asym") else 1e-5
        assert (m(x) - ref).abs().max() <= tol, name
        assert torch.equal(m.weight, m.dequantize(torch.float32)), name


class _Ops(TorchDispatchMode):
    """Records the aten ops a block of code dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def fallback_call(m: nn.Module, inp: object, seed: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The kernel tests' fallback case: m(x) on 3 random rows, x tracking grad (inp "grad") or cast to the
    dtype `inp` (None: fp32); returns (x, y, the aten ops dispatched)."""
    x = torch.randn(3, m.in_features, generator=torch.Generator().manual_seed(seed))
    if inp == "grad":
        x.requires_grad_()
    elif inp is not None:
        x = x.to(inp)
    with _Ops() as log:
        y = m(x)
    return x, y, log.ops


def test_int8_per_row_multiplies_codes_on_cpu_and_dequantizes_otherwise():
    lin = linear(weight((48, 128)), bias=True)
    m = rtn(lin, 8, None, True)
    x = torch.randn(2, 5, 128, generator=torch.Generator().manual_seed(3))
    ref = x @ m.dequantize(torch.float32).T + lin.bias
    with _Ops() as log:
        y = m(x)
    assert "aten._weight_int8pack_mm.default" in log.ops
    assert y.dtype == torch.float32 and y.shape == (2, 5, 48)
    assert (y - ref).abs().max() <= 1e-2 * ref.abs().max()  # activations rounded to bf16 for the product
    # Codes that start mid-cache-line (as a safetensors file can hand them over) are realigned: aten's
    # kernel crashes on them from 16 rows up.
    q = m.qweight
    odd = torch.zeros(q.numel() + 64, dtype=torch.int8)[40:40 + q.numel()].view_as(q)
    odd.copy_(q)
    m.load_state_dict({"qweight": odd, "scales": m.scales, "bias": m.bias})
    assert m.qweight.data_ptr() % 64 == 0 and torch.equal(m.qweight, q)
    many = torch.randn(64, 128, generator=torch.Generator().manual_seed(4))
    ref = many @ m.dequantize(torch.float32).T + lin.bias
    assert (m(many) - ref).abs().max() <= 1e-2 * ref.abs().max()
    # Everything else dequantizes: bf16 inputs, grad-tracking inputs, grouped scales, K not a multiple of 16.
    others = [(rtn(lin, 8, None, True).to(torch.bfloat16), x.bfloat16()),
              (rtn(lin, 8, 32, True), x), (rtn(linear(weight((48, 40))), 8, None, True), x[..., :40])]
    for module, inp in others:
        with _Ops() as log:
            module(inp)
        assert "aten._weight_int8pack_mm.default" not in log.ops
    xg = x.clone().requires_grad_()
    with _Ops() as log:
        m(xg).sum().backward()
    assert "aten._weight_int8pack_mm.default" not in log.ops and xg.grad is not None


def test_bnb_modules_match_bitsandbytes_own_modules():
    bnb = pytest.importorskip("bitsandbytes")
    lin = linear(weight((48, 128)))
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(2))
    for qt in ("nf4", "fp4"):
        ref = bnb.nn.Linear4bit(128, 48, bias=False, compress_statistics=False, quant_type=qt)
        ref.load_state_dict(lin.state_dict())
        ref = ref.to("cpu")  # bitsandbytes quantizes on .to(device)
        mine = Bnb4bitLinear.from_linear(lin, qt, 64)
        theirs = ref.state_dict()
        ours = mine.state_dict()
        assert ours.keys() == theirs.keys()
        for k in ours:
            assert torch.equal(ours[k].reshape(-1), theirs[k].reshape(-1)), (qt, k)
        assert (mine(x) - ref(x)).abs().max() <= 1e-5
    ref8 = bnb.nn.Linear8bitLt(128, 48, bias=False, has_fp16_weights=False)
    ref8.load_state_dict(lin.state_dict())
    ref8 = ref8.to("cpu")
    mine8 = Bnb8bitLinear.from_linear(lin)
    assert torch.equal(mine8.packed, ref8.weight.data) and torch.equal(mine8.scb, ref8.weight.SCB)
    assert set(mine8.state_dict()) == {"weight", "SCB", "weight_format"}


def test_dtype_moves_keep_quantized_tensors():
    for name, m in modules_for(linear(weight((32, 64)), bias=True)).items():
        stored = {k: v.clone() for k, v in m.state_dict().items() if k != "bias"}
        m.half()
        assert m.compute_dtype == torch.float16 and m.bias.dtype == torch.float16, name
        for k, v in m.state_dict().items():
            if k != "bias":
                assert v.dtype == stored[k].dtype and torch.equal(v, stored[k]), (name, k)
        assert m(torch.randn(2, 64).half()).dtype == torch.float16
        assert m.weight.dtype == torch.float16


# ------------------------------------------------------------------------------------ GPTQ


def correlated_inputs(m: int, k: int, rank: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, rank, generator=g) @ torch.randn(rank, k, generator=g) + 0.1 * torch.randn(m, k, generator=g)


@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 64, True), (4, 32, False), (8, None, True)])
def test_gptq_beats_rtn_on_correlated_inputs(bits, group_size, symmetric):
    x = correlated_inputs(1024, 256, 32)
    base = nn.Sequential(linear(weight((64, 256))), nn.ReLU(), linear(weight((32, 64), 1)))
    ref = base(x)
    errs = {}
    for cfg in (IntConfig(bits=bits, group_size=group_size, symmetric=symmetric),
                GPTQConfig(bits=bits, group_size=group_size, symmetric=symmetric)):
        m = quantize(_copy(base), cfg, calibration=lambda mod: mod(x))
        errs[cfg.method] = (m(x) - ref).pow(2).mean().item()
        assert m.provenance[-1]["method"] == cfg.method
    assert errs["gptq"] < 0.5 * errs["rtn"], errs


def _copy(m: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(m)


def test_gptq_lazy_blocks_are_exact_and_sequential_groups_share_inputs():
    w, x = weight((16, 128)), correlated_inputs(512, 128, 16)
    h = 2 * x.T @ x / 512
    a = gptq_codes(w, h, bits=4, group_size=32, symmetric=True, block_size=1)
    b = gptq_codes(w, h, bits=4, group_size=32, symmetric=True, block_size=64)
    assert torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1], rtol=1e-5, atol=0)  # same codes, scales to fp32
    from specpress.compress.quantize.gptq import call_groups

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.o = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, t):
            return self.o(self.q(t) * self.k(t))

    groups, uncalled = call_groups(Attn(), ["q", "k", "o"], lambda mod: [mod(torch.randn(3, 8)) for _ in range(2)])
    assert groups == [["q", "k"], ["o"]] and uncalled == []


def test_gptq_needs_calibration():
    with pytest.raises(RequestError, match="--target DIR and --data PATH"):
        quantize(nn.Sequential(nn.Linear(64, 8)), GPTQConfig(bits=4, group_size=32))


# ------------------------------------------------------------------------------------ configs and bad input


def test_config_words_and_round_trip():
    assert config_for("int4") == IntConfig(bits=4, group_size=64, symmetric=True)
    assert config_for("int8") == IntConfig(bits=8, group_size=None)
    assert config_for("nf4") == BnbConfig(quant_type="nf4", blocksize=64)
    assert config_for("int8", "bnb") == BnbConfig(quant_type="int8", blocksize=None)
    assert config_for("fp8") == Fp8Config(activations="dynamic")
    assert config_for("fp8", activations="none") == Fp8Config()
    assert config_for("int4", "gptq", group_size=32, symmetric=False, include=("lm_head",)) == \
        GPTQConfig(bits=4, group_size=32, symmetric=False, include=("lm_head",))
    for c in (config_for("int4", "gptq"), config_for("fp4"), config_for("fp8", exclude=("fc",))):
        assert config_from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match="unknown key.*'bitz'"):
        config_from_dict({**config_for("int4").to_dict(), "bitz": 3})
    with pytest.raises(ConfigError, match="known: awq, bnb, fp8, gptq, int"):
        config_from_dict({"name": "hqq"})


@pytest.mark.parametrize("args,match", [
    (("nf4", "gptq"), "use --method bnb"),
    (("int4", "bnb"), "use --method rtn or gptq .*goes with --scheme int8, nf4, fp4"),
    (("fp8", "rtn", 32), "do not apply"),
    (("int8", "bnb", 64), "drop --group-size"),
    (("nf4", "bnb", 48), "blocksize must be one of"),
    (("int4", "rtn", 7), "must be even"),
])
def test_bad_scheme_combinations(args, match):
    with pytest.raises(ConfigError, match=match):
        config_for(*args[:2], group_size=args[2] if len(args) > 2 else None)


def test_bad_layers_are_named():
    model = nn.Sequential(nn.Linear(96, 32), nn.Linear(32, 40))
    with pytest.raises(ConfigError, match=r"does not divide 0's in_features 96; use --group-size 32"):
        quantize(_copy(model), IntConfig(bits=4, group_size=64))
    with pytest.raises(ConfigError, match=r"bitsandbytes block size 64 does not divide 0's in_features 96.*"
                                          r"--group-size 32"):
        quantize(_copy(model), BnbConfig(quant_type="nf4", blocksize=64))
    with pytest.raises(ConfigError, match="matches no Linear.*0, 1"):
        select_modules(model, IntConfig(include=("lm_head",)))
    with pytest.raises(RequestError, match="cannot be quantized"):
        quantize(_copy(model).double(), BnbConfig(quant_type="nf4", blocksize=32))
    q = quantize(_copy(model), IntConfig(bits=8, group_size=None))
    with pytest.raises(RequestError, match="already quantized"):
        quantize(q, IntConfig(bits=4, group_size=32))


def test_fp8_without_torch_support_is_refused(monkeypatch):
    monkeypatch.delattr(torch, "float8_e4m3fn")
    with pytest.raises(RequestError, match="no float8_e4m3fn"):
        quantize(nn.Sequential(nn.Linear(32, 8)), Fp8Config())
