"""float8 e4m3 weights with float32 scales (absmax / 448, per output channel or per tensor), round-to-nearest;
optionally e4m3 activations (W8A8): dynamic per token or static with a calibrated input_scale.

Key scheme in model.safetensors, for a Linear named `<name>` (N = out_features, K = in_features):

    <name>.weight_fp8    float8_e4m3fn [N, K]
    <name>.scales        float32 [N] (granularity channel) or [1] (tensor)   w = weight_fp8 · scale
    <name>.input_scale   float32 []   static activations only: x ≈ e4m3(x / input_scale) · input_scale

The CLI's default is what vLLM runs for an fp8 checkpoint without input scales and what llm-compressor's
FP8_DYNAMIC and Model Optimizer's FP8_PER_CHANNEL_PER_TOKEN write: per-channel weights, activations
quantized per token at run time. `--activations static` with per-tensor weights (`granularity tensor`)
is Model Optimizer's FP8 (what its drafter script and SGLang's ModelOpt loader take); `--activations
none` is weight-only (W8A16-FP8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

import torch
from torch import Tensor, nn

from specpress.errors import ConfigError, RequestError
from specpress.models.quantized import primitives as P
from specpress.models.quantized.activations import DEFAULT_CALIBRATION, FP8_MAX, act_label, check_activations, fp8_input
from specpress.models.quantized.configs import QuantizeConfig
from specpress.models.quantized.modules import QuantizedLinear, check_stored, replace_linears
from specpress.models.quantized.scheme import Scheme, Words, register_scheme

GRANULARITIES = ("channel", "tensor")


@dataclass(frozen=True)
class Fp8Config(QuantizeConfig):
    """float8 e4m3 weights with one fp32 scale per output channel (or per tensor), round-to-nearest, and
    the activations' treatment (activations.py). The dataclass defaults (weight-only) are what artifacts
    written before activations existed recorded; the CLI's default is dynamic activations."""

    name: ClassVar[str] = "fp8"

    granularity: str = "channel"
    activations: str = "none"
    act_calibration: str = DEFAULT_CALIBRATION

    def validate(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ConfigError(f"fp8 granularity must be one of {', '.join(GRANULARITIES)}, found {self.granularity!r}")
        check_activations("fp8", self.activations, self.act_calibration, ("none", "dynamic", "static"))

    @property
    def scheme(self) -> str:
        return "fp8"

    @property
    def method(self) -> str:
        return "rtn"

    def storage_label(self) -> str:
        return "fp8" + ("-pt" if self.granularity == "tensor" else "") + act_label(self.activations,
                                                                                     self.act_calibration)


class Fp8Linear(QuantizedLinear):
    """float8_e4m3fn weights with per-output-channel (or one) float32 scales; e4m3 activations when asked.

    Computed by dequantising to the input's dtype (activations fake-quantized first), on every device: no
    native fp8 matmul is used here
    (torch._scaled_mm on sm89+ GPUs would be the native path; not wired in). On CPU torch 2.13 has no
    weight-only fp8 kernel: its _scaled_mm wants fp8 activations too and is a reference loop (121 ms for
    8 x 256 x 768, against 33 us for an fp32 Linear).
    """

    scheme: ClassVar[str] = "fp8"
    KEYS = {"weight_fp8": "weight_fp8", "scales": "scales"}

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None, dtype: torch.dtype, *,
                 weight_fp8: Tensor, scales: Tensor) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self._register_quant({"weight_fp8": weight_fp8, "scales": scales})

    @classmethod
    def from_linear(cls, linear: nn.Linear, granularity: str = "channel") -> "Fp8Linear":
        w8, s = P.quantize_fp8(linear.weight.detach(), per_tensor=granularity == "tensor")
        return cls(linear.in_features, linear.out_features, linear.bias, linear.weight.dtype, weight_fp8=w8,
                   scales=s)

    @classmethod
    def empty(cls, linear: nn.Linear, dtype: torch.dtype, *, granularity: str, stored: Mapping[str, Tensor],
              where: str) -> "Fp8Linear":
        n, k = linear.out_features, linear.in_features
        ns = 1 if granularity == "tensor" else n
        check_stored(stored, {"weight_fp8": (torch.float8_e4m3fn, (n, k)), "scales": (torch.float32, (ns,))}, where)
        return cls(k, n, linear.bias, dtype, weight_fp8=torch.empty(n, k, dtype=torch.float8_e4m3fn, device="meta"),
                   scales=torch.empty(ns, device="meta"))

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        return P.dequantize_fp8(self.weight_fp8, self.scales, dtype or self.compute_dtype)

    def quantize_input(self, x: Tensor) -> Tensor:
        """e4m3 activations: per token (dynamic) or with the calibrated input_scale (static)."""
        return fp8_input(x, self.act_mode, self.input_scale)

    def input_scale_for(self, amax: Tensor) -> Tensor:
        return amax.float() / FP8_MAX


def _make(word: str, method: str, w: Words) -> Fp8Config:
    if w.group_size is not None or w.symmetric is False:
        raise ConfigError("fp8 scales whole output channels (or the whole tensor): --group-size and --asymmetric do "
                          "not apply")
    kw = w.settings(drop=("group_size", "symmetric"))
    return Fp8Config(**{"activations": "dynamic", **kw})


def _quantize(model: nn.Module, names: list[str], config: Fp8Config, notes: list[str]) -> None:
    replace_linears(model, names, lambda lin: Fp8Linear.from_linear(lin, config.granularity), config.act_mode)
    notes.append("fp8: weights stored as float8_e4m3fn and computed by dequantising to the activation dtype "
                 + ("(no native fp8 matmul is used, on any device)" if config.act_mode == "none" else
                    f"after {config.act_mode} e4m3 fake-quantization of the activations (emulated: no fp8 matmul)"))


def _check(model: nn.Module, names: list[str], config: Fp8Config) -> None:
    if not hasattr(torch, "float8_e4m3fn"):
        raise RequestError(f"this torch ({torch.__version__}) has no float8_e4m3fn dtype; fp8 needs torch >= 2.1")


def _restore(config: Fp8Config, linear: nn.Linear, dtype: torch.dtype, stored: Mapping[str, Tensor],
             where: str) -> Fp8Linear:
    return Fp8Linear.empty(linear, dtype, granularity=config.granularity, stored=stored, where=where)


SCHEME = register_scheme(Scheme(
    name="fp8", words={"fp8": ("rtn",)}, configs=(Fp8Config,), modules=(Fp8Linear,), make_config=_make,
    quantize=_quantize, restore=_restore, check=_check, tolerance=2e-2,
    speed="dequantize per forward (no fp8 matmul on CPU): saves bytes, not time"))
