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
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnxruntime as ort
import torch
from torch import Tensor

from specpress.errors import CheckpointError
from specpress.manifest import load_manifest
from specpress.runtime.backends.exported import ExportedRunner

NP_OF = {torch.float32: np.float32, torch.float16: np.float16}


class SessionCall:
    """One graph as a GraphCall: torch tensors in, torch tensors (on `device`) out."""

    def __init__(self, session: ort.InferenceSession, device: torch.device) -> None:
        self.session = session
        self.device = device
        self.inputs = [i.name for i in session.get_inputs()]
        self.outputs = [o.name for o in session.get_outputs()]

    def __call__(self, feeds: Mapping[str, Tensor]) -> dict[str, Tensor]:
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise ValueError(f"graph inputs {missing} were not given (got {sorted(feeds)})")
        arrays = {n: feeds[n].detach().cpu().contiguous().numpy() for n in self.inputs}
        outs = self.session.run(self.outputs, arrays)
        return {n: torch.from_numpy(a).to(self.device) for n, a in zip(self.outputs, outs)}


def pick_providers(device: torch.device, providers: Sequence[str] | None) -> list[str]:
    if providers:
        return list(providers)
    if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def check_target(manifest_target: Mapping[str, Any] | None, target: Any, path: Path, strict: bool,
                 warn: Callable[[str], None]) -> None:
    """The shared tensors in the export came from one target: another one warns (drafts will be poor),
    or fails with `strict` (as the torch backend treats a drafter built for another target)."""
    if not manifest_target or target is None:
        return
    from specpress.models.drafter import target_fingerprint

    mine = target_fingerprint(target.config, target)
    bad = [k for k in ("config_sha256", "weights_sha256") if k in manifest_target and k in mine
           and manifest_target[k] != mine[k]]
    if bad:
        msg = (f"{path} was exported against another target ({', '.join(bad)} differ): its embeddings/head are "
               f"that target's; export the drafter again with --target set to this one")
        if strict:
            raise CheckpointError(msg)
        warn(f"warning: {msg}")


def load_runner(path: str | Path, target: Any, device: torch.device | str = "cpu", *,
                providers: Sequence[str] | None = None, threads: int | None = None, fold_dequantize: bool = True,
                strict: bool = False, warn: Callable[[str], None] = print, **_: Any) -> ExportedRunner:
    """An ExportedRunner whose graphs run in onnxruntime sessions (see the module docstring)."""
    path = Path(path).expanduser()
    manifest = load_manifest(path)
    check_target(manifest.target, target, path, strict, warn)
    device = torch.device(device)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    # compute what the graph says: no fusing of Q/DQ int4 + MatMul into int8-activation MatMulNBits
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    if fold_dequantize:
        opts.add_session_config_entry("session.disable_quant_qdq", "1")
    chosen = pick_providers(device, providers)
    calls, ran = {}, set()
    for g in manifest.graphs:
        file = path / g.file
        if not file.is_file():
            raise CheckpointError(f"{file} is missing from the export (listed in manifest.json); export again")
        sess = ort.InferenceSession(str(file), opts, providers=chosen)
        ran.add(sess.get_providers()[0])
        calls[g.name] = SessionCall(sess, device)
    return ExportedRunner(manifest, calls, device, "onnxruntime", ",".join(sorted(ran)))
