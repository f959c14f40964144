"""`--backend tensorrt`: the drafter as TensorRT engines (an `export trt` directory), the target on torch.

A thin adapter. What is TensorRT's lives here: reading the engine manifest, checking the device, importing
a runtime only when a CUDA device exists (the lean runtime crashes when touched without one), registering
the TreeAttention plugin the engines call, and `EngineSession`, which runs one engine with the calling
convention of an onnxruntime session (`run(output_names, feeds)`). Everything else — bindings per family,
shapes, the drafter's KV cache and its crop/compact — is the exported-graph runner's, built from these
sessions by `build_runner` (runtime/backends/exported.py), as the onnxruntime backend builds it from its own.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specpress.errors import RequestError, SpecpressError
from specpress.readback import read_json
from specpress.runtime.backends.exported import ExportedRunner, build_runner
from specpress.runtime.backends.tensorrt import INSTALL_HINT

if TYPE_CHECKING:  # type-checked against tensorrt-stubs (tensorrt_rtx shares the runtime API)
    import tensorrt

ENGINE_FORMAT = "specpress-tensorrt-engines"
ENGINE_FIX = "rebuild the engines with `specpress export trt --onnx DIR --out DIR`"


class TensorRTRuntimeUnavailable(SpecpressError):
    """No CUDA device, no TensorRT runtime, or a device the engines were not built for."""


def read_engine_manifest(path: Path) -> dict[str, Any]:
    """The `export trt` manifest of `path`, checked for format and for every file it names (the engines and
    onnx_manifest.json: inside `path`, with the size and sha256 it records)."""
    path = Path(path)
    mpath = path / "manifest.json"
    fix = "build one with `specpress export trt --onnx DIR --out DIR`"
    if not mpath.is_file():
        raise RequestError(f"--drafter {path} is not an `specpress export trt` output (no manifest.json); {fix}")
    manifest = read_json(mpath, fix, what="manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != ENGINE_FORMAT:
        found = manifest.get("format", "unknown") if isinstance(manifest, dict) else type(manifest).__name__
        raise RequestError(f"{mpath} is a {found!r} manifest, expected {ENGINE_FORMAT!r} "
                           f"(the output of `specpress export trt`)")
    engines = manifest.get("engines")
    if not isinstance(engines, dict) or not engines or not all(isinstance(e, dict) for e in engines.values()):
        raise RequestError(f"{mpath} lists no engines; rebuild with `specpress export trt`")
    from specpress.manifest import verify_files

    names = [e.get("file") for e in engines.values()]
    verify_files(path, manifest.get("files"), names, str(mpath), ENGINE_FIX)  # inside, present, size + sha256
    return manifest


def check_device(manifest: dict[str, Any], device: torch.device) -> None:
    """Raise unless `device` is a CUDA device the manifest's engines were built for."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise TensorRTRuntimeUnavailable(
            f"the tensorrt backend needs a GPU: it runs engines on a CUDA device; got device {device} "
            f"(torch.cuda.is_available() = {torch.cuda.is_available()}). Use --backend onnxruntime or torch here")
    major, minor = torch.cuda.get_device_capability(device)
    have = f"sm{major}{minor}"
    built = manifest.get("compute_capabilities", [])
    if manifest["tensorrt"]["ahead_of_time"] and "builder default" not in built and have not in built:
        raise TensorRTRuntimeUnavailable(
            f"these engines were built by {manifest['tensorrt']['flavour']} for {', '.join(built)}; this GPU is "
            f"{have}. Rebuild with `specpress export trt --target-gpu {have}` (TensorRT for RTX has no sm90 target)")


def import_runtime(flavour: str) -> Any:
    """The TensorRT module that runs `flavour`'s engines. Call only after `check_device`."""
    names = ["tensorrt_rtx"] if flavour == "tensorrt_rtx" else ["tensorrt", "tensorrt_lean"]
    errors = []
    for name in names:
        try:
            mod = importlib.import_module(name)
        except (ImportError, OSError) as exc:
            errors.append(f"{name}: {exc}")
            continue
        if hasattr(mod, "Runtime"):  # not e.g. the empty namespace package `tensorrt-stubs` leaves behind
            return mod
        errors.append(f"{name}: imports but has no Runtime (type stubs only?)")
    raise TensorRTRuntimeUnavailable(f"no TensorRT runtime for {flavour} engines ({'; '.join(errors)}); {INSTALL_HINT}")


_TORCH_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT32": torch.int32,
                 "INT64": torch.int64, "BOOL": torch.bool, "INT8": torch.int8, "UINT8": torch.uint8}


class EngineSession:
    """One engine, run like an onnxruntime session: `run(output_names | None, {input: array}) -> [outputs]`.
    One execution context per optimization profile (draft, prefill); a call picks the first profile whose
    ranges hold every input's shape. numpy in -> numpy out; torch in -> torch (on the device) out."""

    def __init__(self, trt: Any, runtime: "tensorrt.Runtime", data: bytes, entry: dict[str, Any],
                 device: torch.device):
        self.engine: tensorrt.ICudaEngine = runtime.deserialize_cuda_engine(data)
        if self.engine is None:
            raise TensorRTRuntimeUnavailable(f"TensorRT could not deserialize {entry['file']}; rebuild it with this "
                                             f"TensorRT version (`specpress export trt`)")
        self.device, self.entry = device, entry
        self.profiles = list(entry["profiles"].values())
        self.contexts: dict[int, tensorrt.IExecutionContext] = {}
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.input_names = [n for n in names if is_input[n]]
        self.output_names = [n for n in names if not is_input[n]]
        self.dtypes = {n: _TORCH_DTYPES[str(self.engine.get_tensor_dtype(n)).split(".")[-1]] for n in names}

    def _profile(self, shapes: dict[str, tuple[int, ...]]) -> int:
        for i, prof in enumerate(self.profiles):
            if all(all(lo <= s <= hi for lo, s, hi in zip(prof[n]["min"], shp, prof[n]["max"]))
                   for n, shp in shapes.items()):
                return i
        raise RequestError(f"input shapes {shapes} fall outside every optimization profile of {self.entry['file']}; "
                           f"rebuild with larger --max-tree / --max-context")

    def run(self, output_names: list[str] | None, feeds: dict[str, Any]) -> list[Any]:
        as_numpy = not all(isinstance(v, torch.Tensor) for v in feeds.values())
        inputs = {n: torch.as_tensor(v).to(self.device, self.dtypes[n]).contiguous() for n, v in feeds.items()}
        idx = self._profile({n: tuple(t.shape) for n, t in inputs.items()})
        stream = torch.cuda.current_stream(self.device)
        if idx not in self.contexts:
            new = self.engine.create_execution_context()
            new.set_optimization_profile_async(idx, stream.cuda_stream)
            self.contexts[idx] = new
        ctx = self.contexts[idx]
        for n, t in inputs.items():
            ctx.set_input_shape(n, tuple(t.shape))
            ctx.set_tensor_address(n, t.data_ptr())
        shapes = {n: ctx.get_tensor_shape(n) for n in self.output_names}
        outs = {n: torch.empty([d[i] for i in range(len(d))], dtype=self.dtypes[n], device=self.device)
                for n, d in shapes.items()}
        for n, t in outs.items():
            ctx.set_tensor_address(n, t.data_ptr())
        if not ctx.execute_async_v3(stream.cuda_stream):
            raise RuntimeError(f"TensorRT failed to execute {self.entry['file']}")
        picked = [outs[n] for n in (output_names or self.output_names)]
        return [t.cpu().numpy() for t in picked] if as_numpy else picked


def load_runner(path: Path, target: Any, device: torch.device, **opts: Any) -> ExportedRunner:
    """An `export trt` directory -> a drafter runner whose graphs run as TensorRT engines on `device`."""
    manifest = read_engine_manifest(Path(path))
    check_device(manifest, device)
    trt = import_runtime(manifest["tensorrt"]["flavour"])
    from specpress.runtime.backends.tensorrt.plugin import register_tree_attention  # before deserializing

    register_tree_attention(trt)
    runtime: tensorrt.Runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    sessions = {name: EngineSession(trt, runtime, (Path(path) / e["file"]).read_bytes(), e, device)
                for name, e in manifest["engines"].items()}
    onnx_manifest_path = Path(path) / "onnx_manifest.json"
    if "onnx_manifest.json" not in manifest["files"]:  # recorded (and so checked), or absent
        raise RequestError(f"{path} lacks onnx_manifest.json (the export's I/O description); rebuild it with "
                           f"`specpress export trt --onnx <an export onnx dir>`")
    onnx_manifest = read_json(onnx_manifest_path, "rebuild the engines with `specpress export trt`")
    return build_runner(onnx_manifest, sessions, target, device, backend="tensorrt",
                        provider=f"{manifest['tensorrt']['flavour']} {manifest['tensorrt']['version']}", **opts)
