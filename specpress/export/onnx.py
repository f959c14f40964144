"""`export onnx`: a drafter -> a directory of ONNX graphs + manifest.json, validated against torch.

    export_onnx(drafter, out, ExportOptions(...)) -> ExportReport

The drafter must be attached to its target (load_drafter(path, target=...)), and the target is passed
too: the target's embeddings and head are written once, beside the graphs (`target_shared.bin`,
referenced by each graph as external data) and counted apart from the drafter's own bytes; the target
verifies the real drafting rounds of the validation. Each graph's own weights stream into its external
data file (`<graph>.onnx.data`) as the graph is built (export/graph.py), so a drafter of any size exports
(protobuf caps one serialized graph at 2 GB) and no second copy of its weights is held. The directory
appears atomically, and only when every graph passed both checks: random inputs (export/validate.py), then
real drafting rounds through the onnxruntime backend against the torch drafter (export/rounds.py).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto

from specpress import __version__
from specpress.artifacts import atomic_dir
from specpress.errors import RequestError, UsageError
from specpress.export import ops
from specpress.export.context import Ctx
from specpress.export.families import build_graphs, cache_dims
from specpress.export.graph import ExternalData, Graph
from specpress.export.rounds import RoundsReport, validate_rounds
from specpress.export.validate import TOLERANCE, case, check, compare, reference_copy
from specpress.manifest import (
    DrafterInfo,
    ExportManifest,
    GraphSpec,
    TensorSpec,
    file_records,
)
from specpress.models.drafter import get_family
from specpress.ticker import count_bar

SHARED_FILE = "target_shared.bin"
DTYPES = ("fp32", "fp16")
QUANT_FORMATS = ("matmulnbits", "qdq")
ELEM_NAMES = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16", TensorProto.INT64: "int64",
              TensorProto.INT32: "int32", TensorProto.BOOL: "bool"}


@dataclass(frozen=True)
class ExportOptions:
    attention: str = "standard"  # "standard" (ONNX Attention, opset 23) | "plugin" (specpress::TreeAttention)
    opset: int | None = None  # default: 23 (the standard form's minimum; the plugin form accepts >= 18)
    dtype: str = "fp32"  # "fp32" | "fp16"
    quant_format: str = "matmulnbits"  # quantized Linears: "matmulnbits" (onnxruntime) | "qdq" (TensorRT)
    accuracy_level: int = 0  # MatMulNBits activations: 0 fp32 (as torch computes), 4 int8 (faster on CPU)
    force: bool = False  # replace an existing output directory

    def __post_init__(self) -> None:
        if self.attention not in ops.ATTENTION_FORMS:
            raise UsageError(f"--attention {self.attention!r} is not a form; choose one of "
                             f"{', '.join(ops.ATTENTION_FORMS)}")
        if self.dtype == "bf16":
            raise UsageError("--dtype bf16: onnxruntime's CPU kernels have no bf16 MatMul/Attention, so a bf16 "
                             "export could not be validated here; export fp32 or fp16")
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.quant_format not in QUANT_FORMATS:
            raise UsageError(f"--quant-format {self.quant_format!r}: choose one of {', '.join(QUANT_FORMATS)}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise UsageError(f"--accuracy-level {self.accuracy_level}: MatMulNBits takes 0 (unset: fp32), 1 (fp32), "
                             f"2 (fp16), 3 (bf16) or 4 (int8)")
        need = ops.MIN_OPSET[self.attention]
        if self.opset is not None and self.opset < need:
            raise UsageError(f"--opset {self.opset} is too old for the {self.attention} attention form, which "
                             f"needs opset >= {need}; pass --opset {need} or later (or omit it)")

    @property
    def resolved_opset(self) -> int:
        return self.opset or 23


@dataclass
class ExportReport:
    out: Path
    graphs: dict[str, int]  # graph -> its own bytes
    shared_bytes: int
    errors: dict[str, dict[str, dict[str, float]]]  # graph -> output -> {max_abs, max_rel} on random inputs
    tolerance: float
    seconds: float
    quantization: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    rounds: RoundsReport | None = None  # the real-round check: draft agreement, errors per graph and output


def require_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise RequestError(f"exporting validates every graph with onnxruntime, which is not installed ({exc}); "
                           f"pip install 'specpress[ort]'") from None
    return onnxruntime


def session_options(ort: Any, *, prepack: bool = True) -> Any:
    """Sessions that compute what the graph says: onnxruntime would otherwise fuse Q/DQ int4 + MatMul
    into MatMulNBits with int8 activations (accuracy level 4), an error the torch drafter never makes.
    prepack=False: no packed copy of each MatMul weight (what a validation session, run a few times, uses:
    the weights are then held once, as the mapped external data)."""
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.log_severity_level = 3
    return opts


def drafter_info(d: Any) -> DrafterInfo:
    cfg = d.config
    fam = get_family(d.family)
    layers, kv, hd = cache_dims(d)
    vd = getattr(cfg, "draft_vocab_size", cfg.vocab_size)
    token_map = None
    if fam.draft_vocab == "reduced":  # its own head over Vd draft ids, d2t maps them to target ids
        token_map = tuple(int(i) for i in (np.arange(vd) + d.d2t.cpu().numpy()))
    block = fam.session == "block"
    return DrafterInfo(taps=tuple(d.taps), vocab_size=cfg.vocab_size, draft_vocab_size=vd, token_map=token_map,
                       cache_layers=layers, kv_heads=kv, head_dim=hd, hidden_size=cfg.hidden_size,
                       max_positions=cfg.max_position_embeddings,
                       block_size=cfg.block_size if block else None,
                       mask_token_id=cfg.mask_token_id if block else None,
                       markov=bool(block and d.markov_head is not None))


def close_data(files: list[ExternalData]) -> dict[str, int]:
    """Close the external data files; remove those nothing was written to. {file name: bytes} of the rest."""
    kept = {}
    for d in files:
        d.close()
        if d.written:
            kept[d.path.name] = d.path.stat().st_size
        else:
            d.path.unlink()
    return kept


def tensor_specs(vis: Any) -> tuple[TensorSpec, ...]:
    out = []
    for v in vis:
        tt = v.type.tensor_type
        shape = tuple(d.dim_param if d.dim_param else d.dim_value for d in tt.shape.dim)
        out.append(TensorSpec(v.name, ELEM_NAMES[tt.elem_type], shape))
    return tuple(out)


def export_onnx(drafter: Any, out: str | Path, options: ExportOptions = ExportOptions(),
                progress: Callable[[str], None] = lambda s: None, *, target: Any = None,
                bar: bool = False) -> ExportReport:
    """Export `drafter` (attached to `target`, a TargetModel) to `out`; see the module docstring. bar: a
    progress bar (stderr) over the graphs' validation."""
    if target is None:
        raise RequestError("export_onnx validates the export on real drafting rounds, which the target verifies: "
                           "pass target=<the TargetModel the drafter is attached to>")
    ort = require_onnxruntime()
    t0 = time.perf_counter()
    o = options
    opset = o.resolved_opset
    quant_notes: list[str] = []

    progress(f"building graphs ({drafter.family}, attention {o.attention}, opset {opset}, {o.dtype})")
    ref = reference_copy(drafter, o.dtype)
    errors: dict[str, dict[str, dict[str, float]]] = {}
    sizes: dict[str, int] = {}
    with atomic_dir(out, force=o.force) as tmp:
        shared = ExternalData(tmp / SHARED_FILE)
        data: list[ExternalData] = []

        def new(name: str) -> Ctx:
            data.append(ExternalData(tmp / f"{name}.onnx.data"))
            g = Graph(name, opset, o.dtype, data=data[-1], shared_data=shared)
            return Ctx(g, o.attention, o.quant_format, o.accuracy_level, quant_notes=quant_notes,
                       kv_cache=getattr(drafter, "kv_cache_format", "none"))

        ctxs, roles = build_graphs(drafter, new)
        kept = close_data([shared, *data])
        shared_bytes = kept.pop(SHARED_FILE, 0)
        quant = _quantization(drafter, o, quant_notes)
        tol = max([TOLERANCE[o.dtype], *quant['tolerances'].values()]) if quant else TOLERANCE[o.dtype]
        specs = []
        with count_bar(bar, "validating graphs", len(ctxs)) as advance:
            for name, c in ctxs.items():
                path = tmp / f"{name}.onnx"
                model = c.g.model()
                onnx.save(model, str(path))
                onnx.checker.check_model(str(path))
                data_file = f"{name}.onnx.data" if f"{name}.onnx.data" in kept else None
                sizes[name] = path.stat().st_size + kept.get(data_file or "", 0)
                specs.append(GraphSpec(name, path.name, tensor_specs(model.graph.input),
                                       tensor_specs(model.graph.output), sizes[name], roles[name], bool(c.g.shared),
                                       data_file))
                del model
                progress(f"validating {name} ({sizes[name]:,} bytes)")
                sess = ort.InferenceSession(str(path), session_options(ort, prepack=False),
                                            providers=["CPUExecutionProvider"])
                feeds, want = case(ref, name, o.attention)
                errors[name] = compare(lambda f, s=sess: dict(zip([x.name for x in s.get_outputs()], s.run(None, f))),
                                       feeds, want)
                del sess
                advance()
        del ctxs
        check(errors, tol)
        manifest = ExportManifest(
            family=drafter.family, opset=opset, attention=o.attention, dtype=o.dtype, quantization=quant,
            graphs=tuple(specs), drafter=drafter_info(drafter), shared_file=SHARED_FILE if shared_bytes else None,
            shared_bytes=shared_bytes, provenance=tuple(dict(s) for s in drafter.provenance),
            target=drafter.target_fingerprint, validation=errors, specpress_version=__version__,
            plugin=_plugin_contract() if o.attention == "plugin" else {})
        manifest = dataclasses.replace(manifest, files=file_records(tmp, manifest.file_names()))
        manifest.save(tmp)
        progress(f"validating on real drafting rounds ({get_family(drafter.family).default_policy}, greedy)")
        rounds = validate_rounds(ref, target, tmp)
        rounds.check(tol)
        dataclasses.replace(manifest, validation_rounds=rounds.summary()).save(tmp)
    return ExportReport(Path(out), sizes, shared_bytes, errors, tol, time.perf_counter() - t0, quant, rounds=rounds)


def _plugin_contract() -> dict[str, Any]:
    return {"op": f"{ops.PLUGIN_DOMAIN}::{ops.PLUGIN_OP}", "plugin_version": ops.PLUGIN_VERSION,
            "plugin_namespace": ops.PLUGIN_DOMAIN,
            "inputs": ["q [B,Hq,T,D] after RoPE", "k [B,Hkv,S,D] past+new after RoPE", "v [B,Hkv,S,D]",
                       "committed int32 [1]", "tree_mask int32 [T, ceil((S-committed)/32)] LSB-first"],
            "output": "out [B,Hq,T,D]", "attributes": ["num_heads", "num_kv_heads", "head_size", "scale"]}


def _quantization(drafter: Any, o: ExportOptions, notes: list[str]) -> dict[str, Any] | None:
    """The manifest's quantization block: scheme words, format, what each Linear became and the tolerance
    each scheme's export is held to (its Scheme.tolerance)."""
    from specpress.models.quantized.scheme import scheme_of_module

    mods = [m for m in drafter.modules() if getattr(m, "is_quantized", False)]
    if not mods:
        return None
    tolerances = {m.scheme: scheme_of_module(m).tolerance for m in mods}
    return {"schemes": sorted(tolerances), "format": o.quant_format, "accuracy_level": o.accuracy_level,
            "linears": list(notes), "tolerances": dict(sorted(tolerances.items()))}


def export_from_dirs(drafter_dir: str | Path, target_dir: str | Path | None, out: str | Path,
                     options: ExportOptions = ExportOptions(),
                     progress: Callable[[str], None] = lambda s: None,
                     warn: Callable[[str], None] | None = None, *, target_dtype: str = "auto",
                     target: Any = None, bar: bool = False) -> ExportReport:
    """Load the drafter artifact attached to its target and export it (see export_onnx). The target is
    `target` when given (a loaded TargetModel: `run` / `bench` export with the one they hold), else loaded
    from `target_dir` in `target_dtype`. A drafter built for another target of the same shape loads with a
    warning (`warn`, default stderr), as `run` says."""
    from specpress.models.target import load_target
    from specpress.models.drafter_io import load_drafter_for

    require_onnxruntime()
    if target is None:
        progress(f"loading target {target_dir} ({target_dtype})")
        target = load_target(target_dir, dtype=target_dtype, device="cpu")  # type: ignore[arg-type]
    progress(f"loading drafter {drafter_dir}")
    drafter = load_drafter_for(target, drafter_dir, warn=warn or (lambda m: print(m, file=sys.stderr)),
                               device="cpu").eval()
    return export_onnx(drafter, out, options, progress, target=target, bar=bar)
