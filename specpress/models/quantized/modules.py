"""The base of every quantized Linear: a drop-in replacement for nn.Linear that stores packed weights.

Each scheme file (int.py, fp8.py, bnb.py, …) subclasses `QuantizedLinear` and documents its own key
scheme in model.safetensors; for a Linear named `<name>`, `<name>.bias` always stays a float tensor.

Every module computes y = x · dequantize()ᵀ + bias in the input's dtype (the CPU reference) unless its
scheme's forward uses a kernel (its `kernel_note` says which and why). `module.weight` is the dequantised
weight (for code that reads `.weight.dtype` / `.device`); it is computed on each access. Quantized
tensors keep their stored dtype through `.to(dtype)` / `.half()`: only their device follows (the float
bias converts as usual).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specpress.errors import CheckpointError


class QuantizedLinear(nn.Module):
    """Base: shapes, bias, compute dtype, the public-key <-> buffer mapping, dtype-stable moves, and what
    happens to the input (activations.py): an optional `pre_quant_scale` [K] multiplies it, then, unless
    `act_mode` is "none", the scheme's activation quantizer (`quantize_input`) rounds it, with a
    calibrated `input_scale` in "static" mode.

    Subclasses set KEYS (public state-dict suffix -> buffer attribute) and implement dequantize(); those
    with activation quantization implement quantize_input() and input_scale_for().
    """

    is_quantized: ClassVar[bool] = True  # drafter_io / inspect recognise quantized modules by this flag
    scheme: ClassVar[str] = ""  # the CLI's scheme word
    _kernel_note: str = "dequantize per forward"  # how forward computes (subclasses say more)
    KEYS: dict[str, str] = {}
    act_mode: str = "none"  # none | dynamic | static (activations.py)
    calibrating: bool = False  # while activation scales are calibrated, inputs pass unquantized

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = dtype
        self.register_parameter("bias", None if bias is None else
                                nn.Parameter(bias.detach().to(dtype), requires_grad=False))
        self.pre_quant_scale: Tensor | None
        self.input_scale: Tensor | None
        self.register_buffer("pre_quant_scale", None, persistent=False)  # [K] float32 (AWQ, SmoothQuant)
        self.register_buffer("input_scale", None, persistent=False)  # [] float32 (static activations)

    # -- the weight ------------------------------------------------------------------------------

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        """The weight [N, K] as the module computes with it, in `dtype` (default: compute dtype)."""
        raise NotImplementedError

    @property
    def weight(self) -> Tensor:
        return self.dequantize(self.compute_dtype)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N] in x's dtype."""
        return self.dequantized_product(self.prepare_input(x))

    def dequantized_product(self, x: Tensor) -> Tensor:
        """x (already prepared) times the dequantised weight, plus the bias: the CPU reference product."""
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantize(x.dtype), bias)

    @property
    def kernel_note(self) -> str:
        """How forward computes: the scheme's kernel or the dequantize path, and why."""
        if self.act_mode != "none":
            return f"{self.act_mode} activations emulated: fake-quantized input x dequantized weight " \
                   f"(saves bytes, not time)"
        return self._kernel_note

    @kernel_note.setter
    def kernel_note(self, note: str) -> None:
        self._kernel_note = note

    # -- the input -------------------------------------------------------------------------------

    @property
    def plain_input(self) -> bool:
        """True when the input reaches the product unchanged (no pre-scale, no activation quantizer)."""
        return self.pre_quant_scale is None and self.act_mode == "none"

    def prepare_input(self, x: Tensor) -> Tensor:
        """x [..., K] as the product sees it: times pre_quant_scale, then through the activation quantizer."""
        if self.pre_quant_scale is not None:
            x = x * self.pre_quant_scale.to(x.dtype)
        if self.act_mode != "none" and not self.calibrating:
            x = self.quantize_input(x)
        return x

    def quantize_input(self, x: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no activation quantizer")

    def input_scale_for(self, amax: Tensor) -> Tensor:
        """The stored input_scale for an activation amax (e.g. fp8: amax / 448)."""
        raise NotImplementedError(f"{type(self).__name__} has no activation quantizer")

    def configure_input(self, act_mode: str, pre_quant_scale: Tensor | None = None,
                        input_scale: Tensor | None = None) -> None:
        """Set the activation mode and register the input tensors it stores (static: input_scale, a float32
        scalar, 1.0 until calibrated; pre_quant_scale [K] float32 when given)."""
        self.act_mode = act_mode
        keys = {k: v for k, v in self.KEYS.items() if k not in ("pre_quant_scale", "input_scale")}
        dev = self.quant_tensors()[0].device if keys else None
        if pre_quant_scale is not None:
            self.register_buffer("pre_quant_scale", pre_quant_scale.float().to(dev), persistent=False)
            keys["pre_quant_scale"] = "pre_quant_scale"
        if act_mode == "static":
            t = torch.ones((), device=dev) if input_scale is None else input_scale.float().reshape(()).to(dev)
            self.register_buffer("input_scale", t, persistent=False)
            keys["input_scale"] = "input_scale"
        self.KEYS = keys

    def input_layout(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """Stored key -> (dtype, shape) of the input tensors configure_input registered."""
        out: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        if "pre_quant_scale" in self.KEYS:
            out["pre_quant_scale"] = (torch.float32, (self.in_features,))
        if "input_scale" in self.KEYS:
            out["input_scale"] = (torch.float32, ())
        return out

    def to_linear(self) -> nn.Linear:
        """A plain nn.Linear holding the dequantised weight (what --dequantize writes), a pre_quant_scale
        folded into its columns; activation quantization cannot be held by a plain Linear (refused)."""
        if self.act_mode != "none":
            raise CheckpointError(f"a {self.scheme} Linear with {self.act_mode} activation quantization cannot be "
                                  f"written as a plain Linear: its activations would no longer be quantized")
        dev = self.quant_tensors()[0].device
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device=dev,
                        dtype=self.compute_dtype)
        with torch.no_grad():
            w = self.dequantize(torch.float32)
            if self.pre_quant_scale is not None:
                w = w * self.pre_quant_scale.float()[None, :]
            lin.weight.copy_(w.to(self.compute_dtype))
            if self.bias is not None:
                lin.bias.copy_(self.bias)
        return lin

    def quant_tensors(self) -> list[Tensor]:
        return [getattr(self, attr) for attr in self.KEYS.values()]

    def extra_repr(self) -> str:
        acts = "" if self.act_mode == "none" else f", activations={self.act_mode}"
        pre = "" if self.pre_quant_scale is None else ", pre_quant_scale"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, " \
               f"scheme={self.scheme}{acts}{pre}"

    # -- state dict: public keys, stored dtypes ----------------------------------------------------

    def _register_quant(self, tensors: Mapping[str, Tensor]) -> None:
        """Register the quantized tensors as (non-persistent) buffers; the state dict writes them itself."""
        for attr, t in tensors.items():
            self.register_buffer(attr, t, persistent=False)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)  # bias
        for key, attr in self.KEYS.items():
            t = getattr(self, attr)
            destination[prefix + key] = t if keep_vars else t.detach()

    def _load_from_state_dict(self, state_dict: Mapping[str, Tensor], prefix: str, local_metadata: dict,
                              strict: bool, missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        for key, attr in self.KEYS.items():
            full = prefix + key
            if full not in state_dict:
                missing_keys.append(full)
                continue
            given, mine = state_dict[full], getattr(self, attr)
            if tuple(given.shape) != tuple(mine.shape) or given.dtype != mine.dtype:
                error_msgs.append(f"{full}: stored {given.dtype} {tuple(given.shape)}, expected {mine.dtype} "
                                  f"{tuple(mine.shape)}")
                continue
            setattr(self, attr, given.detach())  # assigned as stored: quantized tensors never change dtype
            if full in unexpected_keys:
                unexpected_keys.remove(full)
        self._refresh()

    def _apply(self, fn: Any, recurse: bool = True) -> "QuantizedLinear":
        """Moves keep the quantized tensors' dtypes; a float conversion changes only the compute dtype."""
        before = {attr: getattr(self, attr) for attr in self.KEYS.values()}
        probe = fn(torch.empty(0, dtype=self.compute_dtype, device=next(iter(before.values())).device))
        super()._apply(fn, recurse)
        for attr, old in before.items():
            new = getattr(self, attr)
            if new.dtype != old.dtype:
                setattr(self, attr, old.to(new.device))
        if isinstance(probe, Tensor) and probe.is_floating_point():
            self.compute_dtype = probe.dtype
        self._refresh()
        return self

    def _refresh(self) -> None:
        """Re-derive anything cached from the quantized tensors (after a load or a move)."""


def checked_tensor(stored: Mapping[str, Tensor], key: str, dtype: torch.dtype, shape: tuple[int, ...], where: str,
                   kind: str = "quantized", source: str = "the recorded quantization") -> Tensor:
    """stored[key], or a CheckpointError naming `where` when it is missing or not the `source`'s dtype/shape."""
    t = stored.get(key)
    if t is None:
        raise CheckpointError(f"{where}: missing {kind} tensor {key!r}")
    if t.dtype != dtype or tuple(t.shape) != shape:
        raise CheckpointError(f"{where}.{key}: stored {t.dtype} {tuple(t.shape)}, {source} implies {dtype} {shape}")
    return t


def check_stored(stored: Mapping[str, Tensor], expected: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
                 where: str) -> None:
    for key, (dt, shape) in expected.items():
        checked_tensor(stored, key, dt, shape, where)


def quantized_modules(model: nn.Module) -> dict[str, QuantizedLinear]:
    """Name -> quantized module, in module order."""
    return {name: m for name, m in model.named_modules() if getattr(m, "is_quantized", False)}


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def replace_linears(model: nn.Module, names: list[str], build: Callable[[nn.Linear], QuantizedLinear],
                    act_mode: str = "none") -> None:
    """Swap each named Linear for `build(linear)`, its activation mode set (a scheme's round-to-nearest pass)."""
    for name in names:
        mod = build(model.get_submodule(name))
        if act_mode != "none":
            mod.configure_input(act_mode)
        replace_module(model, name, mod)


def check_blocks(model: nn.Module, names: list[str], block: int, what: str) -> None:
    """Refuse a Linear whose in_features a scheme's fixed block does not divide, naming the fix."""
    from specpress.errors import ConfigError

    for n in names:
        k = model.get_submodule(n).in_features
        if k % block:
            raise ConfigError(f"{n}: in_features {k} is not a multiple of {what}'s block of {block}; --exclude {n}")
