"""The hand-built ONNX graphs of export/families/ against torch.onnx.export(dynamo=True) of the same torch
module, in one run (issue 36: should each network be generated from torch instead of written twice?).

Cases: `lm` - the target's forward (the lm family's graph and `export target`'s, export/families/lm.py
causal_lm) on --target; `eagle3` - an EAGLE-3 drafter's `step` graph (fed-back g) on --drafter, when given.
Both graphs are built in the standard attention form (ONNX Attention, opset 23) at --dtype, with the same
input and output names, so one feed runs both. The dynamo export runs the torch module itself through a
cache that concatenates the past inputs and the new K/V (what the graphs' present outputs hold).

Reported per case and graph: nodes as written and after onnxruntime's optimization (ops named where they
differ), the largest |onnx - torch| over three shapes (decode T=1 and verify T=16 over 256 past tokens,
prefill T=64), onnxruntime's median ms per call over --reps interleaved calls (1 thread) and its ratio to
the hand-built graph, export seconds, initializers transposed inside the graph (onnxruntime folds a
transposed copy of each at load), and, with --trt, whether TensorRT for RTX parses and builds it.

    python bench/onnx_dynamo.py --target ~/.cache/specpress/zoo/small --drafter DRAFTER_DIR \\
        [--dtype fp32|fp16] [--reps 60] [--trt] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

SHAPES = ((1, 256), (16, 256), (64, 0))  # (new tokens T, past P)


class PastCache:
    """The KVCache interface over graph inputs: write() returns concat(past, new), kept as the presents."""

    def __init__(self, pasts: tuple[torch.Tensor, ...]) -> None:
        self.pasts, self.presents, self.length = pasts, [], pasts[0].shape[2]

    def reserve(self, t: int) -> int:
        return self.length

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pk, pv = torch.cat([self.pasts[2 * layer], k], 2), torch.cat([self.pasts[2 * layer + 1], v], 2)
        self.presents += [pk, pv]
        return pk, pv


class LMStep(nn.Module):
    inputs = ("ids", "positions", "mask")
    outputs = ("logits",)

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids, positions, mask, *pasts):  # noqa: ANN001, ANN201 - traced by torch.export
        cache = PastCache(pasts)
        return (self.model(ids, cache=cache, positions=positions, mask=mask).logits, *cache.presents)


class FeatureStep(nn.Module):
    inputs = ("hidden", "ids", "positions", "mask")
    outputs = ("logits", "hidden_out")

    def __init__(self, drafter: nn.Module) -> None:
        super().__init__()
        self.drafter = drafter

    def forward(self, hidden, ids, positions, mask, *pasts):  # noqa: ANN001, ANN201
        cache = PastCache(pasts)
        logits, g = self.drafter(hidden, ids, cache=cache, positions=positions, mask=mask)
        return (logits, g, *cache.presents)


def hand_built(module: nn.Module, graph: str, dtype: str, path: Path) -> float:
    import onnx

    from specpress.export.context import Ctx
    from specpress.export.families import export_family
    from specpress.export.graph import Graph

    t0 = time.perf_counter()
    family = getattr(module, "family", "lm")
    ctx = export_family(family).build(module, lambda name: Ctx(Graph(name, 23, dtype), "standard"))[graph]
    onnx.save(ctx.g.model(), str(path))
    return time.perf_counter() - t0


def dynamo(step: nn.Module, example: tuple[torch.Tensor, ...], layers: int, path: Path) -> float:
    dim = torch.export.Dim
    tokens, past, total = dim("tokens", min=1, max=512), dim("past", min=1, max=1024), dim("total", min=2, max=1536)
    first = {"ids": {1: tokens}, "positions": {1: tokens}, "mask": {0: tokens, 1: total}, "hidden": {1: tokens}}
    shapes = {name: first[name] for name in step.inputs} | {"pasts": tuple([{2: past}] * (2 * layers))}
    kv = [f"{kind}.{i}" for i in range(layers) for kind in ("key", "value")]
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(step, example, dynamo=True, dynamic_shapes=shapes, opset_version=23,
                                    input_names=[*step.inputs, *(f"past_{n}" for n in kv)],
                                    output_names=[*step.outputs, *(f"present_{n}" for n in kv)],
                                    optimize=True, verbose=False)
    program.save(str(path))
    return time.perf_counter() - t0


def example(step: nn.Module, t: int, p: int, width: int, vocab: int, kv: tuple[int, int, int], dtype: torch.dtype,
            seed: int) -> tuple[torch.Tensor, ...]:
    from specpress.models.layers import causal_mask

    gen = torch.Generator().manual_seed(seed)
    layers, heads, dim = kv
    first = {"ids": torch.randint(0, vocab, (1, t), generator=gen), "positions": torch.arange(p, p + t)[None],
             "mask": causal_mask(t, p), "hidden": torch.randn(1, t, width, generator=gen).to(dtype)}
    pasts = [torch.randn(1, heads, p, dim, generator=gen).to(dtype) for _ in range(2 * layers)]
    return (*(first[name] for name in step.inputs), *pasts)


def structure(path: Path, ort: Any) -> dict[str, Any]:
    import onnx

    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        opts.log_severity_level = 3
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        optimized = onnx.load(opts.optimized_model_filepath)
    return {"nodes": len(model.graph.node), "nodes_optimized": len(optimized.graph.node),
            "ops_optimized": dict(collections.Counter(n.op_type for n in optimized.graph.node)),
            "transposed_initializers": sorted(n.input[0] for n in model.graph.node
                                              if n.op_type == "Transpose" and n.input[0] in inits)}


def trt_builds(path: Path) -> str:
    from specpress.export.trt.builder import BuildOptions, build_graph
    from specpress.runtime.backends.tensorrt.library import TensorRTUnavailable, load_tensorrt

    try:
        lib = load_tensorrt("tensorrt_rtx")
    except TensorRTUnavailable as exc:
        return f"not run: {exc}"
    try:
        _, entry = build_graph(lib, path, BuildOptions(flavour="tensorrt_rtx"), echo=lambda _m: None)
    except Exception as exc:  # noqa: BLE001 - the build's own error is the finding
        text = str(exc)
        if "not supported by a dedicated kernel" in text:
            return "failed: no dedicated TensorRT kernel for this Attention (its dtype or shape)"
        return f"failed: {text[:160]}"
    return f"built ({entry['layers']} layers)"


def compare(name: str, module: nn.Module, step: nn.Module, graph: str, width: int, vocab: int,
            kv: tuple[int, int, int], args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import onnxruntime as ort

    tdtype = {"fp32": torch.float32, "fp16": torch.float16}[args.dtype]
    paths = {"hand": tmp / f"{name}-hand.onnx", "dynamo": tmp / f"{name}-dynamo.onnx"}
    seconds = {"hand": hand_built(module, graph, args.dtype, paths["hand"]),
               "dynamo": dynamo(step, example(step, 5, 7, width, vocab, kv, tdtype, 0), kv[0], paths["dynamo"])}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = 1, 3
    sessions = {k: ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"]) for k, p in paths.items()}
    rows: dict[str, Any] = {k: {"export_s": round(seconds[k], 2), **structure(p, ort), "error": 0.0, "ms": {}}
                            for k, p in paths.items()}
    for t, p in SHAPES:
        inputs = example(step, t, p, width, vocab, kv, tdtype, t + p)
        with torch.no_grad():
            want = [w.double().numpy() for w in step(*inputs)]
        names = [*step.inputs, *(f"past_{n}.{i}" for i in range(kv[0]) for n in ("key", "value"))]
        feeds = {n: x.numpy() for n, x in zip(names, inputs)}
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for k, s in sessions.items():  # one warm call each, and the parity check
            got = s.run(None, feeds)
            rows[k]["error"] = max(rows[k]["error"], *(float(np.abs(g.astype(np.float64) - w).max())
                                                       for g, w in zip(got, want)))
        for _ in range(args.reps):
            for k, s in sessions.items():
                t0 = time.perf_counter()
                s.run(None, feeds)
                times[k].append(time.perf_counter() - t0)
        for k in sessions:
            rows[k]["ms"][f"T={t},P={p}"] = round(1e3 * statistics.median(times[k]), 3)
    for k, p in paths.items():
        rows[k]["trt_rtx"] = trt_builds(p) if args.trt else "not run (--trt)"
    rows["dynamo_over_hand"] = {shape: round(rows["dynamo"]["ms"][shape] / rows["hand"]["ms"][shape], 3)
                                for shape in rows["hand"]["ms"]}
    return rows


def report(name: str, rows: dict[str, Any]) -> None:
    print(f"\n{name}")
    hand, dyn = rows["hand"]["ops_optimized"], rows["dynamo"]["ops_optimized"]
    for k in ("hand", "dynamo"):
        r = rows[k]
        print(f"  {k:7s} nodes {r['nodes']} -> {r['nodes_optimized']} after onnxruntime; max|onnx - torch| "
              f"{r['error']:.2e}; export {r['export_s']} s; ms {r['ms']}; transposed initializers "
              f"{r['transposed_initializers'] or 'none'}; TensorRT for RTX: {r['trt_rtx']}")
    print("  ops after onnxruntime, where they differ: "
          + ", ".join(f"{op} {hand.get(op, 0)} vs {dyn.get(op, 0)}" for op in sorted(set(hand) | set(dyn))
                      if hand.get(op, 0) != dyn.get(op, 0)))
    print(f"  dynamo / hand-built median ms: {rows['dynamo_over_hand']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--drafter", type=Path, default=None, help="an EAGLE-3 drafter artifact (its step graph)")
    ap.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--trt", action="store_true", help="also parse and build each graph with TensorRT for RTX")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)

    from specpress.models.drafter_io import load_drafter
    from specpress.models.target import load_target

    tdtype = {"fp32": torch.float32, "fp16": torch.float16}[args.dtype]
    target = load_target(args.target, dtype=tdtype).eval()
    cfg = target.config
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["lm"] = compare("lm", target, LMStep(target).eval(), "lm", cfg.hidden_size, cfg.vocab_size,
                                (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim), args, Path(tmp))
        report(f"lm: the target's forward ({args.target}, {args.dtype})", results["lm"])
        if args.drafter is not None:
            d = load_drafter(args.drafter, target).to(tdtype).eval()
            dc = d.config
            results["eagle3"] = compare("eagle3", d, FeatureStep(d).eval(), "step", dc.hidden_size, dc.vocab_size,
                                        (1, dc.num_key_value_heads, dc.head_dim), args, Path(tmp))
            report(f"eagle3 step ({args.drafter}, {args.dtype})", results["eagle3"])
    if args.json:
        args.json.write_text(json.dumps({"dtype": args.dtype, "reps": args.reps, **results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
