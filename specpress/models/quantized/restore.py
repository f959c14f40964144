"""Rebuild the quantized modules a saved artifact's `quantize` provenance step names, before loading.

    step = active_quantize_step(config["specpress"]["steps"])   # None: nothing quantized to restore
    frozen = restore_quantized(model, step, weights, dtype, source)   # keys kept in their stored dtypes

One restorer per quantize config type (registered below): it turns (config, the meta Linear, the compute
dtype, the stored tensors) into an empty quantized module shaped after the stored tensors, which
`load_public` then fills.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from torch import Tensor, nn

from specpress.errors import CheckpointError
from specpress.models.quantized.configs import (BnbConfig, Fp8WeightOnlyConfig, IntWeightOnlyConfig, QuantizeConfig,
                                                config_from_dict)
from specpress.models.quantized.modules import Bnb4bitLinear, Bnb8bitLinear, Fp8Linear, IntLinear, QuantizedLinear

Restorer = Callable[[Any, nn.Linear, torch.dtype, Mapping[str, Tensor], str], QuantizedLinear]


def active_quantize_step(steps: Any) -> dict[str, Any] | None:
    """The last `quantize` provenance step, if the weights hold its quantized modules (not when it was
    written with --dequantize); None otherwise."""
    for step in reversed(tuple(steps or ())):
        if isinstance(step, Mapping) and step.get("step") == "quantize":
            return None if step.get("dequantized") else dict(step)
    return None


def quantized_keys(model: nn.Module) -> set[str]:
    """State-dict keys of quantized tensors (modules flagged `is_quantized`): saved and loaded in their
    own dtypes, never converted to the float dtype."""
    return {f"{name}.{key}" for name, m in model.named_modules() if getattr(m, "is_quantized", False)
            for key in m.KEYS}


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _int(config: IntWeightOnlyConfig, linear: nn.Linear, dtype: torch.dtype, stored: Mapping[str, Tensor],
         where: str) -> QuantizedLinear:
    return IntLinear.empty(linear, dtype, bits=config.bits, group_size=config.group_size, symmetric=config.symmetric,
                           stored=stored, where=where)


def _bnb(config: BnbConfig, linear: nn.Linear, dtype: torch.dtype, stored: Mapping[str, Tensor],
         where: str) -> QuantizedLinear:
    if config.quant_type == "int8":
        return Bnb8bitLinear.empty(linear, dtype, stored=stored, where=where)
    assert config.blocksize is not None
    return Bnb4bitLinear.empty(linear, dtype, quant_type=config.quant_type, blocksize=config.blocksize, stored=stored,
                               where=where)


def _fp8(config: Fp8WeightOnlyConfig, linear: nn.Linear, dtype: torch.dtype, stored: Mapping[str, Tensor],
         where: str) -> QuantizedLinear:
    return Fp8Linear.empty(linear, dtype, stored=stored, where=where)


# A subclass config (GPTQConfig) stores what its base stores: the restorer is found along the MRO.
RESTORERS: dict[type, Restorer] = {IntWeightOnlyConfig: _int, BnbConfig: _bnb, Fp8WeightOnlyConfig: _fp8}


def restorer_for(config: QuantizeConfig) -> Restorer:
    for cls in type(config).__mro__:
        if cls in RESTORERS:
            return RESTORERS[cls]
    known = ", ".join(sorted(c.__name__ for c in RESTORERS))
    raise CheckpointError(f"no restorer for quantize config {type(config).__name__}; known: {known}")


def restore_quantized(model: nn.Module, step: Mapping[str, Any], weights: Mapping[str, Tensor], dtype: torch.dtype,
                      source: str) -> set[str]:
    """Swap the Linears a quantize step names for empty quantized modules shaped after the stored
    tensors (checked against the recorded config); returns the quantized keys (kept in their dtype)."""
    config = config_from_dict(step.get("config") or {})
    restore = restorer_for(config)
    for name in step.get("quantized") or ():
        try:
            lin = model.get_submodule(name)
        except AttributeError:
            raise CheckpointError(f"{source}: the quantize step names module {name!r}, which this drafter lacks") \
                from None
        if not isinstance(lin, nn.Linear):
            raise CheckpointError(f"{source}: the quantize step names {name!r}, a {type(lin).__name__}, not a Linear")
        stored = {k[len(name) + 1:]: v for k, v in weights.items() if k.startswith(name + ".")}
        replace_module(model, name, restore(config, lin, dtype, stored, f"{source}: {name}"))
    return quantized_keys(model)
