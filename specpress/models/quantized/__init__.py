"""The quantized representation of a drafter: what a quantized artifact stores and how it loads back.

configs.py (one frozen dataclass per quantization method, recorded in the artifact's provenance),
primitives.py (pure tensor functions: codes, packing, dequantisation), modules.py (the quantized Linear
modules and their stored key scheme), restore.py (rebuild the quantized modules of a saved artifact).
compress/quantize/ builds them (the `quantize` verb, GPTQ, calibration); models/drafter_io.py loads them.
"""
