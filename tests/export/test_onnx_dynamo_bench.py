"""bench/onnx_dynamo.py, which BENCHMARKS.md quotes for keeping the graphs hand-built, still runs: the same torch
module traced by torch.onnx's dynamo exporter and built by export/families/ computes the same in onnxruntime,
and the hand-built graph is no larger than the traced one (4 nodes of slack) once onnxruntime has optimized both
(before the norms were written in the form onnxruntime fuses, it was 417 nodes against 348 on this tiny target)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "onnx_dynamo.py"


def bench_module():
    spec = importlib.util.spec_from_file_location("onnx_dynamo_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("case", ["lm", "eagle3"])
def test_the_traced_and_the_hand_built_graph_compute_the_same(case, target, tmp_path):
    from conftest import make_drafter

    bench = bench_module()
    args = argparse.Namespace(dtype="fp32", reps=1, trt=False)
    cfg = target.config
    if case == "lm":
        rows = bench.compare("lm", target, bench.LMStep(target).eval(), "lm", cfg.hidden_size, cfg.vocab_size,
                             (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim), args, tmp_path)
    else:
        d = make_drafter("eagle3", target).eval()
        dc = d.config
        rows = bench.compare("eagle3", d, bench.FeatureStep(d).eval(), "step", dc.hidden_size, dc.vocab_size,
                             (1, dc.num_key_value_heads, dc.head_dim), args, tmp_path)
    for side in ("hand", "dynamo"):
        assert rows[side]["error"] < 1e-4, (side, rows[side]["error"])
    assert rows["hand"]["nodes_optimized"] <= rows["dynamo"]["nodes_optimized"] + 4, rows
    assert set(rows["dynamo_over_hand"]) == {f"T={t},P={p}" for t, p in bench.SHAPES}
