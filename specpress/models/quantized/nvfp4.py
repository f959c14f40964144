"""NVFP4: e2m1 weights in blocks of 16 with e4m3 block scales and an fp32 global scale (minifloat.py), weight-only
(W4A16-NVFP4, the default of Model Optimizer's drafter script) or with NVFP4 activations (W4A4: block scales
from the input at run time, a calibrated global `input_scale`, as Model Optimizer / TensorRT-LLM deploy it).

Key scheme in model.safetensors, for a Linear named `<name>` (N = out_features, K = in_features) — Model
Optimizer's unified-checkpoint names and layouts, so the export to it is a copy:

    <name>.weight          uint8 [N, K/2]          e2m1 codes, element 2j in the low nibble
    <name>.weight_scale    float8_e4m3fn [N, K/16]  block scales
    <name>.weight_scale_2  float32 []              global scale = amax(|W|) / (6 · 448); q/k/v and gate/up share
                                                   the amax of their group (fusion.py: every engine fuses them
                                                   under one global scale)
    <name>.input_scale     float32 []              W4A4 only: activation amax / (6 · 448)

w = e2m1(code) · weight_scale · weight_scale_2. Computed by dequantising (no FP4 matmul on CPU): saves
bytes, not time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

import torch
from torch import Tensor, nn

from specpress.errors import ConfigError
from specpress.models.quantized import minifloat as M
from specpress.models.quantized import primitives as P
from specpress.models.quantized.activations import DEFAULT_CALIBRATION, act_label, check_activations
from specpress.models.quantized.configs import QuantizeConfig
from specpress.models.quantized.fusion import fused_groups
from specpress.models.quantized.modules import QuantizedLinear, check_blocks, check_stored, replace_module
from specpress.models.quantized.scheme import Scheme, Words, register_scheme


@dataclass(frozen=True)
class NVFP4Config(QuantizeConfig):
    """NVFP4 weights (blocks of 16), round-to-nearest-even; activations none (W4A16) or static (W4A4)."""

    name: ClassVar[str] = "nvfp4"

    activations: str = "none"
    act_calibration: str = DEFAULT_CALIBRATION

    def validate(self) -> None:
        check_activations("nvfp4", self.activations, self.act_calibration, ("none", "static"))

    @property
    def scheme(self) -> str:
        return "nvfp4"

    @property
    def method(self) -> str:
        return "rtn"

    def storage_label(self) -> str:
        return "nvfp4" + act_label(self.activations, self.act_calibration)


class NVFP4Linear(QuantizedLinear):
    """NVFP4 weights (and, in static mode, NVFP4 activations), computed by dequantising."""

    scheme: ClassVar[str] = "nvfp4"
    KEYS = {"weight": "packed", "weight_scale": "block_scales", "weight_scale_2": "global_scale"}

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None, dtype: torch.dtype, *,
                 packed: Tensor, block_scales: Tensor, global_scale: Tensor) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self._register_quant({"packed": packed, "block_scales": block_scales, "global_scale": global_scale})
        self.kernel_note = "dequantize per forward (no FP4 matmul on CPU): saves bytes, not time"

    @staticmethod
    def layout(n: int, k: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        return {"weight": (torch.uint8, (n, k // 2)), "weight_scale": (torch.float8_e4m3fn, (n, k // M.NVFP4_BLOCK)),
                "weight_scale_2": (torch.float32, ())}

    @classmethod
    def from_linear(cls, linear: nn.Linear, amax: Tensor | None = None,
                    global_scale: Tensor | None = None) -> "NVFP4Linear":
        """amax: the global amax to scale by (default the weight's own; a fused group's shared one);
        global_scale: the global scale itself, kept as given (a recovery re-deriving the block scales)."""
        w = linear.weight.detach().float()
        if global_scale is not None:
            g = global_scale.detach().float().reshape(()).clone()
        else:
            g = M.nvfp4_global_scale(w.abs().max() if amax is None else amax)
        codes, s = M.nvfp4_quantize(w, g)
        return cls(linear.in_features, linear.out_features, linear.bias, linear.weight.dtype,
                   packed=P.pack_int4(codes), block_scales=s, global_scale=g)

    @classmethod
    def empty(cls, linear: nn.Linear, dtype: torch.dtype, *, stored: Mapping[str, Tensor], where: str) -> "NVFP4Linear":
        lay = cls.layout(linear.out_features, linear.in_features)
        check_stored(stored, lay, where)
        t = {k: torch.empty(shape, dtype=dt, device="meta") for k, (dt, shape) in lay.items()}
        return cls(linear.in_features, linear.out_features, linear.bias, dtype, packed=t["weight"],
                   block_scales=t["weight_scale"], global_scale=t["weight_scale_2"])

    def codes(self) -> Tensor:
        """e2m1 codes [N, K] (uint8 0..15)."""
        return P.unpack_int4(self.packed)

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        return M.nvfp4_dequantize(self.codes(), self.block_scales, self.global_scale).to(dtype or self.compute_dtype)

    def quantize_input(self, x: Tensor) -> Tensor:
        """NVFP4 activations: block scales of 16 from x, the calibrated global input_scale."""
        assert self.input_scale is not None
        return M.nvfp4_fake(x.float(), self.input_scale).to(x.dtype)

    def input_scale_for(self, amax: Tensor) -> Tensor:
        return M.nvfp4_global_scale(amax)


def _make(word: str, method: str, w: Words) -> NVFP4Config:
    if w.group_size not in (None, M.NVFP4_BLOCK) or w.symmetric is False:
        raise ConfigError("nvfp4 uses blocks of 16 with e4m3 scales: --group-size (other than 16) and --asymmetric "
                          "do not apply")
    return NVFP4Config(**w.settings(drop=("group_size", "symmetric")))


def _quantize(model: nn.Module, names: list[str], config: NVFP4Config, notes: list[str]) -> None:
    linears: dict[str, nn.Linear] = {n: model.get_submodule(n) for n in names}  # type: ignore[misc]
    shared: dict[str, Tensor] = {}
    for group in fused_groups(names):
        amax = torch.stack([linears[n].weight.detach().float().abs().max() for n in group]).max()
        shared.update({n: amax for n in group})
    for name in names:
        mod = NVFP4Linear.from_linear(linears[name], shared.get(name))
        if config.act_mode != "none":
            mod.configure_input(config.act_mode)
        replace_module(model, name, mod)
    if shared:
        notes.append(f"nvfp4: {len(shared)} fused Linears (q/k/v, gate/up) share their group's global scale, as "
                     f"the engines that fuse them require")
    notes.append("nvfp4: computed by dequantising the e2m1 codes (no FP4 matmul on CPU): saves bytes, not time")


def _check(model: nn.Module, names: list[str], config: NVFP4Config) -> None:
    check_blocks(model, names, M.NVFP4_BLOCK, "nvfp4")


def _restore(config: NVFP4Config, linear: nn.Linear, dtype: torch.dtype, stored: Mapping[str, Tensor],
             where: str) -> NVFP4Linear:
    return NVFP4Linear.empty(linear, dtype, stored=stored, where=where)


SCHEME = register_scheme(Scheme(
    name="nvfp4", words={"nvfp4": ("rtn",)}, configs=(NVFP4Config,), modules=(NVFP4Linear,), make_config=_make,
    quantize=_quantize, restore=_restore, check=_check, tolerance=2e-2,
    speed="dequantize per forward (no FP4 matmul on CPU): saves bytes, not time"))
