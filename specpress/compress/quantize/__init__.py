"""Weight quantization of drafters: `quantize(model, config, calibration=None) -> model`.

api.py (the verb, module selection, dequantise helpers), handlers.py (calibrated methods by config
type), gptq.py (GPTQ), calibrate.py (the drafter's teacher-forced forward on the target's hidden states),
pipeline.py (the CLI's whole run), request.py (the CLI's option checks: quantize_request ->
QuantizeRequest), report.py (the lines the CLI prints about a run). What a quantized drafter IS (the
scheme registry, configs, storage primitives, quantized modules, restore on load) lives in
specpress/models/quantized/, so that loading a quantized artifact needs nothing from compress/. Each name
has one import path, its home:

    from specpress.compress.quantize.api import quantize
    from specpress.models.quantized.scheme import config_for
    quantize(drafter, config_for("int4", "gptq"), calibration=DrafterCalibration(target, drafter, sampler))
"""
