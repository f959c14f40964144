"""The onnxruntime backend: a drafter runner over InferenceSessions of an `export onnx` directory, and a
TargetRunner (OnnxTarget) over an `export target` directory.

    load_runner(path, target, device, providers=None, threads=None, fold_dequantize=True) -> ExportedRunner
    load_target_runner(path, device, providers=None, threads=None) -> OnnxTarget   (an `export target` dir)
    target_runner(path, model) -> OnnxTarget      (the registry's entry: on the CPU execution provider)

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
from torch import Tensor

from specpress.errors import CheckpointError, RequestError
from specpress.manifest import EXPORT_FIX, TARGET_FIX, TargetExportManifest, member, open_export, open_target_export
from specpress.models.kv import KVCache
from specpress.models.layers import causal_mask
from specpress.models.target import TargetConfig, TargetOutput
from specpress.runtime.backends.exported import TORCH_DTYPES, ExportedRunner, SessionCall, build_runner, run_cached


def _ort() -> Any:
    """onnxruntime, imported on use."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise RequestError(f"the onnxruntime backend needs onnxruntime ({exc}); pip install 'specpress[ort]'") from None
    return onnxruntime


def pick_providers(device: torch.device, providers: Sequence[str] | None) -> list[str]:
    if providers:
        return list(providers)
    if device.type == "cuda" and "CUDAExecutionProvider" in _ort().get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def session_options(ort: Any, threads: int | None, fold_dequantize: bool = True) -> Any:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    # no spin-waiting of idle workers after a run: the loop runs torch (the target, tree building) between
    # two session runs on the same cores, and spinning workers took them from it (medium target, 2 threads,
    # BENCHMARKS.md at 173085a: the onnxruntime drafter's forwards 1.9x -> 0.57x the compiled torch drafter's)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # compute what the graph says: no fusing of Q/DQ int4 + MatMul into int8-activation MatMulNBits
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    if fold_dequantize:
        opts.add_session_config_entry("session.disable_quant_qdq", "1")
    return opts


def open_session(ort: Any, file: Path, opts: Any, providers: Sequence[str], fix: str) -> Any:
    """An InferenceSession over `file` (already checked against its manifest); onnxruntime's own refusal
    (a graph this onnxruntime cannot load) comes back as a CheckpointError naming the file and `fix`."""
    state = ort.capi.onnxruntime_pybind11_state  # its errors (Fail, InvalidGraph, InvalidProtobuf, ...) share no base
    errors = tuple(v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception))
    try:
        return ort.InferenceSession(str(file), opts, providers=list(providers))
    except (RuntimeError, OSError, *errors) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{file}: onnxruntime {ort.__version__} cannot load it ({first}); {fix}") from None


def load_runner(path: str | Path, target: Any, device: torch.device | str = "cpu", *,
                providers: Sequence[str] | None = None, threads: int | None = None, fold_dequantize: bool = True,
                strict: bool = False, warn: Callable[[str], None] = print, **_: Any) -> ExportedRunner:
    """An ExportedRunner whose graphs run in onnxruntime sessions (see the module docstring)."""
    path = Path(path).expanduser()
    manifest = open_export(path)  # every graph and the shared tensors checked against their sha256
    device = torch.device(device)
    ort = _ort()
    opts = session_options(ort, threads, fold_dequantize)
    chosen = pick_providers(device, providers)
    sessions = {}
    for g in manifest.graphs:
        sessions[g.name] = open_session(ort, member(path, g.file, str(path), EXPORT_FIX), opts, chosen, EXPORT_FIX)
    ran = ",".join(sorted({s.get_providers()[0] for s in sessions.values()}))
    return build_runner(manifest, sessions, target, device, backend="onnxruntime", provider=ran, strict=strict,
                        warn=warn, numpy_io=True)


class OnnxTarget:
    """The `TargetRunner` over an `export target` directory: the target's forward in one onnxruntime session,
    its K/V in a `models.kv.KVCache` (the loop crops and compacts it as the torch target's). Only the outputs
    a call needs are fetched: logits, the hidden state, the taps asked for, the present K/V."""

    def __init__(self, manifest: TargetExportManifest, session: Any, device: torch.device, provider: str) -> None:
        self.manifest = m = manifest
        self._config = TargetConfig.from_hf(m.config, "the export's config")
        self.session, self._device, self.provider = session, device, provider
        self.dtype = TORCH_DTYPES[m.dtype]
        self._calls: dict[tuple[int, ...], SessionCall] = {}

    @property
    def config(self) -> TargetConfig:
        return self._config

    @property
    def device(self) -> torch.device:
        return self._device

    def new_cache(self, capacity: int) -> KVCache:
        m = self.manifest
        return KVCache(m.layers, 1, m.kv_heads, capacity, m.head_dim, self.dtype, self._device)

    def _call(self, taps: tuple[int, ...]) -> SessionCall:
        if taps not in self._calls:
            kv = [f"present_{x}.{i}" for i in range(self.manifest.layers) for x in ("key", "value")]
            outs = ["logits", "hidden", *kv, *(f"hidden_states.{i}" for i in taps if i < self.manifest.layers)]
            self._calls[taps] = SessionCall(self.session, outs, self._device, numpy_io=True, label=self.manifest.file)
        return self._calls[taps]

    def forward(self, ids: Tensor, *, cache: KVCache, positions: Tensor | None = None, mask: Tensor | None = None,
                taps: Sequence[int] = (), logits: str = "all") -> TargetOutput:
        layers = self.manifest.layers
        bad = [i for i in taps if not 0 <= i <= layers]
        if bad:
            raise RequestError(f"taps {bad} are outside the target's hidden states 0..{layers}")
        t = ids.shape[1]
        past = cache.reserve(t)
        dev = self._device
        pos = torch.arange(past, past + t, device=dev) if positions is None else positions.to(dev)
        mask = causal_mask(t, past, dev) if mask is None else mask.to(dev)
        if tuple(mask.shape) != (t, past + t):
            raise ValueError(f"mask must be [{t}, {past + t}] (new tokens x (cache + new)), got {tuple(mask.shape)}")
        feeds = {"ids": ids.to(torch.int64), "positions": pos.reshape(1, t).to(torch.int64), "mask": mask.to(torch.bool)}
        out = run_cached(self._call(tuple(sorted(set(taps)))), feeds, cache, range(layers), past, t)
        tapped = {i: out["hidden"] if i == layers else out[f"hidden_states.{i}"] for i in taps}
        lg = None if logits == "none" else out["logits"][:, -1:] if logits == "last" else out["logits"]
        return TargetOutput(lg, out["hidden"], tapped)


def load_target_runner(path: str | Path, device: torch.device | str = "cpu", *,
                       providers: Sequence[str] | None = None, threads: int | None = None) -> OnnxTarget:
    """An OnnxTarget over the `export target` directory at `path`."""
    path = Path(path).expanduser()
    manifest = open_target_export(path)  # the graph and its weights checked against their sha256
    file = member(path, manifest.file, str(path), TARGET_FIX)
    device = torch.device(device)
    ort = _ort()
    session = open_session(ort, file, session_options(ort, threads), pick_providers(device, providers), TARGET_FIX)
    return OnnxTarget(manifest, session, device, session.get_providers()[0])


def target_runner(path: Path, model: Any) -> OnnxTarget:
    """`--target-backend onnxruntime`: an OnnxTarget over the `export target` directory at `path` (the
    registry's entry; `model`, the torch target, is not needed), on the CPU execution provider."""
    return load_target_runner(path, "cpu")
