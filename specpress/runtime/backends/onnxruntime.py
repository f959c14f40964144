"""The onnxruntime drafter backend: a DrafterRunner over InferenceSessions of an `export onnx` directory.

    load_runner(path, target, device, providers=None, threads=None, fold_dequantize=True) -> ExportedRunner

Reads only the exported directory (manifest.json, the graphs, the shared target tensors); the drafter's
torch module is never built. The CUDA execution provider is used when onnxruntime offers it and the
device is CUDA, else the CPU one; `runner.provider` reports the one that actually ran.

fold_dequantize: let onnxruntime fold DequantizeLinear of constant weights (fp8, Q/DQ int4/int8) into
float weights when the session loads. The CPU has no fp8 or blocked-int GEMM for them, so unfolded they
dequantize on every call (measured: an fp8 EAGLE-3 step 60 ms unfolded vs 10 ms folded); folded, the
export keeps its bytes on disk and runs at fp32 speed and memory. MatMulNBits / MatMulBnb4 are unaffected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from specpress.errors import CheckpointError, UsageError
from specpress.manifest import load_manifest
from specpress.runtime.backends.exported import ExportedRunner, build_runner

__all__ = ["build_runner", "load_runner"]  # build_runner: the tensorrt backend drives its engines through it


def _ort() -> Any:
    """onnxruntime, imported on use: this module also serves the tensorrt backend (build_runner)."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise UsageError(f"the onnxruntime backend needs onnxruntime ({exc}); pip install 'specpress[ort]'") from None
    return onnxruntime


def pick_providers(device: torch.device, providers: Sequence[str] | None) -> list[str]:
    if providers:
        return list(providers)
    if device.type == "cuda" and "CUDAExecutionProvider" in _ort().get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def load_runner(path: str | Path, target: Any, device: torch.device | str = "cpu", *,
                providers: Sequence[str] | None = None, threads: int | None = None, fold_dequantize: bool = True,
                strict: bool = False, warn: Callable[[str], None] = print, **_: Any) -> ExportedRunner:
    """An ExportedRunner whose graphs run in onnxruntime sessions (see the module docstring)."""
    path = Path(path).expanduser()
    manifest = load_manifest(path)
    device = torch.device(device)
    ort = _ort()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    # compute what the graph says: no fusing of Q/DQ int4 + MatMul into int8-activation MatMulNBits
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    if fold_dequantize:
        opts.add_session_config_entry("session.disable_quant_qdq", "1")
    chosen = pick_providers(device, providers)
    sessions = {}
    for g in manifest.graphs:
        file = path / g.file
        if not file.is_file():
            raise CheckpointError(f"{file} is missing from the export (listed in manifest.json); export again")
        sessions[g.name] = ort.InferenceSession(str(file), opts, providers=chosen)
    ran = ",".join(sorted({s.get_providers()[0] for s in sessions.values()}))
    return build_runner(manifest, sessions, target, device, backend="onnxruntime", provider=ran, strict=strict,
                        warn=warn, numpy_io=True)
