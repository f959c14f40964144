"""The quantization schemes by name, without torch: the CLI's choices and `--help` read this table.

Each entry is one scheme *word* as users type it (`--scheme int4`, recipe `scheme: int4`): the methods
that word accepts (the first is the default), the module that implements it (imported only when a
scheme is used: it registers its `Scheme` descriptor, models/quantized/scheme.py) and a line for help.
A word may be answered by more than one module (`int8` by integer codes, and by bitsandbytes with
`--method bnb`): each (word, method) pair belongs to exactly one module, which tests/compress/
test_schemes.py checks against the registry.

Adding a scheme: its file under specpress/models/quantized/ (config, module, restore, registration)
and its row here; its ONNX lowering registers itself from specpress/export/quant/.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchemeName:
    word: str  # --scheme WORD
    methods: dict[str, str]  # method word -> the module (specpress.models.quantized.<file>) answering it
    help: str  # one line: what it stores and who deploys it

    @property
    def default_method(self) -> str:
        return next(iter(self.methods))


_Q = "specpress.models.quantized."
NAMES: tuple[SchemeName, ...] = (
    SchemeName("int8", {"rtn": _Q + "integer", "gptq": _Q + "integer", "smoothquant": _Q + "integer",
                        "bnb": _Q + "bnb"},
               "int8 codes, one scale per output channel: weight-only (W8A16, vLLM Marlin) by default; "
               "--method smoothquant is W8A8 with static per-tensor activations (Model Optimizer INT8_SQ, "
               "TensorRT Edge-LLM int8_sq)"),
    SchemeName("int4", {"rtn": _Q + "integer", "gptq": _Q + "integer", "awq": _Q + "integer"},
               "int4 codes in groups along the input (W4A16; vLLM Marlin/Machete, TensorRT-LLM); --method awq "
               "is Model Optimizer's / TensorRT-LLM's INT4-AWQ"),
    SchemeName("int3", {"rtn": _Q + "lowbit", "gptq": _Q + "lowbit"},
               "3-bit integer codes packed 8 in 3 bytes, an fp16 scale per group of 64 inputs (a zero point too with "
               "--asymmetric); no serving kernel runs it: bytes, not time; pair it with --recover-steps"),
    SchemeName("int2", {"rtn": _Q + "lowbit", "gptq": _Q + "lowbit"},
               "2-bit integer codes packed 4 per byte, an fp16 scale per group of 64 (a zero point too with "
               "--asymmetric); no serving kernel runs it; pair it with --recover-steps"),
    SchemeName("ternary", {"rtn": _Q + "lowbit", "gptq": _Q + "lowbit"},
               "codes in {-1, 0, +1} (1.58-bit) packed 5 per byte (1.6 bits a code), an fp16 scale per group of 64 "
               "set to the group's mean |w| (BitNet b1.58's rule); pair it with --recover-steps"),
    SchemeName("nf4", {"bnb": _Q + "bnb"}, "bitsandbytes NF4 blocks (HF transformers' 4-bit loading)"),
    SchemeName("fp4", {"bnb": _Q + "bnb"}, "bitsandbytes FP4 blocks"),
    SchemeName("fp8", {"rtn": _Q + "fp8"},
               "float8 e4m3 weights with per-channel scales; activations per token by default (W8A8: vLLM FP8 "
               "dynamic, llm-compressor FP8_DYNAMIC), static with a calibrated input_scale, or none (W8A16)"),
    SchemeName("nvfp4", {"rtn": _Q + "nvfp4"},
               "e2m1 weights in blocks of 16, e4m3 block scales, fp32 global scale; weight-only by default "
               "(W4A16-NVFP4, Model Optimizer's drafter default), W4A4 with --activations static (Model "
               "Optimizer / TensorRT-LLM NVFP4)"),
    SchemeName("mxfp4", {"rtn": _Q + "mx"},
               "OCP MXFP4: e2m1 in blocks of 32 with an e8m0 scale; activations the same at run time by default "
               "(Model Optimizer MXFP4)"),
    SchemeName("mxfp8", {"rtn": _Q + "mx"},
               "OCP MXFP8: e4m3 in blocks of 32 with an e8m0 scale; activations the same at run time by default "
               "(Model Optimizer MXFP8, TensorRT Edge-LLM mxfp8)"),
)

BY_WORD: dict[str, SchemeName] = {n.word: n for n in NAMES}
SCHEME_WORDS: tuple[str, ...] = tuple(BY_WORD)
METHOD_WORDS: tuple[str, ...] = tuple(dict.fromkeys(m for n in NAMES for m in n.methods))
MODULES: tuple[str, ...] = tuple(dict.fromkeys(mod for n in NAMES for mod in n.methods.values()))


def schemes_help() -> str:
    """One line per scheme word, for --help."""
    return "; ".join(f"{n.word}: {n.help} [methods {', '.join(n.methods)}]" for n in NAMES)
