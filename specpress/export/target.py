"""`export target`: a target model -> one ONNX graph of its forward + target_manifest.json, validated.

    export_target(target, out, TargetExportOptions(...)) -> TargetExportReport

The graph is the forward the speculative loop calls (`TargetRunner.forward`): ids, positions, a boolean
mask over [cache ; new tokens] and the past K/V of every layer in; logits, the final normed hidden state,
every hidden-state tap (`hidden_states.{i}`, the residual entering layer i) and the present K/V out. So
one export serves plain decoding, prefill and tree verification, and any drafter's taps. The onnxruntime
backend's `OnnxTarget` runs it with a `models.kv.KVCache`, so the loop crops and compacts the target's
cache as with torch. The weights go to one external-data file beside the graph (a real target is over
ONNX's 2 GB protobuf limit).

Validation, before anything is written: onnxruntime against the torch target on random inputs (a random
past cache, a random tree mask), every output; then greedy decoding of a few prompts through `OnnxTarget`
against the torch target, token for token, a differing token allowed only at a near tie of the torch
logits. The directory appears atomically, and only when both pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import onnx
import torch
from torch import Tensor

from specpress import __version__
from specpress.artifacts import atomic_dir
from specpress.errors import UsageError
from specpress.export.blocks import Ctx
from specpress.export.families import causal_lm
from specpress.export.graph import Graph
from specpress.export.onnx import DTYPES, require_onnxruntime, session_options, tensor_specs
from specpress.export.rounds import NEAR_TIE_REL, round_prompts
from specpress.export.validate import TOLERANCE, ExportValidationError, check, compare, random_tree_mask
from specpress.manifest import TargetExportManifest, file_records
from specpress.models.drafter import target_fingerprint

GRAPH_FILE, DATA_FILE = "target.onnx", "target.onnx.data"
DECODE_PROMPTS, DECODE_TOKENS = 3, 24
OPSET = 23  # the standard form's ONNX Attention


@dataclass(frozen=True)
class TargetExportOptions:
    dtype: str = "fp32"  # "fp32" | "fp16"
    force: bool = False  # replace an existing output directory

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype {self.dtype!r}: choose one of {', '.join(DTYPES)} (onnxruntime's CPU kernels "
                             f"have no bf16 MatMul/Attention, so a bf16 export could not be validated here)")


@dataclass
class TargetExportReport:
    out: Path
    bytes: int  # graph + external data
    errors: dict[str, dict[str, float]]  # output -> {max_abs, max_rel} on random inputs
    tolerance: float
    decode: dict[str, Any]  # prompts, tokens, agree, near_ties, differ
    seconds: float


def target_graph(target: Any, dtype: str) -> Graph:
    """The forward of `target` (a TargetModel) as one graph in the standard attention form."""
    cfg = target.config
    c = Ctx(Graph("target", OPSET, dtype), "standard")
    g = c.g
    hidden, logits, presents, layer_inputs = causal_lm(c, target)
    g.output("logits", logits, g.ft, [1, "tokens", cfg.vocab_size])
    g.output("hidden", hidden, g.ft, [1, "tokens", cfg.hidden_size])
    for i, x in enumerate(layer_inputs):
        g.output(f"hidden_states.{i}", x, g.ft, [1, "tokens", cfg.hidden_size])
    for i, (pk, pv) in enumerate(presents):
        g.output(f"present_key.{i}", pk, g.ft, [1, cfg.num_key_value_heads, "total", cfg.head_dim])
        g.output(f"present_value.{i}", pv, g.ft, [1, cfg.num_key_value_heads, "total", cfg.head_dim])
    return g


def random_case(target: Any, seed: int = 0, past: int = 5, new: int = 6) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(feeds, torch outputs) of one call: a random past cache of `past` slots, `new` tokens under a random
    tree mask; the reference is the torch target's forward on the same cache."""
    cfg = target.config
    gen = torch.Generator().manual_seed(seed)
    dt = target.lm_head.weight.dtype
    cache = target.new_cache(past + new)
    cache.k[:, :, :, :past] = torch.randn(cache.k[:, :, :, :past].shape, generator=gen).to(dt)
    cache.v[:, :, :, :past] = torch.randn(cache.v[:, :, :, :past].shape, generator=gen).to(dt)
    cache.length = past
    feeds: dict[str, Tensor] = {f"past_{kv}.{i}": getattr(cache, kv[0])[i, :, :, :past].clone()
                                for i in range(cfg.num_hidden_layers) for kv in ("key", "value")}
    ids = torch.randint(0, cfg.vocab_size, (1, new), generator=gen)
    positions = past + torch.randint(0, new, (new,), generator=gen).sort().values
    mask = random_tree_mask(gen, new, past, new, full=False)
    feeds.update(ids=ids, positions=positions[None], mask=mask)
    layers = cfg.num_hidden_layers
    with torch.inference_mode():
        out = target(ids, cache=cache, positions=positions, mask=mask, taps=range(layers))
    want = {"logits": out.logits, "hidden": out.hidden, **{f"hidden_states.{i}": out.taps[i] for i in range(layers)}}
    for i in range(layers):
        want[f"present_key.{i}"], want[f"present_value.{i}"] = cache.k[i, :, :, :past + new], cache.v[i, :, :, :past + new]
    return feeds, want


def decode_agreement(target: Any, onnx_target: Any, tolerance: float) -> dict[str, Any]:
    """Greedy decoding of DECODE_PROMPTS prompts through `onnx_target` (an OnnxTarget) and the torch target.
    A prompt whose tokens differ is a near tie when, at the first differing token, the torch logits of the
    two choices are within max(NEAR_TIE_REL, `tolerance`) of the row's largest |logit|; otherwise it differs."""
    from specpress.runtime.backends.torch.runner import TorchTarget
    from specpress.runtime.plain import decode_plain

    agree = near = differ = 0
    for p in round_prompts(target, DECODE_PROMPTS):
        a = decode_plain(TorchTarget(target), p, DECODE_TOKENS, eos_ids=()).tokens
        b = decode_plain(onnx_target, p, DECODE_TOKENS, eos_ids=()).tokens
        if a == b:
            agree += 1
            continue
        k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        with torch.inference_mode():
            row = target(torch.tensor([p + a[:k]]), logits="last").logits[0, -1].float()
        gap = float(row[a[k]] - row[b[k]])
        if gap <= max(NEAR_TIE_REL, tolerance) * float(row.abs().max()):
            near += 1
        else:
            differ += 1
    return {"prompts": DECODE_PROMPTS, "tokens": DECODE_TOKENS, "agree": agree, "near_ties": near, "differ": differ}


def export_target(target: Any, out: str | Path, options: TargetExportOptions = TargetExportOptions(),
                  progress: Callable[[str], None] = lambda s: None) -> TargetExportReport:
    """Export `target` (a TargetModel, fp32) to `out`; see the module docstring."""
    from specpress.runtime.backends.onnxruntime.runner import load_target_runner

    ort = require_onnxruntime()
    t0 = time.perf_counter()
    o = options
    ref = target if o.dtype == "fp32" else _copy_as(target, torch.float16)
    progress(f"building the target graph ({target.config.num_hidden_layers} layers, opset {OPSET}, {o.dtype})")
    model = target_graph(ref, o.dtype).model()
    tol = TOLERANCE[o.dtype]
    with atomic_dir(out, force=o.force) as tmp:
        path = tmp / GRAPH_FILE
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=DATA_FILE,
                  size_threshold=1024)
        onnx.checker.check_model(str(path))
        size = path.stat().st_size + (tmp / DATA_FILE).stat().st_size
        progress(f"validating on random inputs ({size:,} bytes)")
        sess = ort.InferenceSession(str(path), session_options(ort), providers=["CPUExecutionProvider"])
        names = [x.name for x in sess.get_outputs()]
        feeds, want = random_case(ref)
        errors = compare(lambda f: dict(zip(names, sess.run(None, f))), feeds, want)
        check({"target": errors}, tol)
        del sess
        cfg = target.config
        manifest = TargetExportManifest(
            opset=OPSET, dtype=o.dtype, file=GRAPH_FILE, data_file=DATA_FILE, bytes=size,
            inputs=tensor_specs(model.graph.input), outputs=tensor_specs(model.graph.output),
            layers=cfg.num_hidden_layers, kv_heads=int(cfg.num_key_value_heads), head_dim=int(cfg.head_dim),
            config=cfg.to_hf(), target=target_fingerprint(cfg, target), validation=errors, validation_decode={},
            specpress_version=__version__, files=file_records(tmp, [GRAPH_FILE, DATA_FILE]))
        manifest.save(tmp)
        progress(f"validating greedy decoding through onnxruntime ({DECODE_PROMPTS} prompts x {DECODE_TOKENS} tokens)")
        decode = decode_agreement(ref, load_target_runner(tmp), tol)
        if decode["differ"]:
            raise ExportValidationError(
                f"greedy decoding through onnxruntime differs from the torch target beyond a near tie in "
                f"{decode['differ']} of {decode['prompts']} prompts; nothing was written. This is a bug in the "
                f"exporter for this target: please report it with its config.json")
        TargetExportManifest(**{**manifest.__dict__, "validation_decode": decode}).save(tmp)
    return TargetExportReport(Path(out), size, errors, tol, decode, time.perf_counter() - t0)


def _copy_as(target: Any, dtype: torch.dtype) -> Any:
    import copy

    return copy.deepcopy(target).to(dtype)


def export_target_from_dir(target_dir: str | Path, out: str | Path,
                           options: TargetExportOptions = TargetExportOptions(),
                           progress: Callable[[str], None] = lambda s: None) -> TargetExportReport:
    """Load the target directory (HF format) in fp32 and export it (see export_target)."""
    from specpress.models.target import load_target

    require_onnxruntime()
    progress(f"loading target {target_dir}")
    return export_target(load_target(target_dir, device="cpu"), out, options, progress)
