"""Rebuild the quantized modules a saved artifact's `quantize` provenance step names, before loading.

    step = active_quantize_step(config["specpress"]["steps"])   # None: nothing quantized to restore
    frozen = restore_quantized(model, step, weights, dtype, source)   # keys kept in their stored dtypes

The recorded config's scheme (scheme.py) restores each module: it turns (config, the meta Linear, the
compute dtype, the stored tensors) into an empty quantized module shaped after the stored tensors, which
`load_public` then fills.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor, nn

from specpress.errors import CheckpointError
from specpress.models.quantized.modules import check_stored, replace_module  # noqa: F401  (re-exported)


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


def step_configs(step: Mapping[str, Any]) -> dict[str, Any]:
    """Each quantized Linear's config: the step's one config, or (a "mixed" step, `quantize --budget`) its
    `module_configs` entry."""
    from specpress.models.quantized.scheme import config_from_dict

    per = step.get("module_configs")
    if per is not None:
        missing = [n for n in step.get("quantized") or () if n not in per]
        if missing:
            raise CheckpointError(f"the mixed quantize step records no config for {', '.join(missing)}; the file was "
                                  f"edited: re-quantize it")
        return {n: config_from_dict(per[n]) for n in step.get("quantized") or ()}
    config = config_from_dict(step.get("config") or {})
    return {n: config for n in step.get("quantized") or ()}


def restore_quantized(model: nn.Module, step: Mapping[str, Any], weights: Mapping[str, Tensor], dtype: torch.dtype,
                      source: str) -> set[str]:
    """Swap the Linears a quantize step names for empty quantized modules shaped after the stored
    tensors (checked against the recorded config); returns the quantized keys (kept in their dtype)."""
    from specpress.models.quantized.scheme import scheme_of

    configs = step_configs(step)
    for name in step.get("quantized") or ():
        config = configs[name]
        restore = scheme_of(config).restore
        try:
            lin = model.get_submodule(name)
        except AttributeError:
            raise CheckpointError(f"{source}: the quantize step names module {name!r}, which this drafter lacks") \
                from None
        if not isinstance(lin, nn.Linear):
            raise CheckpointError(f"{source}: the quantize step names {name!r}, a {type(lin).__name__}, not a Linear")
        stored = {k[len(name) + 1:]: v for k, v in weights.items() if k.startswith(name + ".")}
        mod = restore(config, lin, dtype, stored, f"{source}: {name}")
        if config.act_mode != "none" or config.has_pre_quant_scale:
            meta = torch.device("meta")
            mod.configure_input(config.act_mode, torch.empty(lin.in_features, device=meta)
                                if config.has_pre_quant_scale else None)
            check_stored(stored, mod.input_layout(), f"{source}: {name}")
        replace_module(model, name, mod)
    return quantized_keys(model)
