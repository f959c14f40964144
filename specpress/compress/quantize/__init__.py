"""Weight quantization of drafters: `quantize(model, config, calibration=None) -> model`.

api.py (the verb, module selection, dequantise helpers), handlers.py (calibrated methods by config
type), gptq.py (GPTQ), calibrate.py (the drafter's teacher-forced forward on the target's hidden states),
pipeline.py (the CLI's whole run). What a quantized drafter IS (the scheme registry, configs, storage
primitives, quantized modules, restore on load) lives in specpress/models/quantized/, so that loading a
quantized artifact needs nothing from compress/.

    from specpress.compress.quantize import config_for, quantize
    quantize(drafter, config_for("int4", "gptq"), calibration=DrafterCalibration(target, drafter, sampler))
"""

from specpress.compress.quantize.api import dequantize, quantize, select_modules
from specpress.models.quantized.scheme import config_for, config_from_dict

__all__ = ["quantize", "dequantize", "select_modules", "config_for", "config_from_dict"]
