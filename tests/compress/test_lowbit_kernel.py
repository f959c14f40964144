"""int3 / int2 / ternary LowBitLinear on CPU through aten's int4 kernel (lowbit.py, int4_cpu.py): codes shifted
to q - z + 8 reproduce the stored weight exactly under the kernel's arithmetic, the module matches the dequantize
path at bf16 precision and never writes the packed copy (its fallbacks are tested with int4's, in
test_int4_kernel.py)."""

from __future__ import annotations

import pytest
import torch
from test_quantize import _Ops  # records the aten ops a block dispatches
from torch import nn

from specpress.models.quantized import int4_cpu
from specpress.models.quantized.lowbit import KERNEL_NOTE, LowBitLinear, quantize_lowbit
from specpress.models.quantized.modules import QuantizedLinear

OP = "aten._weight_int4pack_mm_for_cpu.default"
FORMATS = [("int3", True), ("int3", False), ("int2", True), ("int2", False), ("ternary", True)]


def module(fmt: str, symmetric: bool, n: int = 64, k: int = 256, group_size: int = 64, seed: int = 0) -> LowBitLinear:
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(k, n)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * 0.02)
        lin.bias.normal_(0, 0.1, generator=g)
    q, s, z = quantize_lowbit(lin.weight.detach(), fmt, group_size, symmetric)
    return LowBitLinear.from_codes(lin, q, s, z, format=fmt, group_size=group_size, symmetric=symmetric)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("fmt,symmetric", FORMATS)
def test_shifted_codes_are_the_stored_weight_under_the_kernels_arithmetic(fmt, symmetric):
    """The packed codes with fp32 scales and a zero term of 0 (the kernel's scalar, exact-precision loop) give
    x·Wᵀ of the dequantized weight to fp32 rounding: the shift to zero point 8 loses nothing."""
    m = module(fmt, symmetric)
    sz = int4_cpu.scales_and_zeros(m.scales, torch.full_like(m.scales, 8.0), torch.float32)
    assert not sz[..., 1].any()  # no zero term left to round
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1))
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, m.int4_packed, 64, sz)
    assert rel(y, x @ m.dequantize(torch.float32).T) < 1e-5


@pytest.mark.parametrize("fmt,symmetric", FORMATS)
@pytest.mark.parametrize("rows", [1, 9])
def test_forward_runs_the_kernel_at_bf16_precision(fmt, symmetric, rows):
    m = module(fmt, symmetric)
    assert m.kernel_note == KERNEL_NOTE and m.int4_packed.shape == (64, 128)
    x = torch.randn(2, rows, 256, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), _Ops() as log:
        y = m(x)
    assert OP in log.ops and y.dtype == torch.float32 and y.shape == (2, rows, 64)
    # bf16-rounded activations and scales only (measured <= 3.1e-3 at 256 x 768)
    assert rel(y, QuantizedLinear.forward(m, x)) < 1e-2


def test_state_dict_holds_only_the_stored_tensors_and_a_load_packs():
    m = module("int3", False)
    sd = m.state_dict()
    assert set(sd) == {"qweight", "scales", "qzeros", "bias"}  # the packed copy is never written
    fresh = LowBitLinear.empty(nn.Linear(256, 64), torch.float32, format="int3", group_size=64, symmetric=False,
                               stored=sd, where="test")
    assert fresh.int4_packed is None and "not loaded" in fresh.kernel_note
    fresh.load_state_dict(sd, assign=True)
    assert fresh.kernel_note == KERNEL_NOTE and torch.equal(fresh.int4_packed, m.int4_packed)
