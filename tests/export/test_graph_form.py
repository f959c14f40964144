"""The form of the hand-built graphs, as onnxruntime runs them: an RMSNorm is the pattern onnxruntime fuses into
one kernel, and a graph output is the value its node computes, not an Identity copy of it (both measured in
BENCHMARKS.md, "Hand-built graphs against torch.onnx")."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto

ort = pytest.importorskip("onnxruntime")

from specpress.export.blocks import rms_norm  # noqa: E402
from specpress.export.context import Ctx  # noqa: E402
from specpress.export.families import build_graphs  # noqa: E402
from specpress.export.graph import Graph  # noqa: E402
from specpress.models.layers import RMSNorm  # noqa: E402

CASES = ["eagle", "eagle3", "mtp", "dflash", "dflash_markov", "lm"]


def optimized_ops(model: onnx.ModelProto, tmp_path) -> collections.Counter:
    path, out = tmp_path / "g.onnx", tmp_path / "g.opt.onnx"
    onnx.save(model, str(path))
    opts = ort.SessionOptions()
    opts.optimized_model_filepath, opts.log_severity_level = str(out), 3
    ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(str(out)).graph.node)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_an_rms_norm_is_one_onnxruntime_kernel_and_computes_as_torch(dtype, tmp_path):
    torch.manual_seed(0)
    norm = RMSNorm(48, 1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    g = Graph("norm", 23, dtype)
    x = g.input("x", g.ft, [1, "T", 48])
    g.output("y", rms_norm(Ctx(g, "standard"), x, norm, "norm"), g.ft, [1, "T", 48])
    model = g.model()
    ops = optimized_ops(model, tmp_path)
    assert ops["SimplifiedLayerNormalization"] == 1 and not ops["ReduceMean"] and not ops["Sqrt"], ops

    tdtype = {"fp32": torch.float32, "fp16": torch.float16}[dtype]
    xs = (3 * torch.randn(1, 7, 48)).to(tdtype)
    with torch.no_grad():
        want = norm.to(tdtype)(xs).double().numpy()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": xs.numpy()})[0].astype(np.float64)
    assert np.abs(got - want).max() <= (1e-5 if dtype == "fp32" else 4e-3)


def test_an_output_is_the_value_its_node_computes_and_an_identity_only_where_it_must_be(tmp_path):
    g = Graph("outs", 23)
    F = TensorProto.FLOAT
    x = g.input("x", F, ["N"])
    y = g.op("Relu", x)
    z = g.op("Neg", y)  # a consumer of y: it must read the renamed value
    w = g.init(np.arange(3, dtype=np.float32), "w")
    twice = g.op("Abs", x)
    for name, value in (("y", y), ("z", z), ("w", w), ("x_out", x), ("a", twice), ("b", twice)):
        g.output(name, value, F, ["N"] if value != w else [3])
    model = g.model()
    onnx.checker.check_model(model)
    identities = sorted(n.output[0] for n in model.graph.node if n.op_type == "Identity")
    assert identities == ["a", "b", "w", "x_out"]  # an initializer, an input, a value exposed twice
    producers = {n.output[0]: n.op_type for n in model.graph.node}
    assert producers["y"] == "Relu" and producers["z"] == "Neg"
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xs = np.array([-1.0, 2.0, -3.0], dtype=np.float32)
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": xs})))
    np.testing.assert_array_equal(out["y"], np.maximum(xs, 0))
    np.testing.assert_array_equal(out["z"], -np.maximum(xs, 0))
    np.testing.assert_array_equal(out["w"], np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(out["x_out"], xs)
    np.testing.assert_array_equal(out["a"], np.abs(xs))
    np.testing.assert_array_equal(out["b"], np.abs(xs))


@pytest.mark.parametrize("name", CASES)
def test_no_family_graph_copies_its_outputs_or_runs_a_norm_as_seven_nodes(name, target, tmp_path):
    from conftest import make_drafter

    d = make_drafter(name, target)
    ctxs, _ = build_graphs(d, lambda graph: Ctx(Graph(graph, 23), "standard"))
    for graph, c in ctxs.items():
        model = c.g.model()
        assert not [n for n in model.graph.node if n.op_type == "Identity"], f"{name} {graph}"
        ops = optimized_ops(model, tmp_path)
        assert not ops["ReduceMean"], f"{name} {graph}: a norm onnxruntime did not fuse ({ops})"

