"""Calibrated quantization methods, registered by config type; everything else is its scheme's own.

    handler_for(config)(model, names, config, calibration, notes)

A calibration-free config (RTN codes, bitsandbytes' functions) is quantized by its scheme
(`Scheme.quantize`, specpress/models/quantized/). A method that needs the drafter run on calibration
data (GPTQ, …) lives here in compress/, where the forward loops are, and registers a handler for its
config class with `register_handler`.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from specpress.models.quantized.scheme import scheme_of

ForwardLoop = Callable[[nn.Module], None]
Quantizer = Callable[[nn.Module, list[str], Any, "ForwardLoop | None", list[str]], None]
# (model, names, config, calibration, notes) -> None; replaces the named Linears.

_HANDLERS: dict[type, Quantizer] = {}


def register_handler(config_cls: type) -> Callable[[Quantizer], Quantizer]:
    """Decorator: the quantizer for configs of exactly `config_cls` (registering one twice is an error)."""

    def deco(fn: Quantizer) -> Quantizer:
        if config_cls in _HANDLERS:
            raise ValueError(f"a quantize handler for {config_cls.__name__} is already registered")
        _HANDLERS[config_cls] = fn
        return fn

    return deco


def handler_for(config: Any) -> Quantizer:
    """The registered calibrated method for this config's exact type, else its scheme's own quantizer."""
    if type(config) in _HANDLERS:
        return _HANDLERS[type(config)]
    if config.needs_calibration:
        raise ValueError(f"{type(config).__name__} needs calibration but no handler is registered for it")
    quantize = scheme_of(config).quantize
    return lambda model, names, cfg, calibration, notes: quantize(model, names, cfg, notes)
