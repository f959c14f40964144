"""Weight quantization of drafters: `quantize(model, config, calibration=None) -> model`.

api.py (the verb, module selection, dequantise helpers), gptq.py (the calibrated method), calibrate.py
(the drafter's teacher-forced forward on the target's hidden states), pipeline.py (the CLI's whole run).
What a quantized drafter IS (configs, storage primitives, quantized modules, restore on load) lives in
specpress/models/quantized/, so that loading a quantized artifact needs nothing from compress/.
"""

from specpress.compress.quantize.api import dequantize, quantize, select_modules
from specpress.models.quantized.configs import (BnbConfig, Fp8WeightOnlyConfig, GPTQConfig, IntWeightOnlyConfig,
                                                QuantizeConfig, config_for, config_from_dict)
from specpress.models.quantized.restore import restore_quantized

__all__ = ["quantize", "dequantize", "restore_quantized", "select_modules", "QuantizeConfig", "IntWeightOnlyConfig",
           "GPTQConfig", "BnbConfig", "Fp8WeightOnlyConfig", "config_for", "config_from_dict"]
