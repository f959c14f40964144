"""The serving engines `export hf --for` writes for, and where each one's loading rules were read.

    engine("vllm").layouts["eagle3"]      -> "speculators"  (the checkpoint layout that engine reads for the family)
    engine("vllm").quant                  -> "compressed-tensors" (how quantized Linears are written for it)
    engine("vllm").rules()                -> its Rules (vllm.py, sglang.py, trtllm.py, edgellm.py: refusals, notes, the
                                             serve command), imported only when an export runs

This module imports no torch: `specpress export hf --help` reads the versions from it. What an engine does with
each family comes from the families' serving facets (export/hf/facets/: one module per family); a family
without a route in an engine has none there, and `no_route[family]` is the engine's rule that says why.

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
    TensorRT Edge-LLM     the PyPI wheel (tensorrt_edgellm-0.11.0-cp311); its exporter (tensorrt-edgellm-export) runs
      0.11.0              on CPU in a venv of its own (.ci/edgellm-venv) and tests/export/test_edgellm_exports.py runs
                          it on our exports (export/hf/edgellm.py)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specpress.export.hf.facets import Route

VLLM, SGLANG, TRTLLM, EDGELLM = "vllm", "sglang", "trtllm", "edgellm"
ENGINE_NAMES = (VLLM, SGLANG, TRTLLM, EDGELLM)


@dataclass(frozen=True)
class Engine:
    name: str  # the --for value
    label: str
    version: str  # the release (or source) its rules were read from
    quant: str  # the quantized-Linear format it is written in: "compressed-tensors" | "modelopt"
    module: str = ""  # its Rules, imported lazily

    def rules(self) -> Any:
        return importlib.import_module(self.module).RULES

    @property
    def read_from(self) -> str:
        return f"{self.label} {self.version}"

    def route(self, family: str) -> Route | None:
        """How this engine serves `family` (its serving facet's route), or None."""
        from specpress.export.hf.facets import route

        return route(family, self.name)

    @property
    def layouts(self) -> dict[str, str]:
        """family -> "speculators" | "public" (the family's own layout) | "hf" (plain HF LM), for the families it
        routes (in the facets' listing order)."""
        from specpress.export.hf.facets import serving_facets

        return {f: s.routes[self.name].layout for f, s in serving_facets().items() if self.name in s.routes}

    @property
    def no_route(self) -> dict[str, str]:
        """family -> the engine's rule that leaves it out."""
        from specpress.export.hf.facets import serving_facets

        return {f: s.no_route[self.name] for f, s in serving_facets().items() if self.name in s.no_route}


ENGINES: dict[str, Engine] = {
    VLLM: Engine(VLLM, "vLLM", "0.34.0", "compressed-tensors", "specpress.export.hf.vllm"),
    SGLANG: Engine(SGLANG, "SGLang", "0.5.23", "compressed-tensors", "specpress.export.hf.sglang"),
    TRTLLM: Engine(TRTLLM, "TensorRT-LLM", "main (2026 sources, PyTorch backend)", "modelopt",
                   "specpress.export.hf.trtllm"),
    EDGELLM: Engine(EDGELLM, "TensorRT Edge-LLM", "0.11.0", "modelopt", "specpress.export.hf.edgellm"),
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
