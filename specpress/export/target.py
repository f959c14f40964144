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
logits. The directory appears atomically, and only when both pass. Every torch output the checks need
(random-input outputs, greedy tokens and the logits along them) is computed before onnxruntime opens the
graph, so a target given as a loader (`export_target_from_dir`) is released first: the peak is one target
in the export's dtype, not two.
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
from specpress.export.context import Ctx
from specpress.export.families.lm import causal_lm
from specpress.export.graph import ExternalData, Graph
from specpress.export.onnx import DTYPES, require_onnxruntime, session_options, tensor_specs
from specpress.export.rounds import NEAR_TIE_REL, round_prompts
from specpress.export.validate import TOLERANCE, ExportValidationError, check, compare, random_tree_mask
from specpress.machine import release_memory
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


def target_graph(target: Any, dtype: str, data: ExternalData | None = None) -> Graph:
    """The forward of `target` (a TargetModel) as one graph in the standard attention form (weights streamed
    into `data` when given)."""
    cfg = target.config
    c = Ctx(Graph("target", OPSET, dtype, data=data), "standard")
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


@dataclass
class _Decoded:
    """Torch's greedy decoding of one prompt, and its logits rows [tokens, V] along it (row i scored token i)."""

    prompt: list[int]
    tokens: list[int]
    rows: Tensor


def torch_decodes(target: Any, n: int = DECODE_PROMPTS, tokens: int = DECODE_TOKENS) -> list[_Decoded]:
    """Greedy decoding of `n` prompts by the torch target, with the logits that chose each token (one
    teacher-forced forward over prompt + tokens), all that decode_agreement needs of the torch target."""
    from specpress.runtime.backends.torch.runner import TorchTarget
    from specpress.runtime.plain import decode_plain

    out = []
    for p in round_prompts(target, n):
        a = decode_plain(TorchTarget(target), p, tokens, eos_ids=()).tokens
        with torch.inference_mode():
            logits = target(torch.tensor([p + a])).logits[0].float()
        out.append(_Decoded(p, a, logits[len(p) - 1:len(p) - 1 + len(a)].clone()))
    return out


def decode_agreement(decoded: list[_Decoded], onnx_target: Any, tolerance: float) -> dict[str, Any]:
    """Greedy decoding of the prompts of `decoded` (torch_decodes) through `onnx_target` (an OnnxTarget). A
    prompt whose tokens differ is a near tie when, at the first differing token, the torch logits of the two
    choices are within max(NEAR_TIE_REL, `tolerance`) of the row's largest |logit|; otherwise it differs."""
    from specpress.runtime.plain import decode_plain

    agree = near = differ = 0
    for d in decoded:
        a, b = d.tokens, decode_plain(onnx_target, d.prompt, len(d.tokens), eos_ids=()).tokens
        if a == b:
            agree += 1
            continue
        k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        row = d.rows[k]
        gap = float(row[a[k]] - row[b[k]])
        if gap <= max(NEAR_TIE_REL, tolerance) * float(row.abs().max()):
            near += 1
        else:
            differ += 1
    return {"prompts": len(decoded), "tokens": DECODE_TOKENS, "agree": agree, "near_ties": near, "differ": differ}


def export_target(target: Any, out: str | Path, options: TargetExportOptions = TargetExportOptions(),
                  progress: Callable[[str], None] = lambda s: None) -> TargetExportReport:
    """Export `target` to `out`; see the module docstring. `target`: a TargetModel (in the export's dtype, or
    copied to it), or a function returning one, which is then released before onnxruntime runs."""
    from torch import nn

    from specpress.runtime.backends.onnxruntime.runner import load_target_runner

    ort = require_onnxruntime()
    t0 = time.perf_counter()
    o = options
    want = {"fp32": torch.float32, "fp16": torch.float16}[o.dtype]
    ref = target if isinstance(target, nn.Module) else target()
    del target
    if ref.lm_head.weight.dtype != want:
        ref = _copy_as(ref, want)
    cfg = ref.config
    fingerprint = target_fingerprint(cfg, ref)
    tol = TOLERANCE[o.dtype]
    with atomic_dir(out, force=o.force) as tmp:
        path = tmp / GRAPH_FILE
        progress(f"building the target graph ({cfg.num_hidden_layers} layers, opset {OPSET}, {o.dtype}), "
                 f"weights streamed to {DATA_FILE}")
        data = ExternalData(tmp / DATA_FILE)
        model = target_graph(ref, o.dtype, data).model()
        data.close()
        onnx.save(model, str(path))
        onnx.checker.check_model(str(path))
        size = path.stat().st_size + (tmp / DATA_FILE).stat().st_size
        progress(f"torch reference outputs (random inputs; greedy decoding of {DECODE_PROMPTS} prompts x "
                 f"{DECODE_TOKENS} tokens)")
        feeds, want_out = random_case(ref)
        decoded = torch_decodes(ref)
        del ref
        release_memory()  # a target this function loaded is released here: onnxruntime maps the weights next
        progress(f"validating on random inputs ({size:,} bytes)")
        sess = ort.InferenceSession(str(path), session_options(ort, prepack=False),
                                    providers=["CPUExecutionProvider"])
        names = [x.name for x in sess.get_outputs()]
        errors = compare(lambda f: dict(zip(names, sess.run(None, f))), feeds, want_out)
        check({"target": errors}, tol)
        del sess
        manifest = TargetExportManifest(
            opset=OPSET, dtype=o.dtype, file=GRAPH_FILE, data_file=DATA_FILE, bytes=size,
            inputs=tensor_specs(model.graph.input), outputs=tensor_specs(model.graph.output),
            layers=cfg.num_hidden_layers, kv_heads=int(cfg.num_key_value_heads), head_dim=int(cfg.head_dim),
            config=cfg.to_hf(), target=fingerprint, validation=errors, validation_decode={},
            specpress_version=__version__, files=file_records(tmp, [GRAPH_FILE, DATA_FILE]))
        manifest.save(tmp)
        progress(f"validating greedy decoding through onnxruntime ({DECODE_PROMPTS} prompts x {DECODE_TOKENS} tokens)")
        decode = decode_agreement(decoded, load_target_runner(tmp, prepack=False), tol)
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
    """Load the target directory (HF format) in the export's dtype and export it (see export_target), the
    torch target released before onnxruntime opens the graph."""
    from specpress.models.target import load_target

    require_onnxruntime()

    def load() -> Any:
        progress(f"loading target {target_dir} ({options.dtype})")
        return load_target(target_dir, dtype=options.dtype, device="cpu")

    return export_target(load, out, options, progress)
