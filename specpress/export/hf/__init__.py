"""Serving formats: a drafter as vLLM / SGLang / TensorRT-LLM load it (speculators, compressed-tensors,
ModelOpt's unified layout). `export_hf(drafter_dir, out, fmt)`; readers in specpress/models/serving_io.py."""

from specpress.export.hf.api import FORMATS, ExportSummary, export_hf

__all__ = ["FORMATS", "ExportSummary", "export_hf"]
