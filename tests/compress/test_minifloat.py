"""NVFP4, MXFP4 and MXFP8 numerics against independent implementations: NVIDIA Model Optimizer's quantized-tensor
classes (nvidia-modelopt 0.47, pure Python, CPU) and torchao's MX / NVFP4 reference code (torchao 0.18). Both
are installed by .ci/run (the `numerics` extra); nothing here copies their formulas.

Where the two references disagree, specpress follows the one engines quantize with and the test says so:
  - an all-zero NVFP4 block: Model Optimizer stores block scale 1.0 (torchao a tiny one); specpress 1.0;
  - MX exponents: Model Optimizer's ceil(log2(amax / elem_max)) equals torchao's RCEIL mode, not the OCP
    spec's FLOOR (which clips the block's largest values); specpress ceil;
  - MXFP4 element rounding: Model Optimizer's MXFP4QTensor rounds e2m1 ties down and writes zeros as -0
    codes; torchao (and the hardware conversion) rounds to nearest even; specpress even, checked against
    torchao (and against Model Optimizer's scales).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from specpress.models.quantized import minifloat as M

modelopt_qtensor = pytest.importorskip("modelopt.torch.quantization.qtensor",
                                       reason="nvidia-modelopt is installed by .ci/run (pip install -e '.[numerics]')")
mx_tensor = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor",
                                reason="torchao is installed by .ci/run (pip install -e '.[numerics]')")
warnings.filterwarnings("ignore")


def weights(n: int = 64, k: int = 256, seed: int = 0) -> torch.Tensor:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02
    w[3, :32] = 0.0  # all-zero blocks
    w[4, :8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0]) * 1e-3  # e2m1 midpoints after scaling
    w[5, 0] = 0.5  # one large weight: the global amax
    return w


def pack(codes: torch.Tensor) -> torch.Tensor:
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def test_e2m1_rounding_is_nearest_even_and_saturating():
    v = torch.tensor([0.0, -0.0, 0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 6.0, 9.0, -0.75, -7.0])
    assert M.round_e2m1(v).tolist() == [0, 0, 0, 0, 0.5, 1, 1, 2, 2, 4, 4, 6, 6, 6, -1, -6]
    assert M.e2m1_codes(torch.tensor([-0.0, 0.0])).tolist() == [0, 0]
    assert torch.equal(M.e2m1_values(torch.arange(16, dtype=torch.uint8)).abs()[:8], M.E2M1_VALUES)


def test_nvfp4_weights_equal_model_optimizers():
    Q = modelopt_qtensor.NVFP4QTensor
    w = weights()
    ws2 = Q.get_weights_scaling_factor_2(w)
    ws, _ = Q.get_weights_scaling_factor(w, 16, ws2)
    qt, _, _ = Q.quantize(w.clone(), 16, ws, ws2)
    g = M.nvfp4_global_scale(w.abs().max())
    codes, s = M.nvfp4_quantize(w, g)
    assert torch.equal(g, ws2.float())
    assert torch.equal(s.view(torch.uint8), ws.view(torch.uint8))
    assert torch.equal(pack(codes), qt._quantized_data)
    deq = qt.dequantize(dtype=torch.float32, scale=ws, double_scale=ws2, block_sizes={-1: 16})
    assert torch.equal(M.nvfp4_dequantize(codes, s, g), deq)


def test_nvfp4_weights_equal_torchaos_except_zero_blocks():
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    w = weights()
    g = M.nvfp4_global_scale(w.abs().max())
    ta = NVFP4Tensor.to_nvfp4(w, block_size=16, per_tensor_scale=per_tensor_amax_to_scale(w.abs().max()))
    codes, s = M.nvfp4_quantize(w, g)
    zero = w.reshape(w.shape[0], -1, 16).abs().amax(-1) == 0
    assert zero.any() and torch.equal(s.view(torch.uint8)[~zero], ta.scale.view(torch.uint8).reshape(s.shape)[~zero])
    assert torch.equal(pack(codes), ta.qdata)
    assert torch.equal(M.nvfp4_dequantize(codes, s, g), ta.dequantize(torch.float32))


@pytest.mark.parametrize("calib_amax", [6.0, 40.0])  # below the inputs' max (blocks saturate) and above
def test_nvfp4_activations_equal_model_optimizers(calib_amax):
    Q = modelopt_qtensor.NVFP4QTensor
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(1)) * 2
    x[0, :16] = 0
    g = torch.tensor(calib_amax) / (6 * 448)
    qt, bs, _ = Q.quantize(x.clone(), 16, weights_scaling_factor_2=g)
    ref = qt.dequantize(dtype=torch.float32, scale=bs, double_scale=g, block_sizes={-1: 16})
    assert torch.equal(M.nvfp4_fake(x, M.nvfp4_global_scale(torch.tensor(calib_amax))), ref)


def test_mxfp8_equals_model_optimizer_and_torchao_rceil():
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    w = weights(k=512)
    mq, me = modelopt_qtensor.MXFP8QTensor.quantize(w)
    q, e = M.mx_quantize(w, "e4m3")
    assert torch.equal(e, me) and torch.equal(q.view(torch.uint8), mq._quantized_data.view(torch.uint8))
    ts, td = mx_tensor.to_mx(w, torch.float8_e4m3fn, 32, scaling_mode=ScaleCalculationMode.RCEIL)
    assert torch.equal(ts.view(torch.uint8).reshape(e.shape), e)
    assert torch.equal(M.mx_dequantize(q, e, "e4m3"),
                       mx_tensor.to_dtype(td, ts, torch.float8_e4m3fn, 32, torch.float32))
    sat = torch.ones(1, 32)
    sat[0, 0] = 500.0  # OCP FLOOR would clip this to 448; ceil keeps it (512 = 2^1 x 256)
    assert M.mx_dequantize(*M.mx_quantize(sat, "e4m3"), "e4m3")[0, 0] == 512.0


def test_mxfp4_equals_torchao_rceil_and_model_optimizers_scales():
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    w = weights(k=512)
    q, e = M.mx_quantize(w, "e2m1")
    ts, td = mx_tensor.to_mx(w, torch.float4_e2m1fn_x2, 32, scaling_mode=ScaleCalculationMode.RCEIL)
    assert torch.equal(ts.view(torch.uint8).reshape(e.shape), e)
    assert torch.equal(M.mx_dequantize(q, e, "e2m1"), mx_tensor.to_dtype(td, ts, torch.float4_e2m1fn_x2, 32,
                                                                            torch.float32))
    _, mo_e = modelopt_qtensor.MXFP4QTensor.quantize(w, 32)
    assert torch.equal(mo_e.to(torch.uint8).reshape(e.shape), e)
