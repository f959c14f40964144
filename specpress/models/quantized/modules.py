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

from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specpress.errors import CheckpointError


class QuantizedLinear(nn.Module):
    """Base: shapes, bias, compute dtype, the public-key <-> buffer mapping and dtype-stable moves.

    Subclasses set KEYS (public state-dict suffix -> buffer attribute) and implement dequantize().
    """

    is_quantized: ClassVar[bool] = True  # drafter_io / inspect recognise quantized modules by this flag
    scheme: ClassVar[str] = ""  # the CLI's scheme word
    kernel_note: str = "dequantize per forward"  # how forward computes (subclasses say more)
    KEYS: dict[str, str] = {}

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = dtype
        self.register_parameter("bias", None if bias is None else
                                nn.Parameter(bias.detach().to(dtype), requires_grad=False))

    # -- the weight ------------------------------------------------------------------------------

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        """The weight [N, K] as the module computes with it, in `dtype` (default: compute dtype)."""
        raise NotImplementedError

    @property
    def weight(self) -> Tensor:
        return self.dequantize(self.compute_dtype)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N] in x's dtype."""
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantize(x.dtype), bias)

    def to_linear(self) -> nn.Linear:
        """A plain nn.Linear holding the dequantised weight (what --dequantize writes)."""
        dev = self.quant_tensors()[0].device
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device=dev,
                        dtype=self.compute_dtype)
        with torch.no_grad():
            lin.weight.copy_(self.dequantize(self.compute_dtype))
            if self.bias is not None:
                lin.bias.copy_(self.bias)
        return lin

    def quant_tensors(self) -> list[Tensor]:
        return [getattr(self, attr) for attr in self.KEYS.values()]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, " \
               f"scheme={self.scheme}"

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
