"""Serving formats: a drafter as vLLM / SGLang / TensorRT-LLM load it (speculators, compressed-tensors,
ModelOpt's unified layout). `export_hf(drafter_dir, out, fmt, engine=...)`; readers in
specpress/models/serving_io.py. `export_hf`, `ExportSummary` and `FORMATS` load lazily (api.py imports torch), so
`specpress export hf --help` can read the engines (engines.py) without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FORMATS", "ExportSummary", "export_hf"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from specpress.export.hf import api

        return getattr(api, name)
    raise AttributeError(f"module 'specpress.export.hf' has no attribute {name!r}")
