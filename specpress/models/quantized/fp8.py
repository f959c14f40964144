"""float8 e4m3 weights with one float32 scale per output channel (absmax / 448), round-to-nearest.

Key scheme in model.safetensors, for a Linear named `<name>` (N = out_features, K = in_features):

    <name>.weight_fp8  float8_e4m3fn [N, K]
    <name>.scales      float32 [N]          w = weight_fp8 · scale
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

import torch
from torch import Tensor, nn

from specpress.errors import ConfigError, UsageError
from specpress.models.quantized import primitives as P
from specpress.models.quantized.configs import QuantizeConfig
from specpress.models.quantized.modules import QuantizedLinear, check_stored
from specpress.models.quantized.restore import replace_module
from specpress.models.quantized.scheme import Scheme, Words, register_scheme


@dataclass(frozen=True)
class Fp8WeightOnlyConfig(QuantizeConfig):
    """float8 e4m3 weights with a per-output-channel fp32 scale (absmax / 448), round-to-nearest."""

    name: ClassVar[str] = "fp8"

    @property
    def scheme(self) -> str:
        return "fp8"

    @property
    def method(self) -> str:
        return "rtn"

    def storage_label(self) -> str:
        return "fp8"


class Fp8Linear(QuantizedLinear):
    """float8_e4m3fn weights with per-output-channel float32 scales.

    Computed by dequantising to the input's dtype, on every device: no native fp8 matmul is used here
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
    def from_linear(cls, linear: nn.Linear) -> "Fp8Linear":
        w8, s = P.quantize_fp8(linear.weight.detach())
        return cls(linear.in_features, linear.out_features, linear.bias, linear.weight.dtype, weight_fp8=w8,
                   scales=s)

    @classmethod
    def empty(cls, linear: nn.Linear, dtype: torch.dtype, *, stored: Mapping[str, Tensor], where: str) -> "Fp8Linear":
        n, k = linear.out_features, linear.in_features
        check_stored(stored, {"weight_fp8": (torch.float8_e4m3fn, (n, k)), "scales": (torch.float32, (n,))}, where)
        return cls(k, n, linear.bias, dtype, weight_fp8=torch.empty(n, k, dtype=torch.float8_e4m3fn, device="meta"),
                   scales=torch.empty(n, device="meta"))

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        return P.dequantize_fp8(self.weight_fp8, self.scales, dtype or self.compute_dtype)


def _make(word: str, method: str, w: Words) -> Fp8WeightOnlyConfig:
    if w.group_size is not None or w.symmetric is False:
        raise ConfigError("fp8 uses one scale per output channel: --group-size and --asymmetric do not apply")
    return Fp8WeightOnlyConfig(include=w.include, exclude=w.exclude)


def _quantize(model: nn.Module, names: list[str], config: Fp8WeightOnlyConfig, notes: list[str]) -> None:
    for name in names:
        replace_module(model, name, Fp8Linear.from_linear(model.get_submodule(name)))
    notes.append("fp8: weights stored as float8_e4m3fn and computed by dequantising to the activation dtype "
                 "(no native fp8 matmul is used, on any device)")


def _check(model: nn.Module, names: list[str], config: Fp8WeightOnlyConfig) -> None:
    if not hasattr(torch, "float8_e4m3fn"):
        raise UsageError(f"this torch ({torch.__version__}) has no float8_e4m3fn dtype; fp8 needs torch >= 2.1")


def _restore(config: Fp8WeightOnlyConfig, linear: nn.Linear, dtype: torch.dtype, stored: Mapping[str, Tensor],
             where: str) -> Fp8Linear:
    return Fp8Linear.empty(linear, dtype, stored=stored, where=where)


SCHEME = register_scheme(Scheme(
    name="fp8", words={"fp8": ("rtn",)}, configs=(Fp8WeightOnlyConfig,), modules=(Fp8Linear,), make_config=_make,
    quantize=_quantize, restore=_restore, check=_check, tolerance=2e-2,
    speed="dequantize per forward (no fp8 matmul on CPU): saves bytes, not time"))
