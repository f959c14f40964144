"""Weight quantization of drafters: `quantize(model, config, calibration=None) -> model`.

configs.py (one dataclass per method), primitives.py (pure tensor functions), modules.py (quantized
Linear modules and the stored key scheme), gptq.py (the calibrated method), calibrate.py (the drafter's
forward on the target's hidden states), api.py (the verb, module selection, load/dequantise helpers).
"""

from specpress.compress.quantize.api import dequantize, quantize, restore_quantized, select_modules
from specpress.compress.quantize.configs import (BnbConfig, Fp8WeightOnlyConfig, GPTQConfig, IntWeightOnlyConfig,
                                                 QuantizeConfig, config_for, config_from_dict)

__all__ = ["quantize", "dequantize", "restore_quantized", "select_modules", "QuantizeConfig", "IntWeightOnlyConfig",
           "GPTQConfig", "BnbConfig", "Fp8WeightOnlyConfig", "config_for", "config_from_dict"]
