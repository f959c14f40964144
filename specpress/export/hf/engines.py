"""The serving engines `export hf --for` writes for, and where each one's loading rules were read.

    engine("vllm").layouts["eagle3"]      -> "speculators"  (the checkpoint layout that engine reads for the family)
    engine("vllm").quant                  -> "compressed-tensors" (how quantized Linears are written for it)
    engine("vllm").rules()                -> its Rules (vllm.py / sglang.py / trtllm.py: refusals, notes, the
                                             serve command), imported only when an export runs

This module imports no torch: `specpress export hf --help` reads the versions from it. A family missing
from `layouts` has no route in that engine; `no_route[family]` is the engine's rule that says why.

Versions the rules were read from (the code itself, not its docs):
    vLLM 0.34.0           the PyPI wheel (vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl); its pure-Python
                          matching (compressed_tensors/utils.py, compressed_tensors.py, transformers_utils/
                          configs/speculators/) also imports on CPU and runs in tests/export/test_vllm_rules.py
    SGLang 0.5.23         the PyPI wheel (sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl); its compressed-
                          tensors matching (srt/layers/quantization/compressed_tensors/utils.py) runs in
                          tests/export/test_sglang_rules.py
    TensorRT-LLM main     GitHub NVIDIA/TensorRT-LLM (2026 sources; PyPI's tensorrt-llm 1.2.1 is a stub that
                          downloads from pypi.nvidia.com): _torch/models/modeling_speculative.py @00679c66,
                          _torch/modules/linear.py @ed53795b, _torch/models/modeling_utils.py,
                          _torch/models/modeling_dflash.py @009d8fa4, quantization/mode.py; restated in
                          tests/export/test_trtllm_rules.py (its code needs CUDA and NVIDIA's index)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

VLLM, SGLANG, TRTLLM = "vllm", "sglang", "trtllm"


@dataclass(frozen=True)
class Engine:
    name: str  # the --for value
    label: str
    version: str  # the release (or source) its rules were read from
    quant: str  # the quantized-Linear format it is written in: "compressed-tensors" | "modelopt"
    layouts: dict[str, str]  # family -> "speculators" | "public" (the family's own layout) | "hf" (plain HF LM)
    no_route: dict[str, str] = field(default_factory=dict)  # family -> the engine's rule that leaves it out
    module: str = ""  # its Rules, imported lazily

    def rules(self) -> Any:
        return importlib.import_module(self.module).RULES

    @property
    def read_from(self) -> str:
        return f"{self.label} {self.version}"


_MTP = ("{label}'s MTP routes load the MTP layers of the target's own architecture ({where}); specpress's mtp "
        "drafter is a DeepSeek-style module on a dense Llama/Qwen3 block over a Llama target, which none of them "
        "builds. Serve an eagle3 or dflash drafter instead")

ENGINES: dict[str, Engine] = {
    VLLM: Engine(
        VLLM, "vLLM", "0.34.0", "compressed-tensors",
        {"eagle3": "speculators", "dflash": "speculators", "eagle": "public", "lm": "hf"},
        {"mtp": _MTP.format(label="vLLM 0.34", where="config/speculative.py hf_config_override maps deepseek_v3 to "
                                                    "DeepSeekMTPModel (MLA/MoE), mimo to MiMoMTP, qwen3_next, "
                                                    "glm4_moe, "
                                                    "... to their own MTP modules")},
        "specpress.export.hf.vllm"),
    SGLANG: Engine(
        SGLANG, "SGLang", "0.5.23", "compressed-tensors",
        {"eagle3": "public", "dflash": "public", "eagle": "public", "lm": "hf"},
        {"mtp": _MTP.format(label="SGLang 0.5.23", where="srt/models/deepseek_nextn.py, qwen3_next_mtp.py, "
                                                        "mimo_mtp.py, glm4_moe_nextn.py: each its target's block")},
        "specpress.export.hf.sglang"),
    TRTLLM: Engine(
        TRTLLM, "TensorRT-LLM", "main (2026 sources, PyTorch backend)", "modelopt",
        {"eagle3": "public", "dflash": "public", "lm": "hf"},
        {"mtp": _MTP.format(label="TensorRT-LLM", where="_torch/models/modeling_deepseekv3.py and its kin load the "
                                                       "nextn layers from the target checkpoint"),
         "eagle": ("TensorRT-LLM's PyTorch backend registers EAGLE-3 draft models only (_torch/models/"
                   "modeling_speculative.py: Eagle3ForCausalLM; an Eagle decoding config runs the EAGLE-3 path), so "
                   "an EAGLE-1 drafter has no route: distill an eagle3 drafter")},
        "specpress.export.hf.trtllm"),
}


def engine(name: str) -> Engine:
    if name not in ENGINES:
        from specpress.errors import ConfigError

        raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
    return ENGINES[name]


def help_text() -> str:
    """One line per engine for --help: what it reads and the version its rules come from."""
    parts = []
    for e in ENGINES.values():
        fams = ", ".join(f"{f} ({lay})" for f, lay in e.layouts.items())
        parts.append(f"{e.name}: rules read from {e.read_from}; {fams}; quantized Linears as {e.quant}")
    return "; ".join(parts)
