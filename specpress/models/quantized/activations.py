"""What happens to the activations entering a quantized Linear: nothing, a scale per token, or a calibrated one.

    --activations none      weight-only (W4A16, W8A16): the input is used as it is
    --activations dynamic   the input is quantized with scales computed at run time from the input itself
                            (per token for fp8 / int8; per block for the MX formats)
    --activations static    the input is quantized with one calibrated per-tensor `input_scale`, stored
                            beside the weights (ModelOpt's and vLLM's name); NVFP4's block scales stay
                            dynamic and `input_scale` is its global scale

Every activation quantizer is a fake quantizer: x -> dequantize(quantize(x)), computed in float32 and
returned in x's dtype, which is the product every engine's kernel computes up to accumulation order.
A `pre_quant_scale` [K] (AWQ, SmoothQuant; ModelOpt's name) multiplies the input first.

How a static scale is found (`--act-calibration`, on inputs collected by compress/quantize/activations.py):

    max             the largest |x| seen (ModelOpt's max calibrator)
    percentile:P    the P-th percentile of |x| over the sampled inputs (0 < P <= 100)
    mse             the amax among 0.25..1 x max that minimizes the fake-quantization MSE on the samples
    fixed:V         amax = V whatever the data (ModelOpt's calibration-free drafter script: V = 448 is
                    input_scale 1.0 for fp8; 2688 is input_scale 1.0 for nvfp4)
    weights         amax = the layer's largest |weight| (a scale derived from the weights, with no data)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specpress.errors import ConfigError

MODES = ("none", "dynamic", "static")
CALIBRATIONS = ("max", "percentile:P", "mse", "fixed:V", "weights")
# The default rule for static input scales: measured best on the zoo EAGLE-3 drafter (BENCHMARKS.md,
# "Static activation scales"): NVFP4 W4A4 kept 98.9 % of tau with mse and 97.6 % with max, paired
# +0.055 [+0.005, +0.108]; fp8 static is within noise under every rule but `weights`.
DEFAULT_CALIBRATION = "mse"
FP8_MAX = 448.0
INT8_MAX = 127.0
_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class ActCalibration:
    """A parsed --act-calibration: kind in max | percentile | mse | fixed | weights, and its value."""

    kind: str
    value: float | None = None

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}:{self.value:g}"


def parse_calibration(text: str) -> ActCalibration:
    """'max', 'percentile:99.9', 'mse', 'fixed:448', 'weights' -> ActCalibration; anything else a ConfigError."""
    kind, _, arg = str(text).partition(":")
    if kind in ("max", "mse", "weights") and not arg:
        return ActCalibration(kind)
    if kind in ("percentile", "fixed") and arg:
        try:
            v = float(arg)
        except ValueError:
            v = float("nan")
        if kind == "percentile" and 0 < v <= 100 or kind == "fixed" and v > 0:
            return ActCalibration(kind, v)
    raise ConfigError(f"--act-calibration {text!r}: choose one of {', '.join(CALIBRATIONS)} (percentile in (0, 100], "
                      f"fixed amax > 0, e.g. percentile:99.9 or fixed:448)")


def check_activations(word: str, activations: str, act_calibration: str, allowed: tuple[str, ...]) -> None:
    """Field rules shared by every config with an activation mode."""
    if activations not in MODES:
        raise ConfigError(f"--activations {activations!r}: choose one of {', '.join(MODES)}")
    if activations not in allowed:
        raise ConfigError(f"--scheme {word} does not take --activations {activations}: it takes "
                          f"{', '.join(allowed)}")
    parse_calibration(act_calibration)


def act_label(activations: str, act_calibration: str) -> str:
    """The part of a point id that names the activation mode: '', '-dyn', '-static', '-static-p99.9', …"""
    if activations == "none":
        return ""
    if activations == "dynamic":
        return "-dyn"
    cal = parse_calibration(act_calibration)
    tag = "" if str(cal) == DEFAULT_CALIBRATION else {"max": "-max", "mse": "-mse", "weights": "-wts"}.get(cal.kind)
    if tag is None:
        tag = f"-{'p' if cal.kind == 'percentile' else 'fixed'}{cal.value:g}"
    return "-static" + tag


# ---------------------------------------------------------------------------------------------- fake quantizers


def per_token_amax(x: Tensor) -> Tensor:
    """x [..., K] float32 -> amax over the last dim [..., 1] (never 0, so scales stay finite)."""
    return x.abs().amax(dim=-1, keepdim=True).clamp(min=_TINY)


def fake_fp8(x: Tensor, scale: Tensor) -> Tensor:
    """e4m3 with `scale` (a scalar, or [..., 1] per token): x / scale saturated to +-448, rounded to e4m3
    (nearest, ties to even), times scale. x float32."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale


def fake_int8(x: Tensor, scale: Tensor) -> Tensor:
    """Symmetric int8 with `scale`: round(x / scale) (ties to even) clamped to [-128, 127] (vLLM's and
    TensorRT-LLM's int8 activation quantizers), times scale. x float32."""
    return torch.round(x / scale).clamp(-128, 127) * scale


def fp8_input(x: Tensor, mode: str, input_scale: Tensor | None) -> Tensor:
    """The e4m3 activation quantizer: static (input_scale) or dynamic per token (amax / 448)."""
    xf = x.float()
    scale = input_scale if mode == "static" else per_token_amax(xf) / FP8_MAX
    return fake_fp8(xf, scale).to(x.dtype)


def int8_input(x: Tensor, mode: str, input_scale: Tensor | None) -> Tensor:
    """The int8 activation quantizer: static (input_scale) or dynamic per token (amax / 127)."""
    xf = x.float()
    scale = input_scale if mode == "static" else per_token_amax(xf) / INT8_MAX
    return fake_int8(xf, scale).to(x.dtype)
