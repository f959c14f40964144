"""OCP MX formats: blocks of 32 sharing one e8m0 power-of-two scale (minifloat.py), MXFP4 (e2m1 elements) and
MXFP8 (e4m3 elements). Activations are quantized the same way at run time by default (Model Optimizer's
MXFP4 / MXFP8 presets, TensorRT Edge-LLM's mxfp8), or not at all (--activations none: W4A16 / W8A16).

Key scheme in model.safetensors, for a Linear named `<name>` (N = out_features, K = in_features), as Model
Optimizer's unified checkpoint and compressed-tensors' MX layouts store them:

    mxfp4  <name>.weight        uint8 [N, K/2]          e2m1 codes, element 2j in the low nibble
    mxfp8  <name>.weight        float8_e4m3fn [N, K]
    both   <name>.weight_scale  uint8 [N, K/32]          e8m0: the block's scale is 2^(byte - 127)

Computed by dequantising (no MX matmul on CPU): saves bytes, not time.
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
from specpress.models.quantized.modules import QuantizedLinear, check_blocks, check_stored, replace_linears
from specpress.models.quantized.scheme import Scheme, Words, register_scheme

ELEMENTS = {"mxfp4": "e2m1", "mxfp8": "e4m3"}


@dataclass(frozen=True)
class MXConfig(QuantizeConfig):
    """MX weights (e2m1 or e4m3 elements, blocks of 32), round-to-nearest-even; activations dynamic
    (the same MX format, block scales from the input at run time) or none."""

    name: ClassVar[str] = "mx"

    elements: str = "e4m3"
    activations: str = "none"
    act_calibration: str = DEFAULT_CALIBRATION

    def validate(self) -> None:
        if self.elements not in ELEMENTS.values():
            raise ConfigError(f"mx elements must be e2m1 (mxfp4) or e4m3 (mxfp8), found {self.elements!r}")
        check_activations(self.scheme, self.activations, self.act_calibration, ("none", "dynamic"))

    @property
    def scheme(self) -> str:
        return "mxfp4" if self.elements == "e2m1" else "mxfp8"

    @property
    def method(self) -> str:
        return "rtn"

    def storage_label(self) -> str:
        return self.scheme + act_label(self.activations, self.act_calibration)


class MXLinear(QuantizedLinear):
    """MX weights (and, in dynamic mode, MX activations), computed by dequantising."""

    KEYS = {"weight": "elems", "weight_scale": "exponents"}

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None, dtype: torch.dtype, *,
                 elements: str, elems: Tensor, exponents: Tensor) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self.elements = elements
        self._register_quant({"elems": elems, "exponents": exponents})
        self.kernel_note = "dequantize per forward (no MX matmul on CPU): saves bytes, not time"

    @property
    def scheme(self) -> str:  # type: ignore[override]
        return "mxfp4" if self.elements == "e2m1" else "mxfp8"

    @staticmethod
    def layout(n: int, k: int, elements: str) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        w = (torch.uint8, (n, k // 2)) if elements == "e2m1" else (torch.float8_e4m3fn, (n, k))
        return {"weight": w, "weight_scale": (torch.uint8, (n, k // M.MX_BLOCK))}

    @classmethod
    def from_linear(cls, linear: nn.Linear, elements: str) -> "MXLinear":
        q, e = M.mx_quantize(linear.weight.detach().float(), elements)
        return cls(linear.in_features, linear.out_features, linear.bias, linear.weight.dtype, elements=elements,
                   elems=P.pack_int4(q) if elements == "e2m1" else q, exponents=e)

    @classmethod
    def empty(cls, linear: nn.Linear, dtype: torch.dtype, *, elements: str, stored: Mapping[str, Tensor],
              where: str) -> "MXLinear":
        lay = cls.layout(linear.out_features, linear.in_features, elements)
        check_stored(stored, lay, where)
        t = {k: torch.empty(shape, dtype=dt, device="meta") for k, (dt, shape) in lay.items()}
        return cls(linear.in_features, linear.out_features, linear.bias, dtype, elements=elements, elems=t["weight"],
                   exponents=t["weight_scale"])

    def element_values(self) -> Tensor:
        """The elements [N, K] as stored before scaling: e2m1 codes (uint8) or float8_e4m3fn values."""
        return P.unpack_int4(self.elems) if self.elements == "e2m1" else self.elems

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        return M.mx_dequantize(self.element_values(), self.exponents, self.elements).to(dtype or self.compute_dtype)

    def quantize_input(self, x: Tensor) -> Tensor:
        """MX activations: blocks of 32 along the input, each scaled by its own e8m0 power of two."""
        return M.mx_fake(x.float(), self.elements).to(x.dtype)


def _make(word: str, method: str, w: Words) -> MXConfig:
    if w.group_size not in (None, M.MX_BLOCK) or w.symmetric is False:
        raise ConfigError(f"{word} uses blocks of 32 sharing an e8m0 exponent: --group-size (other than 32) and "
                          f"--asymmetric do not apply")
    kw = w.settings(drop=("group_size", "symmetric"))
    return MXConfig(**{"elements": ELEMENTS[word], "activations": "dynamic", **kw})


def _quantize(model: nn.Module, names: list[str], config: MXConfig, notes: list[str]) -> None:
    replace_linears(model, names, lambda lin: MXLinear.from_linear(lin, config.elements), config.act_mode)
    notes.append(f"{config.scheme}: computed by dequantising (no MX matmul on CPU): saves bytes, not time")


def _check(model: nn.Module, names: list[str], config: MXConfig) -> None:
    check_blocks(model, names, M.MX_BLOCK, "the MX format")


def _restore(config: MXConfig, linear: nn.Linear, dtype: torch.dtype, stored: Mapping[str, Tensor],
             where: str) -> MXLinear:
    return MXLinear.empty(linear, dtype, elements=config.elements, stored=stored, where=where)


SCHEME = register_scheme(Scheme(
    name="mx", words={"mxfp4": ("rtn",), "mxfp8": ("rtn",)}, configs=(MXConfig,), modules=(MXLinear,),
    make_config=_make, quantize=_quantize, restore=_restore, check=_check, tolerance=2e-2,
    speed="dequantize per forward (no MX matmul on CPU): saves bytes, not time"))
