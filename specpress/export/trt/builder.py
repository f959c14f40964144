"""Build TensorRT engines from an `export onnx` directory, with the TreeAttention plugin registered.

`build_engines(onnx_dir, out, options)` parses every `*.onnx` of the export (strongly typed: precision is
the export's own — its dtype and Q/DQ nodes; TensorRT 11 has no weak typing), adds one optimization
profile per phase (`profiles.py`), builds, and writes `<graph>.engine` per graph plus `manifest.json`
(TensorRT flavour and version, compute-capability targets, profiles, provenance) and a copy of the
export's own manifest (`onnx_manifest.json`, what a runner needs beside the engines). The output
directory is written atomically.

The source is checked before anything is built: an export with a manifest.json must be a specpress export
this version reads, and every graph it lists must be the file it recorded (`manifest.open_export`: inside
the export, size and sha256); only the graphs it lists are built. A directory with no manifest.json (the
`--probe` graph, hand-made graphs) is built as it is: every `*.onnx` in it.

Standard TensorRT builds for the GPU it runs on (it needs one); TensorRT for RTX builds ahead of time for
the `targets` compute capabilities on any machine (no device needed).
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

from specpress.errors import RequestError, SpecpressError
from specpress.manifest import sha256_file
from specpress.runtime.backends.tensorrt.library import TensorRT, TensorRTUnavailable, load_tensorrt
from specpress.runtime.backends.tensorrt.plugin import NAME, NAMESPACE, VERSION, register_tree_attention
from specpress.export.trt.profiles import AxisRange, Budget, Shapes, onnx_input_shapes, profiles

if TYPE_CHECKING:  # type-checked against tensorrt-stubs; tensorrt_rtx shares the API (RTX-only calls cast)
    import tensorrt

FORMAT = "specpress-tensorrt-engines"
FORMAT_VERSION = 2  # 2: `files` records the size and sha256 of every engine and of onnx_manifest.json
Echo = Callable[[str], None]


class TensorRTBuildError(SpecpressError):
    """TensorRT could not parse or build an exported graph."""


@dataclass(frozen=True)
class BuildOptions:
    budget: Budget = field(default_factory=Budget)
    axes: tuple[tuple[str, AxisRange], ...] = ()  # per-axis overrides of the budget's ranges
    targets: tuple[str, ...] = ()  # TensorRT for RTX compute capabilities, e.g. ("sm86", "sm89"); () = default
    flavour: str | None = None  # "tensorrt" | "tensorrt_rtx" | None (standard when importable)


def _logger(trt: Any, echo: Echo, verbose: bool) -> Any:
    class Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.ERROR, trt.ILogger.INTERNAL_ERROR):
                self.errors.append(msg)
            if verbose or severity in (trt.ILogger.ERROR, trt.ILogger.INTERNAL_ERROR, trt.ILogger.WARNING):
                echo(f"  [TensorRT {str(severity).split('.')[-1].lower()}] {msg}")

    return Logger()


def _progress(trt: Any, echo: Echo) -> Any:
    class Progress(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.started: dict[str, float] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            self.started[phase_name] = time.perf_counter()
            if parent_phase is None:
                echo(f"  {phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True

        def phase_finish(self, phase_name: str) -> None:
            t0 = self.started.pop(phase_name, None)
            if t0 is not None and not self.started:
                echo(f"  {phase_name} done in {time.perf_counter() - t0:.1f} s")

    return Progress()


def _compute_capabilities(lib: TensorRT, config: "tensorrt.IBuilderConfig", targets: tuple[str, ...]) -> list[str]:
    trt = lib.module
    if not lib.aot:
        if targets:
            raise RequestError(f"--target-gpu is for TensorRT for RTX (ahead-of-time); standard TensorRT builds for "
                               f"the GPU it runs on. Drop {','.join(targets)} or install specpress[trt-rtx]")
        import torch

        major, minor = torch.cuda.get_device_capability()
        return [f"sm{major}{minor}"]
    known = {k.lower(): v for k, v in trt.ComputeCapability.__members__.items() if k.startswith("SM")}
    bad = [t for t in targets if t.lower() not in known]
    if bad:
        raise RequestError(f"unknown --target-gpu {','.join(bad)}; {lib.flavour} {lib.version} targets "
                           f"{', '.join(sorted(known))}")
    if not targets:
        return ["builder default"]
    rtx_config = cast(Any, config)  # TensorRT for RTX only: not in standard TensorRT's API
    rtx_config.num_compute_capabilities = len(targets)
    for i, t in enumerate(targets):
        rtx_config.set_compute_capability(known[t.lower()], i)
    return [t.lower() for t in targets]


def _tree_attention_nodes(path: Path) -> int:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return sum(1 for n in graph.node if n.op_type == NAME and n.domain == NAMESPACE)


def _check_zero_points(path: Path) -> None:
    """Refuse asymmetric integer Q/DQ before the parser does, with the fix: TensorRT's ONNX parser takes
    signed int8 / int4 codes with zero point 0 only (TensorRT for RTX 1.7.1: "Found unsupported input type
    of UINT8", "Non-zero zero point is not supported"; uint4 initializers do not import)."""
    import onnx

    from onnx import numpy_helper

    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name: i for i in graph.initializer}
    unsigned = (onnx.TensorProto.UINT8, onnx.TensorProto.UINT4)

    def shifted(node: Any) -> bool:
        w = inits.get(node.input[0])
        z = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        return (w is not None and w.data_type in unsigned) or (z is not None and bool(numpy_helper.to_array(z).any()))

    bad = [n.input[0] for n in graph.node if n.op_type == "DequantizeLinear" and shifted(n)]
    if bad:
        raise TensorRTBuildError(
            f"{path.name} dequantizes {len(bad)} weight(s) with zero points (asymmetric integer codes, e.g. "
            f"{bad[0]}); TensorRT's ONNX parser takes signed codes with zero point 0 only. Quantize with "
            f"--symmetric for TensorRT (onnxruntime runs the asymmetric export as it is)")


def _decomposable_attention(trt: Any, outputs: list[Any]) -> int:
    """Let every parsed IAttention fall back to several kernels where TensorRT has no fused one; return how many.

    The parser leaves them not decomposable, so a shape or dtype without a fused kernel fails the whole build in
    Myelin ("Attention operation was not supported by a dedicated kernel"): every fp32 export in the standard
    form did, on TensorRT for RTX 1.7.1 (measured 2026-12-07). Where a fused kernel exists TensorRT still takes
    it (IAttention::setDecomposable: "if no fused kernel support found")."""
    for layer in outputs:
        layer.__class__ = trt.IAttentionOutputLayer  # the parser returns ILayer; the attention hangs off its output
        layer.attention.decomposable = True
    return len(outputs)


def build_graph(lib: TensorRT, path: Path, options: BuildOptions, echo: Echo, verbose: bool = False
                ) -> tuple[bytes, dict[str, Any]]:
    """Parse and build one ONNX file -> (serialized engine, its manifest entry)."""
    trt = lib.module
    _check_zero_points(path)
    register_tree_attention(trt)
    logger = _logger(trt, echo, verbose)
    builder: tensorrt.Builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):  # TensorRT 11: strongly typed only
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network: tensorrt.INetworkDefinition = builder.create_network(flags)
    parser: tensorrt.OnnxParser = trt.OnnxParser(network, logger)
    t0 = time.perf_counter()
    if not parser.parse_from_file(str(path)):
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)) or "; ".join(logger.errors)
        raise TensorRTBuildError(f"{lib.flavour} {lib.version} could not parse {path.name}: {errs}")
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    plugins = sum(1 for layer in layers if layer.type == trt.LayerType.PLUGIN_V3)
    dequantize = sum(1 for layer in layers if layer.type == trt.LayerType.DEQUANTIZE)
    attention_kind = getattr(trt.LayerType, "ATTENTION_OUTPUT", None)  # IAttention (TensorRT >= 10.14 / RTX)
    attention = _decomposable_attention(trt, [layer for layer in layers
                                              if attention_kind is not None and layer.type == attention_kind])
    expected = _tree_attention_nodes(path)
    if plugins < expected:
        raise TensorRTBuildError(
            f"{path.name} has {expected} {NAMESPACE}::{NAME} node(s) but {lib.flavour} {lib.version}'s parser built "
            f"{plugins} plugin layer(s): it imported the node's model-local function instead of the plugin. "
            f"Export with --attention standard for this TensorRT, or use one whose parser prefers registered plugins")
    shapes = onnx_input_shapes(path)
    phases = profiles(shapes, options.budget, dict(options.axes))
    config: tensorrt.IBuilderConfig = builder.create_builder_config()
    for shp in phases.values():
        profile: tensorrt.IOptimizationProfile = builder.create_optimization_profile()
        for name, (lo, mid, hi) in shp.items():
            profile.set_shape(name, trt.Dims(lo), trt.Dims(mid), trt.Dims(hi))
        config.add_optimization_profile(profile)
    targets = _compute_capabilities(lib, config, options.targets)
    config.progress_monitor = _progress(trt, echo)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise TensorRTBuildError(f"{lib.flavour} {lib.version} could not build {path.name}: "
                                 f"{'; '.join(logger.errors) or 'no error was logged'}")
    data = bytes(engine)
    io = [network.get_input(i) for i in range(network.num_inputs)], \
        [network.get_output(i) for i in range(network.num_outputs)]
    entry = {
        "onnx": path.name,
        "onnx_sha256": sha256_file(path),
        "inputs": {t.name: str(t.dtype).split(".")[-1].lower() for t in io[0]},
        "outputs": {t.name: str(t.dtype).split(".")[-1].lower() for t in io[1]},
        "profiles": {ph: {n: {"min": list(s[0]), "opt": list(s[1]), "max": list(s[2])} for n, s in shp.items()}
                     for ph, shp in phases.items()},
        "layers": len(layers),
        "plugin_layers": plugins,
        "dequantize_layers": dequantize,  # the export's DequantizeLinear nodes as parsed (before fusion)
        "attention_layers": attention,  # ONNX Attention nodes (--attention standard) as IAttention layers
        "compute_capabilities": targets,
        "bytes": len(data),
        "build_seconds": round(time.perf_counter() - t0, 3),
    }
    return data, entry


def read_source_manifest(onnx_dir: Path) -> dict[str, Any] | None:
    """The raw manifest.json of the `export onnx` directory `onnx_dir`, once `open_export` has checked it and
    every file it names; None when the directory has none (bare graphs)."""
    from specpress.manifest import open_export

    path = Path(onnx_dir) / "manifest.json"
    if not path.exists():
        return None
    open_export(onnx_dir)
    return cast(dict[str, Any], json.loads(path.read_text()))


def source_graphs(onnx_dir: Path, source: dict[str, Any] | None) -> list[Path]:
    """The graphs to build: those the checked manifest lists, in its order, else every `*.onnx`."""
    from specpress.manifest import EXPORT_FIX, manifest_from_dict, member

    if source is None:
        return sorted(Path(onnx_dir).glob("*.onnx"))
    return [member(Path(onnx_dir), g.file, str(Path(onnx_dir) / "manifest.json"), EXPORT_FIX)
            for g in manifest_from_dict(source).graphs]


def build_engines(onnx_dir: Path, out: Path, options: BuildOptions = BuildOptions(), *, echo: Echo = print,
                  force: bool = False, verbose: bool = False) -> dict[str, Any]:
    """Build one engine per `*.onnx` in `onnx_dir` into `out`; returns the manifest written there."""
    from specpress import __version__
    from specpress.artifacts import atomic_dir, write_json
    from specpress.manifest import file_records

    onnx_dir = Path(onnx_dir)
    source = read_source_manifest(onnx_dir)  # checked before TensorRT is even loaded
    files = source_graphs(onnx_dir, source)
    if not files:
        raise RequestError(f"{onnx_dir} holds no .onnx files; expected the output of `specpress export onnx`")
    lib = load_tensorrt(options.flavour)
    if not lib.aot:
        import torch

        if not torch.cuda.is_available():
            raise TensorRTUnavailable(
                f"standard TensorRT ({lib.version}) builds only on a CUDA device and none is visible; build "
                f"ahead of time with TensorRT for RTX instead (`pip install 'specpress[trt-rtx]'`, "
                f"--flavour tensorrt_rtx)")
    echo(f"{lib.flavour} {lib.version}: building {len(files)} graph(s) from {onnx_dir}")
    engines: dict[str, Any] = {}
    t0 = time.perf_counter()
    with atomic_dir(out, force=force) as tmp:
        for path in files:
            echo(f"{path.name}:")
            data, entry = build_graph(lib, path, options, echo, verbose)
            (tmp / f"{path.stem}.engine").write_bytes(data)
            entry["file"] = f"{path.stem}.engine"
            engines[path.stem] = entry
            extra = "".join(f", {entry[k]} {k.replace('_layers', '')} layer(s)"
                            for k in ("attention_layers", "dequantize_layers") if entry[k])
            echo(f"  -> {entry['file']} ({entry['bytes']:,} B, {entry['plugin_layers']} plugin layer(s){extra}, "
                 f"{entry['build_seconds']:.1f} s)")
        if source is not None:
            shutil.copyfile(onnx_dir / "manifest.json", tmp / "onnx_manifest.json")
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tensorrt": {"flavour": lib.flavour, "version": lib.version, "ahead_of_time": lib.aot},
            "compute_capabilities": sorted({c for e in engines.values() for c in e["compute_capabilities"]}),
            "budget": {"max_tree": options.budget.max_tree, "max_context": options.budget.max_context},
            "axes": {n: [r.min, r.opt, r.max] for n, r in options.axes},
            "plugins": [{"name": NAME, "namespace": NAMESPACE, "version": VERSION,
                         "implementation": "python: specpress.runtime.backends.tensorrt.plugin (register before "
                                           "deserializing)"}],
            "engines": engines,
            "files": file_records(tmp, [e["file"] for e in engines.values()]
                                  + (["onnx_manifest.json"] if source is not None else [])),
            "build_seconds": round(time.perf_counter() - t0, 3),
            "provenance": {
                "onnx_dir": str(onnx_dir.resolve()),
                "onnx_manifest": "onnx_manifest.json" if source is not None else None,
                "source": (source or {}).get("provenance"),
                "specpress_version": __version__,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "host": platform.node(),
            },
        }
        write_json(tmp / "manifest.json", manifest)
    echo(f"wrote {out} ({len(engines)} engine(s), {manifest['build_seconds']:.1f} s)")
    return manifest
