"""A one-node `specpress::TreeAttention` ONNX model (contract §3), to check a TensorRT install.

`specpress export trt --probe` and the tests build an engine from it: it is the smallest file that
proves the installed builder maps our node onto our plugin. The model also carries the model-local
function `specpress.TreeAttention` (standard ops), as every plugin-form export does, so plain
onnxruntime runs it and the parser's choice between function and plugin is observable.

Inputs: q [1, Hq, T, D], k/v [1, Hkv, S, D], committed int32 [1], tree_mask int32 [T, W];
T, S and W are dynamic ("tree", "slots", "words").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DOMAIN = "specpress"
OP = "TreeAttention"
OPSET = 21


def _function(num_heads: int, num_kv_heads: int, head_size: int, scale: float, elem: int):
    """The model-local function: the node's math in standard ops TensorRT's parser also imports."""
    from onnx import TensorProto, helper, numpy_helper

    rep = num_heads // num_kv_heads
    pow2 = np.array([1 << b for b in range(32)], dtype=np.int64)

    def const(name: str, arr: np.ndarray):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name))

    n = helper.make_node
    nodes = [
        const("pow2", pow2), const("i0", np.array(0, np.int64)), const("i1", np.array(1, np.int64)),
        const("i32", np.array(32, np.int64)), const("ax2", np.array([2], np.int64)),
        const("two32", np.array(1 << 32, np.int64)), const("i2", np.array(2, np.int64)),
        const("qshape", np.array([0, num_kv_heads, rep, -1, head_size], np.int64)),
        const("oshape", np.array([0, num_heads, -1, head_size], np.int64)),
        const("scale", np.array(scale, dtype=np.float32)),
        const("neg_inf", np.array(-np.inf, np.float32)), const("fzero", np.array(0.0, np.float32)),
        # slot index relative to the committed context: rel [S]
        n("Shape", ["k"], ["kshape"]), n("Gather", ["kshape", "ax2"], ["s1"], axis=0),
        n("Squeeze", ["s1"], ["s"]), n("Range", ["i0", "s", "i1"], ["j"]),
        n("Cast", ["committed"], ["c64"], to=TensorProto.INT64), n("Sub", ["j", "c64"], ["rel"]),
        n("Max", ["rel", "i0"], ["off"]), n("Div", ["off", "i32"], ["widx"]), n("Mod", ["off", "i32"], ["bidx"]),
        # bit b of an int32 word without bitwise ops (TensorRT's parser has none): (u // 2^b) % 2, where
        # u = (word + 2^32) % 2^32 is the word read as unsigned in int64
        n("Gather", ["tree_mask", "widx"], ["words"], axis=1),  # [T, S]
        n("Cast", ["words"], ["w64"], to=TensorProto.INT64), n("Add", ["w64", "two32"], ["wpos"]),
        n("Mod", ["wpos", "two32"], ["u"]), n("Gather", ["pow2", "bidx"], ["bitval"], axis=0),  # [S]
        n("Div", ["u", "bitval"], ["shifted"]), n("Mod", ["shifted", "i2"], ["bit"]),
        n("Equal", ["bit", "i1"], ["isset"]), n("Less", ["rel", "i0"], ["before"]),
        n("Or", ["before", "isset"], ["visible"]),  # [T, S]
        n("Where", ["visible", "fzero", "neg_inf"], ["bias32"]),
        # GQA as a broadcast over a kv-head axis: q [B, Hkv, rep, T, D], k/v [B, Hkv, 1, S, D]
        n("Reshape", ["q", "qshape"], ["q5"]), n("Unsqueeze", ["k", "ax2"], ["k5"]),
        n("Unsqueeze", ["v", "ax2"], ["v5"]), n("Transpose", ["k5"], ["kt5"], perm=[0, 1, 2, 4, 3]),
        n("MatMul", ["q5", "kt5"], ["raw"]), n("Cast", ["raw"], ["raw32"], to=TensorProto.FLOAT),
        n("Mul", ["raw32", "scale"], ["scaled"]), n("Add", ["scaled", "bias32"], ["logits"]),
        n("Softmax", ["logits"], ["p32"], axis=-1), n("Cast", ["p32"], ["p"], to=elem),
        n("MatMul", ["p", "v5"], ["o5"]), n("Reshape", ["o5", "oshape"], ["out"]),
    ]
    return helper.make_function(
        DOMAIN, OP, ["q", "k", "v", "committed", "tree_mask"], ["out"], nodes,
        [helper.make_opsetid("", OPSET)],
        attributes=["num_heads", "num_kv_heads", "head_size", "scale", "plugin_version", "plugin_namespace"])


def probe_model(num_heads: int = 4, num_kv_heads: int = 2, head_size: int = 64, dtype: str = "float16",
                with_function: bool = True):
    """-> onnx.ModelProto: one TreeAttention node with the contract's attributes and inputs."""
    from onnx import TensorProto, helper

    elem = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT,
            "bfloat16": TensorProto.BFLOAT16}[dtype]
    scale = float(head_size) ** -0.5
    inputs = [
        helper.make_tensor_value_info("q", elem, [1, num_heads, "tree", head_size]),
        helper.make_tensor_value_info("k", elem, [1, num_kv_heads, "slots", head_size]),
        helper.make_tensor_value_info("v", elem, [1, num_kv_heads, "slots", head_size]),
        helper.make_tensor_value_info("committed", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("tree_mask", TensorProto.INT32, ["tree", "words"]),
    ]
    out = helper.make_tensor_value_info("out", elem, [1, num_heads, "tree", head_size])
    node = helper.make_node(OP, [i.name for i in inputs], ["out"], name="tree_attention_0", domain=DOMAIN,
                            num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
                            scale=scale, plugin_version="1", plugin_namespace=DOMAIN)
    graph = helper.make_graph([node], "tree_attention_probe", inputs, [out])
    functions = [_function(num_heads, num_kv_heads, head_size, scale, elem)] if with_function else []
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)],
                             functions=functions, ir_version=10, producer_name="specpress")


def save_probe(path: Path, **kw) -> Path:
    """Write `probe_model(**kw)` to `path` (a .onnx file); returns it."""
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(probe_model(**kw), str(path))
    return path
