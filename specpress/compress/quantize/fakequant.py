"""Quantized Linears while they are trained: a float master weight seen through the scheme's own quantizer.

    fakes = wrap(model, configs, sources, scales="learned")   # each quantized Linear -> a FakeQuantLinear
    ... train model (compress/distill.py) ...
    freeze(model)                                              # each FakeQuantLinear -> its scheme's module

`FakeQuantLinear.forward` computes y = prepare(x) · Ŵᵀ + b, where Ŵ is exactly the weight the scheme's module
would store for the current master weight W and dequantize at inference (the same primitives compute it), and
the gradient reaches W through a straight-through estimator: dŴ/dW = 1 where W's code is not clamped, 0 where it
is. `freeze` writes the codes and scales that Ŵ was computed from into the scheme's module, so the forward
after freezing equals the last forward before it.

Two ways to get the scales (`scales`):

  learned    the scales the quantizer chose (RTN, GPTQ, AWQ) are trained too: s = s0 · exp(θ), θ starting at 0,
             its gradient LSQ's (Esser et al. 2019: d/ds of s · clamp(round(W/s) + z) - z·s); zero points stay
             as chosen; a scale stored in fp16 (low-bit schemes) is rounded to it in the forward (straight
             through). Codes = clamp(round(W/s) + z). For the schemes whose rule is registered here as their
             "qat" facet: integer codes (int8, int4: IntLinear; int3, int2, ternary: LowBitLinear).
  rederived  every forward re-quantizes W with the scheme's own round-to-nearest quantizer (its scales follow
             W), Ŵ = its dequantized weight: works for every registered scheme (fp8, nvfp4, mx, bitsandbytes
             formats included) and is what `learned` falls back to for schemes without a "qat" facet. A
             calibrated method's choice (GPTQ's codes, AWQ's clipping) does not survive the first step.
             What one Linear cannot re-derive alone stays as stored, through the scheme's "rederive" facet:
             nvfp4's global scale, shared within q/k/v and gate/up (only the block scales follow W), so a
             recovered drafter keeps the one global scale per fused group the engines require.

The master weight starts at the source float weight when given (the layer before quantization, in the
module's pre_quant_scale space), moved into the rounding cell of the stored code (learned: the first
forward reproduces the stored codes, GPTQ's included, while W keeps how far each weight sat from a rounding
boundary), else at the dequantized weight. Inputs pass through the module's pre_quant_scale and activation
quantizer as at inference, the quantizer straight through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specpress.errors import ConfigError
from specpress.models.quantized import primitives as P
from specpress.models.quantized.modules import QuantizedLinear, quantized_modules, replace_module
from specpress.models.quantized.scheme import facet, register_facet, scheme_of, scheme_of_module

SCALES = ("learned", "rederived")
CELL_MARGIN = 0.02  # a projected master weight stays this far (in codes) inside its rounding cell


@dataclass(frozen=True)
class CodeRule:
    """A scheme's integer codes, for learned-scale training (its "qat" facet).

    params(mod) -> (scales f32 [N, K/G], zeros f32 [N, K/G], group size G, (lowest, highest code), scale dtype)
    rebuild(mod, linear, codes, scales, zeros) -> the scheme's module storing them (input settings not included)
    """

    params: Callable[[Any], tuple[Tensor, Tensor, int, tuple[int, int], torch.dtype]]
    rebuild: Callable[[Any, nn.Linear, Tensor, Tensor, Tensor], QuantizedLinear]


def _int_params(m: Any) -> tuple[Tensor, Tensor, int, tuple[int, int], torch.dtype]:
    return m.scales.float(), m.zeros().float(), m.group_size or m.in_features, P.code_range(m.bits, m.symmetric), \
        torch.float32


def _int_rebuild(m: Any, lin: nn.Linear, q: Tensor, s: Tensor, z: Tensor) -> QuantizedLinear:
    from specpress.models.quantized.integer import IntLinear

    return IntLinear.from_codes(lin, q, s, z, bits=m.bits, group_size=m.group_size, symmetric=m.symmetric)


def _lowbit_params(m: Any) -> tuple[Tensor, Tensor, int, tuple[int, int], torch.dtype]:
    from specpress.models.quantized.lowbit import SCALE_DTYPE, code_range

    return m.scales.float(), m.zeros().float(), m.group_size, code_range(m.format, m.symmetric), SCALE_DTYPE


def _lowbit_rebuild(m: Any, lin: nn.Linear, q: Tensor, s: Tensor, z: Tensor) -> QuantizedLinear:
    from specpress.models.quantized.lowbit import LowBitLinear

    return LowBitLinear.from_codes(lin, q, s, z, format=m.format, group_size=m.group_size, symmetric=m.symmetric)


register_facet("qat", "integer")(CodeRule(_int_params, _int_rebuild))
register_facet("qat", "lowbit")(CodeRule(_lowbit_params, _lowbit_rebuild))


@register_facet("rederive", "nvfp4")
def _nvfp4_rederive(inner: Any, lin: nn.Linear) -> QuantizedLinear:
    """nvfp4 of `lin` under `inner`'s stored global scale (a fused group's shared one: not this Linear's amax)."""
    from specpress.models.quantized.nvfp4 import NVFP4Linear

    return NVFP4Linear.from_linear(lin, global_scale=inner.global_scale)


def _linear(weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> nn.Linear:
    """A plain Linear holding `weight` [N, K] and `bias` in `dtype` (what a scheme quantizes)."""
    n, k = weight.shape
    lin = nn.Linear(k, n, bias=bias is not None, device=weight.device, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin


class FakeQuantLinear(nn.Module):
    """A quantized Linear under training (see the module docstring): `weight` [N, K] is the float master weight,
    `inner` the scheme's module it came from (its input settings and key layout), `log_scale` [N, K/G] the
    learned scales' exponent (learned mode)."""

    def __init__(self, mod: QuantizedLinear, config: Any, source: Tensor | None, scales: str) -> None:
        super().__init__()
        if scales not in SCALES:
            raise ConfigError(f"recovery scales must be one of {', '.join(SCALES)}, found {scales!r}")
        self.rule: CodeRule | None = facet("qat", scheme_of_module(mod)) if scales == "learned" else None
        self._cache: tuple[Any, Tensor] | None = None  # (parameter versions, Ŵ): see fake_weight
        self.scales_mode = "learned" if self.rule is not None else "rederived"
        self.config, self.in_features, self.out_features = config, mod.in_features, mod.out_features
        bias = mod.bias
        mod.bias = None  # trained here, as a float parameter
        self.inner = mod
        with torch.no_grad():
            w = mod.dequantize(torch.float32) if source is None else self._from_source(source.float())
        self.weight = nn.Parameter(w.clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone())
        if self.rule is not None:
            s0, z, g, qrange, sdt = self.rule.params(mod)
            self.group, self.qrange, self.scale_dtype = g, qrange, sdt
            self.register_buffer("s0", s0.clone())
            self.register_buffer("zeros", z.clone())
            self.log_scale = nn.Parameter(torch.zeros_like(s0))
            if source is not None:
                with torch.no_grad():
                    self.weight.copy_(self._into_cells(self.weight, mod))

    def _from_source(self, w: Tensor) -> Tensor:
        """The source weight in the stored weight's space (AWQ / SmoothQuant store W · s, s = 1 / pre_quant_scale)."""
        pqs = self.inner.pre_quant_scale
        return w if pqs is None else w / pqs.float()[None, :].to(w.device)

    def _into_cells(self, w: Tensor, mod: QuantizedLinear) -> Tensor:
        """w moved into the rounding cell of the code `mod` stores for it (unchanged where it already lies in it)."""
        n, k = w.shape
        s, z = self.stored_scale().detach(), self.zeros
        q = mod.codes().float().reshape(n, -1, self.group)
        r = w.reshape(n, -1, self.group) / s[..., None] + z[..., None]
        lo, hi = self.qrange
        low = torch.where(q > lo, q - 0.5 + CELL_MARGIN, torch.full_like(q, -torch.inf))
        high = torch.where(q < hi, q + 0.5 - CELL_MARGIN, torch.full_like(q, torch.inf))
        inside = (r >= low) & (r <= high)
        moved = (torch.maximum(torch.minimum(r, high), low) - z[..., None]) * s[..., None]
        return torch.where(inside, w.reshape(n, -1, self.group), moved).reshape(n, k)

    # -- the weight ------------------------------------------------------------------------------

    def scale(self) -> Tensor:
        """The learned scales [N, K/G], continuous (float32)."""
        return self.s0 * torch.exp(self.log_scale)

    def stored_scale(self) -> Tensor:
        """The scales as the scheme stores them (fp16-rounded for the low-bit schemes), straight through."""
        s = self.scale()
        return P.round_scale(s.detach(), self.scale_dtype) + (s - s.detach())

    def codes(self) -> Tensor:
        """The codes [N, K] (int16) the current master weight and scales give."""
        return P.quantize_with(self.weight.detach(), self.stored_scale().detach(), self.zeros, 8, False, self.qrange)

    def fake_weight(self) -> Tensor:
        """Ŵ [N, K] float32: the scheme's quantize-dequantize of the master weight, gradients straight through.

        Computed once per value of the parameters: EAGLE-3's training-time test calls a Linear once per unrolled
        step, and all of them share this tensor (its gradient hook drops it once a backward has used it, so a
        new forward never reuses a graph a backward has freed)."""
        scale_version = None if self.rule is None else self.log_scale._version
        key = (self.weight._version, self.weight.data_ptr(), scale_version, torch.is_grad_enabled())
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        out = self._fake_weight()
        self._cache = (key, out)
        if out.requires_grad:
            out.register_hook(self._drop_cache)
        return out

    def _drop_cache(self, grad: Tensor) -> None:
        self._cache = None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_cache": None}  # a copy never shares (or deep-copies) a graph

    def _fake_weight(self) -> Tensor:
        w = self.weight
        if self.rule is None:
            value = self._requantized(w.detach()).dequantize(torch.float32)
            return value + (w - w.detach())  # exactly `value` forward, the identity backward
        n, k = w.shape
        lo, hi = self.qrange
        s = self.stored_scale()[..., None]
        z = self.zeros[..., None]
        r = w.reshape(n, -1, self.group) / s
        # forward: P.quantize_with's codes and P.dequantize_int's weight (the frozen module's), op for op
        value = ((r.detach().round() + z).clamp(lo, hi) - z) * s.detach()
        # backward: LSQ's, clamped codes passing no gradient to W
        v = (r + z).clamp(lo, hi)
        surrogate = (v + (v.round() - v).detach() - z) * s
        return (value + (surrogate - surrogate.detach())).reshape(n, k)

    def _requantized(self, w: Tensor) -> QuantizedLinear:
        """The scheme's round-to-nearest module for master weight `w` (detached), with this Linear's input settings."""
        holder = nn.Module()
        holder.lin = _linear(w, None if self.bias is None else self.bias.detach(), self.inner.compute_dtype)
        keep = facet("rederive", scheme_of(self.config))
        if keep is not None:
            holder.lin = keep(self.inner, holder.lin)
        else:
            scheme_of(self.config).quantize(holder, ["lin"], self.config, [])
        mod = holder.lin
        mod.configure_input(self.inner.act_mode, self.inner.pre_quant_scale, self.inner.input_scale)
        return mod

    def forward(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N]: the input prepared as at inference (quantizer straight through), times Ŵᵀ."""
        inner = self.inner
        if inner.pre_quant_scale is not None:
            x = x * inner.pre_quant_scale.to(x.dtype)
        if inner.act_mode != "none":
            x = x + (inner.quantize_input(x) - x).detach()
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.fake_weight().to(x.dtype), bias)

    def freeze(self) -> QuantizedLinear:
        """The scheme's module storing the codes and scales of the current forward, with the trained bias."""
        inner = self.inner
        with torch.no_grad():
            bias = None if self.bias is None else self.bias.detach()
            if self.rule is None:
                mod = self._requantized(self.weight.detach())
            else:
                lin = _linear(self.weight.detach(), bias, inner.compute_dtype)
                s = P.round_scale(self.scale(), self.scale_dtype)
                mod = self.rule.rebuild(inner, lin, self.codes(), s, self.zeros)
                mod.configure_input(inner.act_mode, inner.pre_quant_scale, inner.input_scale)
            if bias is not None:
                mod.bias = nn.Parameter(bias.to(inner.compute_dtype), requires_grad=False)
        return mod.to(self.weight.device)


def wrap(model: nn.Module, configs: Mapping[str, Any], sources: Mapping[str, Tensor] | None = None,
         scales: str = "learned") -> dict[str, FakeQuantLinear]:
    """Replace every quantized Linear of `model` named in `configs` (name -> its quantize config) by a
    FakeQuantLinear (in place); `sources`: name -> the float weight before quantization."""
    out = {}
    for name, mod in quantized_modules(model).items():
        if name not in configs:
            continue
        fake = FakeQuantLinear(mod, configs[name], (sources or {}).get(name), scales)
        replace_module(model, name, fake)
        out[name] = fake
    return out


def freeze(model: nn.Module) -> list[str]:
    """Replace every FakeQuantLinear of `model` by its scheme's module (in place); returns their names."""
    names = [n for n, m in model.named_modules() if isinstance(m, FakeQuantLinear)]
    for n in names:
        replace_module(model, n, model.get_submodule(n).freeze())
    return names
