"""The probe graph (one contract §3 TreeAttention node + its model-local function) and the plugin's fields."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specpress.runtime.backends.tensorrt.kernel import tree_attention
from specpress.runtime.backends.tensorrt.plugin import FIELDS, TreeAttentionFields
from specpress.export.trt.probe import probe_model
from specpress.runtime.tree import DraftTree

CONTRACT_ATTRIBUTES = ["num_heads", "num_kv_heads", "head_size", "scale", "plugin_version", "plugin_namespace"]


def test_plugin_fields_are_the_node_attributes():
    node = probe_model().graph.node[0]
    assert (node.op_type, node.domain) == ("TreeAttention", "specpress")
    assert [n for n, _ in FIELDS] == CONTRACT_ATTRIBUTES
    assert sorted(CONTRACT_ATTRIBUTES) == sorted(a.name for a in node.attribute)  # ONNX attribute order is free
    assert list(node.input) == ["q", "k", "v", "committed", "tree_mask"]


def test_fields_validate():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        TreeAttentionFields(num_heads=6, num_kv_heads=4, head_size=64, scale=0.125)


def test_local_function_runs_in_onnxruntime_and_matches_the_kernel():
    """Plain onnxruntime runs the file TensorRT parses, and its function computes the plugin's math."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    model = probe_model(num_heads=4, num_kv_heads=2, head_size=16, dtype="float32")
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    tree = DraftTree(parents=(-1, 0, 0, 1, 1, 2) + tuple(range(5, 40)))  # 41 nodes: two mask words
    committed, t = 11, tree.size
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, t, 16, generator=g)
    k, v = torch.randn(2, 1, 2, committed + t, 16, generator=g)
    c, words = torch.tensor([committed], dtype=torch.int32), tree.packed_mask()
    (out,) = sess.run(None, {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "committed": c.numpy(),
                             "tree_mask": words.numpy()})
    ref = tree_attention(q, k, v, c, words, 16 ** -0.5).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
