"""Real TensorRT builds on CPU: TensorRT for RTX's own ONNX parser and ahead-of-time engine compiler.

Skipped (with the reason) where `tensorrt_rtx` is not installed; CI installs it (`specpress[trt-rtx]`).
"""

from __future__ import annotations

import json

import pytest

from specpress.export.trt import builder as builder_mod
from specpress.export.trt.builder import BuildOptions, TensorRTBuildError, build_engines, build_graph
from specpress.runtime.backends.tensorrt.library import TensorRTUnavailable, load_tensorrt
from specpress.runtime.backends.tensorrt.plugin import register_tree_attention
from specpress.export.trt.probe import probe_model, save_probe
from specpress.export.trt.profiles import AxisRange, Budget

pytestmark = pytest.mark.trt


@pytest.fixture(scope="module")
def rtx():
    try:
        return load_tensorrt("tensorrt_rtx")
    except TensorRTUnavailable as exc:
        pytest.skip(f"TensorRT for RTX is not installed ({exc})")


def _parse(rtx, model):
    trt = rtx.module
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(model.SerializeToString()), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    return builder, network, parser  # the network dies with its builder: keep them together


def test_parser_builds_a_plugin_layer_with_the_node_attributes(rtx):
    trt = rtx.module
    register_tree_attention(trt)
    _, network, _ = _parse(rtx, probe_model(num_heads=8, num_kv_heads=2, head_size=64))
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    assert [layer.type for layer in layers] == [trt.LayerType.PLUGIN_V3]  # the plugin, not the local function
    layer = layers[0]
    layer.__class__ = trt.IPluginV3Layer
    fields = layer.plugin.fields
    assert (fields.num_heads, fields.num_kv_heads, fields.head_size) == (8, 2, 64)
    assert fields.scale == pytest.approx(0.125)
    assert (fields.plugin_version, fields.plugin_namespace) == ("1", "specpress")


def test_unregistered_plugin_falls_back_to_the_function_and_the_builder_refuses(rtx, tmp_path, monkeypatch):
    """Without the creator the parser imports the model-local function; build_graph must notice."""
    trt = rtx.module
    creator = register_tree_attention(trt)
    registry = trt.get_plugin_registry()
    assert registry.deregister_creator(creator)
    try:
        _, network, _ = _parse(rtx, probe_model())
        kinds = {network.get_layer(i).type for i in range(network.num_layers)}
        assert trt.LayerType.PLUGIN_V3 not in kinds and len(kinds) > 3  # the function's standard ops
        monkeypatch.setattr(builder_mod, "register_tree_attention", lambda _trt: None)
        with pytest.raises(TensorRTBuildError, match="imported the node's model-local function"):
            build_graph(rtx, save_probe(tmp_path / "p.onnx"), BuildOptions(), echo=lambda _m: None)
    finally:
        assert registry.register_creator(creator, "specpress")


def test_build_engines_writes_engines_and_manifest(rtx, tmp_path):
    src = tmp_path / "onnx"
    save_probe(src / "tree_attention.onnx")  # bare graphs, no manifest.json: built as they are
    lines: list[str] = []
    opts = BuildOptions(budget=Budget(max_tree=32, max_context=256), targets=("sm86", "sm120"),
                        axes=(("slots", AxisRange(1, 64, 300)),))
    manifest = build_engines(src, tmp_path / "engines", opts, echo=lines.append)
    out = tmp_path / "engines"
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert not (out / "onnx_manifest.json").exists() and list(manifest["files"]) == ["tree_attention.engine"]
    entry = manifest["engines"]["tree_attention"]
    assert (out / entry["file"]).stat().st_size == entry["bytes"] > 0
    assert entry["plugin_layers"] == 1
    assert manifest["tensorrt"]["flavour"] == "tensorrt_rtx" and manifest["tensorrt"]["version"] == rtx.version
    assert manifest["compute_capabilities"] == ["sm120", "sm86"]
    assert entry["profiles"]["draft"]["q"]["max"] == [1, 4, 32, 64]
    assert entry["profiles"]["draft"]["k"]["max"] == [1, 2, 300, 64]  # the --axis override
    assert entry["profiles"]["prefill"]["tree_mask"]["max"] == [256, 8]
    assert entry["inputs"] == {"q": "half", "k": "half", "v": "half", "committed": "int32", "tree_mask": "int32"}
    assert manifest["files"]["tree_attention.engine"]["bytes"] == entry["bytes"]
    assert manifest["provenance"]["source"] is None
    assert any("plugin layer" in line for line in lines) and any("wrote" in line for line in lines)


def test_unknown_target_and_existing_output(rtx, tmp_path):
    from specpress.errors import RequestError

    save_probe(tmp_path / "onnx" / "p.onnx")
    with pytest.raises(RequestError, match="unknown --target-gpu sm90"):
        build_engines(tmp_path / "onnx", tmp_path / "e", BuildOptions(targets=("sm90",)), echo=lambda _m: None)
    assert not (tmp_path / "e").exists()  # atomic: nothing left behind
    (tmp_path / "e").mkdir()
    with pytest.raises(RequestError, match="already exists"):
        build_engines(tmp_path / "onnx", tmp_path / "e", BuildOptions(), echo=lambda _m: None)


def test_enqueue_feeds_the_kernel_in_the_node_order(rtx, monkeypatch):
    """The plugin's enqueue with TensorRT's buffers stood in by CPU tensors (no device here): inputs in the
    node's order reach kernel.tree_attention with the node's scale, and the result lands in the output."""
    import contextlib

    import torch

    from specpress.runtime.backends.tensorrt import plugin as plugin_mod
    from specpress.runtime.backends.tensorrt.kernel import tree_attention
    from specpress.runtime.backends.tensorrt.plugin import TreeAttentionFields, plugin_classes
    from specpress.runtime.tree import pack_mask

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 4, 3, 64, generator=g), *torch.randn(2, 1, 2, 9, 64, generator=g)
    committed, words = torch.tensor([6], dtype=torch.int32), pack_mask(torch.eye(3, dtype=torch.bool))
    out = torch.zeros_like(q)
    buffers = {100 + i: t for i, t in enumerate([q, k, v, committed, words, out])}
    monkeypatch.setattr(plugin_mod, "_torch_view", lambda _trt, _desc, ptr: buffers[ptr])
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda handle: handle)
    monkeypatch.setattr(torch.cuda, "stream", lambda _s: contextlib.nullcontext())
    plugin_cls = plugin_classes(rtx.module)[0]
    p = plugin_cls(TreeAttentionFields(num_heads=4, num_kv_heads=2, head_size=64, scale=0.25))
    assert p.enqueue([None] * 5, [None], [100, 101, 102, 103, 104], [105], 0, 7) == 0
    torch.testing.assert_close(out, tree_attention(q, k, v, committed, words, 0.25))
    assert p.clone().fields == p.fields
    # what the engine stores and hands the creator when it is deserialized
    assert plugin_mod.decode_fields(p.get_fields_to_serialize()) == p.fields


@pytest.mark.parametrize("codes,zero,refused", [("uint8", 128, True), ("int8", 3, True), ("int8", 0, False),
                                                ("int8", None, False)])
def test_asymmetric_qdq_is_refused_with_the_fix(tmp_path, codes, zero, refused):
    # TensorRT for RTX 1.7.1's parser: "Found unsupported input type of UINT8" / "Non-zero zero point is not
    # supported": the builder says so first, naming the flag that makes a TensorRT-ready export
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem = TensorProto.UINT8 if codes == "uint8" else TensorProto.INT8
    inits = [helper.make_tensor("w", elem, [4, 2], [1] * 8), numpy_helper.from_array(np.ones(2, np.float16), "s")]
    if zero is not None:
        inits.append(helper.make_tensor("z", elem, [2], [zero, zero]))
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"] + (["z"] if zero is not None else []), ["wd"], axis=1),
             helper.make_node("MatMul", ["x", "wd"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 2])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), str(tmp_path / "g.onnx"))
    if refused:
        with pytest.raises(TensorRTBuildError, match="zero points.*--symmetric"):
            builder_mod._check_zero_points(tmp_path / "g.onnx")
    else:
        builder_mod._check_zero_points(tmp_path / "g.onnx")
