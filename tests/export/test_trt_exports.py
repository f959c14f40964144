"""Every family's export parses and builds with TensorRT for RTX (the builder's own parser and AOT compiler):
in the plugin form each TreeAttention node becomes a plugin layer, in the standard form each ONNX Attention an
IAttention layer, and in int8 Q/DQ exports each DequantizeLinear a dequantize layer. One export + one build per
case; skipped with the reason where TensorRT for RTX is missing."""

from __future__ import annotations

import dataclasses
import json

import onnx
import pytest
import torch

from specpress.export.trt.builder import BuildOptions, build_engines
from specpress.runtime.backends.tensorrt.library import TensorRTUnavailable, load_tensorrt
from specpress.export.trt.profiles import Budget

pytestmark = [pytest.mark.trt]  # ~15 s: in the default run, so CI builds these engines


def _export_cli():
    from specpress import cli
    from specpress.commands import COMMANDS

    if "export" not in COMMANDS:
        pytest.skip("`specpress export` is not wired into this build's CLI")
    return cli.main


def _ok(main, args: list[str]) -> None:
    try:
        main(args)  # returns on success; a user error exits non-zero
    except SystemExit as exc:
        assert exc.code in (0, None), f"specpress {' '.join(args)} failed"


# What TensorRT for RTX 1.7.1.116 did with these exports on CPU (2026-12-01), all fixed on our side:
# - the DFlash block graph aborted the process (malloc_consolidate: invalid chunk size): its optimization
#   profile sized `positions` [1, context_block] apart from `features` [1, context] and `block_ids` [1, block],
#   so the opt / max shapes broke the graph's Concat(context, block) + positions constraint. Without a plugin
#   layer TensorRT reports that as "Error Code 4: kOPT values ... violate shape constraints"; with the Python
#   IPluginV3 layer it corrupts the heap. Profiles now size `context_block` as context + block.
# - the int8 Q/DQ graphs failed in Myelin with "CHECK(is_value()) failed" when a MatMul whose weight was a
#   one-block blocked DequantizeLinear (per-row scales [1, N], block_size K) fed further such MatMuls. The
#   same scales as a per-axis DequantizeLinear (scale [N], axis 1) build; quant.py now writes that form.
# - the standard form did not parse: "TensorRT only supports Attention nodes with one output" (Attention with
#   past_key / past_value inputs and present outputs); ops.py now concatenates the past and uses one output.


def _saved_pair(family: str, tmp_path):
    """(target dir, drafter dir): a random target and `family` drafter of head size 64 (what TensorRT for
    RTX's fp16 kernels are built for; CONFIGS carry head_dim 32 / 4 = 8)."""
    from drafters_common import CONFIGS, L, randomize

    from specpress.models.drafter import build_drafter
    from specpress.models.drafter_io import save_drafter
    from specpress.models.target import TargetConfig, TargetModel, save_target

    shape = dict(hidden_size=128, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    target = TargetModel(TargetConfig(vocab_size=61, num_hidden_layers=L, max_position_embeddings=128, **shape))
    names = {f.name for f in dataclasses.fields(CONFIGS[family])}
    extra = {k: v for k, v in (("target_hidden_size", 128), ("head_dim", 64)) if k in names}
    drafter = randomize(build_drafter(dataclasses.replace(CONFIGS[family], **shape, **extra)), 1).attach_target(target)
    if family == "eagle3":
        drafter.set_draft_vocab(torch.arange(24))
    return save_target(target, tmp_path / "target"), save_drafter(drafter, tmp_path / "drafter")


def _ready(family: str, tmp_path):
    """(the CLI, target dir, drafter dir) for a build test; skipped with the reason without TensorRT for RTX."""
    try:
        load_tensorrt("tensorrt_rtx")
    except TensorRTUnavailable as exc:
        pytest.skip(f"TensorRT for RTX is not installed ({exc})")
    return (_export_cli(), *_saved_pair(family, tmp_path))

FAMILIES = ["eagle", "eagle3", "mtp", "dflash", "lm"]
# the standard form's int8 builds repeat what the plugin form's prove for Q/DQ: marked slow
CASES = ([("plugin", q) for q in (None, "int8")] + [("standard", None)]
         + [pytest.param("standard", "int8", marks=pytest.mark.slow)])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attention,quant", CASES)
def test_export_builds(family, attention, quant, tmp_path):
    main, tdir, ddir = _ready(family, tmp_path)
    if quant:
        _ok(main, ["quantize", "--drafter", str(ddir), "--out", str(tmp_path / "q"), "--scheme", quant])
        ddir = tmp_path / "q"
    args = ["export", "onnx", "--drafter", str(ddir), "--target", str(tdir), "--out", str(tmp_path / "onnx"),
            "--attention", attention, "--dtype", "fp16"] + (["--quant-format", "qdq"] if quant else [])
    _ok(main, args)
    manifest = build_engines(tmp_path / "onnx", tmp_path / "engines",
                             BuildOptions(budget=Budget(max_tree=32, max_context=128), targets=("sm89",)),
                             echo=lambda _m: None)
    graphs = {p.stem: onnx.load(str(p), load_external_data=False).graph for p in (tmp_path / "onnx").glob("*.onnx")}
    assert set(manifest["engines"]) == set(graphs)
    for name, graph in graphs.items():
        entry = manifest["engines"][name]
        ops = [n.op_type for n in graph.node]
        assert entry["plugin_layers"] == ops.count("TreeAttention"), name
        assert entry["attention_layers"] == ops.count("Attention"), name
        assert entry["dequantize_layers"] == ops.count("DequantizeLinear"), name
    kind = "plugin_layers" if attention == "plugin" else "attention_layers"
    assert sum(e[kind] for e in manifest["engines"].values()) > 0
    if quant:  # the weights stay int8 in the network: one dequantize layer per quantized Linear
        assert sum(e["dequantize_layers"] for e in manifest["engines"].values()) > 0
    assert json.loads((tmp_path / "engines" / "manifest.json").read_text()) == manifest


@pytest.mark.parametrize("family", ["eagle3", "lm"])
def test_an_fp32_export_in_the_standard_form_builds(family, tmp_path):
    """TensorRT for RTX 1.7.1 has no fused fp32 Attention kernel: the default export (fp32, standard form) failed
    in Myelin until the builder let each IAttention decompose where no fused kernel exists (2026-12-07)."""
    main, tdir, ddir = _ready(family, tmp_path)
    _ok(main, ["export", "onnx", "--drafter", str(ddir), "--target", str(tdir), "--out", str(tmp_path / "onnx"),
               "--attention", "standard", "--dtype", "fp32"])
    manifest = build_engines(tmp_path / "onnx", tmp_path / "engines",
                             BuildOptions(budget=Budget(max_tree=32, max_context=128), targets=("sm89",)),
                             echo=lambda _m: None)
    assert sum(e["attention_layers"] for e in manifest["engines"].values()) > 0
    assert all((tmp_path / "engines" / f"{name}.engine").stat().st_size > 0 for name in manifest["engines"])

# Activations quantized (W8A8): the TensorRT form (inputs.py) must build. What TensorRT for RTX 1.7.1.116 refused
# before that form existed (2026-12-02): a Cast to FP8 ("has datatype FP8 but is not produced by ...
# IQuantizeLayer"), and a MatMul whose activation Q/DQ scale was float32 beside fp16 weight scales (Myelin
# "CHECK_EQ(lhs_scale->type(), rhs_scale->type())").
@pytest.mark.parametrize("args", [("--scheme", "fp8"), ("--scheme", "fp8", "--activations", "static",
                                                        "--act-calibration", "fixed:448"),
                                  ("--scheme", "int8", "--activations", "dynamic")],
                         ids=["fp8-dynamic", "fp8-static", "int8-dynamic"])
def test_w8a8_exports_build(args, tmp_path):
    try:
        load_tensorrt("tensorrt_rtx")
    except TensorRTUnavailable as exc:
        pytest.skip(f"TensorRT for RTX is not installed ({exc})")
    main = _export_cli()
    tdir, ddir = _saved_pair("eagle3", tmp_path)
    _ok(main, ["quantize", "--drafter", str(ddir), "--out", str(tmp_path / "q"), *args])
    _ok(main, ["export", "onnx", "--drafter", str(tmp_path / "q"), "--target", str(tdir), "--out",
               str(tmp_path / "onnx"), "--attention", "plugin", "--dtype", "fp16", "--quant-format", "qdq"])
    manifest = build_engines(tmp_path / "onnx", tmp_path / "engines",
                             BuildOptions(budget=Budget(max_tree=32, max_context=128), targets=("sm89",)),
                             echo=lambda _m: None)
    graphs = {p.stem: onnx.load(str(p), load_external_data=False).graph for p in (tmp_path / "onnx").glob("*.onnx")}
    q_nodes = sum(n.op_type == "QuantizeLinear" for g in graphs.values() for n in g.node)
    assert set(manifest["engines"]) == set(graphs) and q_nodes == (0 if "int8" in args else 8)
    for name, graph in graphs.items():  # each quantized Linear: its weight's DQ, and its input's Q/DQ for fp8
        assert manifest["engines"][name]["dequantize_layers"] == [n.op_type for n in graph.node].count(
            "DequantizeLinear"), name
