"""The quantized representation of a drafter: what a quantized artifact stores and how it loads back.

names.py (the scheme words, torch-free: the CLI's choices), scheme.py (the registry: one `Scheme`
descriptor per storage format, and facets other layers register), configs.py / modules.py (the bases of
every config and quantized Linear), one file per scheme (integer.py, fp8.py, bnb.py: its configs, its
module and key layout, how it is quantized, checked and restored), primitives.py and the CPU kernels
(int4_cpu.py, bnb_cpu.py), restore.py (rebuild the quantized modules of a saved artifact).
compress/quantize/ runs the verb and the calibrated methods; models/drafter_io.py loads artifacts.
"""
