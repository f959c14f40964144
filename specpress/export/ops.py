"""Tree attention in ONNX, two forms with one math (`specpress.models.layers.attention`).

Both take q [B, Hq, T, D] after RoPE and the new k/v [B, Hkv, T, D] plus the past k/v [B, Hkv, P, D],
and return (out [B, Hq, T, D], present_k, present_v [B, Hkv, P+T, D]); GQA: head h reads kv head
h // (Hq / Hkv); scale 1/sqrt(D) as torch's SDPA.

- `standard`: past and new k/v concatenated (the presents), then one ONNX `Attention` node (opset 23)
  over them with a boolean mask [T, P+T] (True = may attend) and its one output (TensorRT's parser takes
  no Attention with past inputs / present outputs).
- `plugin`: past and new k/v are concatenated outside the node, then one `specpress::TreeAttention`
  node (the contract TensorRT's plugin is built against; /DESIGN.md § Export):
      inputs  q [B,Hq,T,D], k [B,Hkv,S,D], v [B,Hkv,S,D], committed int32 [1],
              tree_mask int32 [T, ceil((S - committed)/32)]: bit j (LSB first) of word w of row t set
              <=> query t may attend slot committed + 32*w + j; every query sees slots [0, committed)
      attrs   num_heads, num_kv_heads, head_size, scale, plugin_version "1", plugin_namespace "specpress"
      output  out [B,Hq,T,D] = softmax(q k^T * scale + bias) v, bias 0 where visible, -inf elsewhere
  The model also carries a model-local function `specpress.TreeAttention` computing the same with
  standard ops at the model's opset, so plain onnxruntime runs the file TensorRT parses.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from specpress.export.graph import Graph

ATTENTION_FORMS = ("standard", "plugin")
PLUGIN_DOMAIN = "specpress"
PLUGIN_OP = "TreeAttention"
PLUGIN_VERSION = "1"
MIN_OPSET = {"standard": 23, "plugin": 18}


def attention_standard(g: Graph, q: str, k: str, v: str, past_k: str, past_v: str, mask: str,
                       scale: float) -> tuple[str, str, str]:
    """ONNX Attention (opset 23): mask bool [T, P+T]. Returns (out, present_k, present_v).

    The past is concatenated explicitly and Attention has its one output: the same numbers as its optional
    past / present inputs and outputs, which TensorRT's ONNX parser refuses ("TensorRT only supports
    Attention nodes with one output", TensorRT for RTX 1.7.1)."""
    pk = g.op("Concat", past_k, k, axis=2)
    pv = g.op("Concat", past_v, v, axis=2)
    return g.op("Attention", q, pk, pv, mask, scale=float(scale)), pk, pv


def attention_plugin(g: Graph, q: str, k: str, v: str, past_k: str, past_v: str, committed: str,
                     tree_mask: str, *, num_heads: int, num_kv_heads: int, head_size: int,
                     scale: float) -> tuple[str, str, str]:
    """The specpress::TreeAttention node over concat(past, new) (+ its function, once per model)."""
    kk = g.op("Concat", past_k, k, axis=2)
    vv = g.op("Concat", past_v, v, axis=2)
    g.use_domain(PLUGIN_DOMAIN, 1)
    if (PLUGIN_DOMAIN, PLUGIN_OP) not in g.functions:
        g.add_function(tree_attention_function(g.opset))
    out = g.op(PLUGIN_OP, q, kk, vv, committed, tree_mask, domain=PLUGIN_DOMAIN, num_heads=num_heads,
               num_kv_heads=num_kv_heads, head_size=head_size, scale=float(scale),
               plugin_version=PLUGIN_VERSION, plugin_namespace=PLUGIN_DOMAIN)
    return out, kk, vv


def default_scale(head_size: int) -> float:
    return 1.0 / math.sqrt(head_size)


class _Body:
    """Nodes of a function body with fresh value names and Constant nodes for constants."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.n = 0

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        self.n += 1
        out = f"t{self.n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, value, dtype=np.int64) -> str:
        self.n += 1
        out = f"c{self.n}"
        self.nodes.append(helper.make_node("Constant", [], [out],
                                           value=numpy_helper.from_array(np.asarray(value, dtype=dtype))))
        return out


def tree_attention_function(opset: int) -> onnx.FunctionProto:
    """specpress.TreeAttention as standard ops at `opset` (the model's default-domain version)."""
    b = _Body()
    b.n += 1
    scale = f"c{b.n}"
    ref = AttributeProto(name="value_float", type=AttributeProto.FLOAT, ref_attr_name="scale")  # the node's scale
    b.nodes.append(helper.make_node("Constant", [], [scale]))
    b.nodes[-1].attribute.append(ref)
    qs, ks = b.op("Shape", "q"), b.op("Shape", "k")

    def dim(shape: str, i: int) -> str:
        return b.op("Slice", shape, b.const([i]), b.const([i + 1]))

    bsz, hq, t, d = (dim(qs, i) for i in range(4))
    hkv, s = dim(ks, 1), dim(ks, 2)
    rep = b.op("Div", hq, hkv)
    q5 = b.op("Reshape", "q", b.op("Concat", bsz, hkv, rep, t, d, axis=0))  # [B, Hkv, rep, T, D]
    k5 = b.op("Unsqueeze", "k", b.const([2]))  # [B, Hkv, 1, S, D]
    v5 = b.op("Unsqueeze", "v", b.const([2]))
    scores = b.op("MatMul", q5, b.op("Transpose", k5, perm=[0, 1, 2, 4, 3]))  # [B, Hkv, rep, T, S]
    scores = b.op("Mul", b.op("Cast", scores, to=TensorProto.FLOAT), scale)
    # visibility [T, S]: slot j < committed, or bit (j - committed) of the packed row
    rel = b.op("Sub", b.op("Range", b.const(0), b.op("Squeeze", s, b.const([0])), b.const(1)),
               b.op("Cast", "committed", to=TensorProto.INT64))  # [S]
    committed = b.op("Less", rel, b.const(0))
    relc = b.op("Max", rel, b.const(0))
    words = b.op("Mod", b.op("Cast", "tree_mask", to=TensorProto.INT64), b.const(1 << 32))  # unsigned words
    tdim = b.op("Slice", b.op("Shape", "tree_mask"), b.const([0]), b.const([1]))
    pad = b.op("ConstantOfShape", b.op("Concat", tdim, b.const([1]), axis=0),
               value=numpy_helper.from_array(np.zeros(1, np.int64)))
    words = b.op("Concat", words, pad, axis=1)  # [T, W+1]: index W is the zero word (all-committed case)
    word = b.op("Div", relc, b.const(32))
    bits = b.op("Gather", words, word, axis=1)  # [T, S]
    pow2 = b.op("Gather", b.const([1 << i for i in range(32)]), b.op("Mod", relc, b.const(32)))
    bit = b.op("Mod", b.op("Div", bits, pow2), b.const(2))
    visible = b.op("Or", committed, b.op("Equal", bit, b.const(1)))
    bias = b.op("Where", visible, b.const(0.0, np.float32), b.const(-np.inf, np.float32))
    probs = b.op("Softmax", b.op("Add", scores, bias), axis=-1)
    out = b.op("MatMul", b.op("CastLike", probs, "v"), v5)  # [B, Hkv, rep, T, D]
    b.nodes.append(helper.make_node("Reshape", [out, qs], ["out"]))
    return helper.make_function(
        PLUGIN_DOMAIN, PLUGIN_OP, ["q", "k", "v", "committed", "tree_mask"], ["out"], b.nodes,
        [helper.make_opsetid("", opset)],
        attributes=["num_heads", "num_kv_heads", "head_size", "scale", "plugin_version", "plugin_namespace"])
