"""Both tree-attention forms against the torch reference (models.layers.attention), through real
onnxruntime sessions, on random q/k/v and random tree masks (GQA, empty and long pasts)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto  # noqa: E402

from specpress.export.graph import Graph  # noqa: E402
from specpress.export.ops import (PLUGIN_DOMAIN, PLUGIN_OP, attention_plugin, attention_standard,  # noqa: E402
                                  default_scale)
from specpress.models.layers import attention  # noqa: E402
from specpress.runtime.backends.exported import plugin_mask  # noqa: E402

HQ, HKV, D = 4, 2, 8


def build(form: str, opset: int = 23):
    g = Graph("attn", opset)
    F = TensorProto.FLOAT
    q = g.input("q", F, [1, HQ, "T", D])
    k, v = g.input("k", F, [1, HKV, "T", D]), g.input("v", F, [1, HKV, "T", D])
    pk, pv = g.input("past_k", F, [1, HKV, "P", D]), g.input("past_v", F, [1, HKV, "P", D])
    if form == "standard":
        mask = g.input("mask", TensorProto.BOOL, ["T", "S"])
        out, ok, ov = attention_standard(g, q, k, v, pk, pv, mask, default_scale(D))
    else:
        c = g.input("committed", TensorProto.INT32, [1])
        tm = g.input("tree_mask", TensorProto.INT32, ["T", "W"])
        out, ok, ov = attention_plugin(g, q, k, v, pk, pv, c, tm, num_heads=HQ, num_kv_heads=HKV, head_size=D,
                                       scale=default_scale(D))
    for name, val, heads in (("out", out, HQ), ("present_k", ok, HKV), ("present_v", ov, HKV)):
        g.output(name, val, F, [1, heads, "T" if name == "out" else "S", D])
    return g.model()


def random_case(p: int, t: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, HQ, t, D, generator=g)
    k, v = torch.randn(1, HKV, t, D, generator=g), torch.randn(1, HKV, t, D, generator=g)
    pk, pv = torch.randn(1, HKV, p, D, generator=g), torch.randn(1, HKV, p, D, generator=g)
    tree = torch.rand(t, t, generator=g) < 0.5
    tree = tree.tril(-1) | torch.eye(t, dtype=torch.bool)  # a random tree-like (ancestor-closed or not) mask
    mask = torch.cat([torch.rand(t, p, generator=g) < 0.9 if seed % 2 else torch.ones(t, p, dtype=torch.bool),
                      tree], dim=1)
    mask[:, 0] = True  # no row sees nothing (softmax of an empty row is NaN in both)
    return q, k, v, pk, pv, mask


@pytest.mark.parametrize("form", ["standard", "plugin"])
@pytest.mark.parametrize("p,t,seed", [(0, 5, 0), (7, 1, 1), (13, 6, 2), (40, 37, 3), (3, 70, 4)])
def test_tree_attention_matches_torch(form, p, t, seed):
    sess = ort.InferenceSession(build(form).SerializeToString(), providers=["CPUExecutionProvider"])
    q, k, v, pk, pv, mask = random_case(p, t, seed)
    feeds = {"q": q, "k": k, "v": v, "past_k": pk, "past_v": pv}
    if form == "standard":
        feeds["mask"] = mask
    else:
        feeds["committed"], feeds["tree_mask"] = plugin_mask(mask)
    out, ok, ov = sess.run(None, {n: x.numpy() for n, x in feeds.items()})
    kk, vv = torch.cat([pk, k], 2), torch.cat([pv, v], 2)
    ref = attention(q, kk, vv, mask[None, None])
    np.testing.assert_allclose(out, ref.numpy(), atol=2e-6, rtol=1e-5)
    np.testing.assert_array_equal(ok, kk.numpy())
    np.testing.assert_array_equal(ov, vv.numpy())


def test_plugin_node_carries_the_contract():
    m = build("plugin")
    import onnx

    onnx.checker.check_model(m, full_check=True)
    node = next(n for n in m.graph.node if n.op_type == PLUGIN_OP)
    attrs = {a.name: a for a in node.attribute}
    assert node.domain == PLUGIN_DOMAIN and list(node.input)[3:] == ["committed", "tree_mask"]
    assert attrs["num_heads"].i == HQ and attrs["num_kv_heads"].i == HKV and attrs["head_size"].i == D
    assert attrs["plugin_version"].s == b"1" and attrs["plugin_namespace"].s == b"specpress"
    assert abs(attrs["scale"].f - D ** -0.5) < 1e-7
    assert {(f.domain, f.name) for f in m.functions} == {(PLUGIN_DOMAIN, PLUGIN_OP)}
    assert {o.domain: o.version for o in m.opset_import}[PLUGIN_DOMAIN] == 1


def test_plugin_mask_packs_lsb_first():
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[0, 5:] = False
    mask[0, 38] = True
    c, words = plugin_mask(mask)
    assert int(c) == 5 and words.shape == (2, 2) and words.dtype == torch.int32
    assert int(words[0, 1]) == 1 << (38 - 5 - 32) and int(words[0, 0]) == 0
    assert int(words[1, 0]) == -1  # all 32 bits set


def test_plugin_mask_keeps_one_word_and_takes_a_given_committed_length():
    mask = torch.ones(3, 10, dtype=torch.bool)
    c, words = plugin_mask(mask)
    assert int(c) == 9 and words.shape == (3, 1) and (words == 1).all()  # never a zero-size word tensor
    c, words = plugin_mask(mask, committed=6)
    assert int(c) == 6 and (words == 0b1111).all()  # DFlash: context committed, block bits all set
