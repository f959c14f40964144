"""Every family's plugin-form export parses and builds with TensorRT for RTX (the builder's own parser and AOT
compiler), each TreeAttention node becoming a plugin layer. One export + one build per case (about 15 s in
all); skipped with the reason where TensorRT for RTX is missing (CI installs it)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from specpress.export.trt.builder import BuildOptions, build_engines
from specpress.runtime.backends.trt.library import TensorRTUnavailable, load_tensorrt
from specpress.export.trt.profiles import Budget

pytestmark = [pytest.mark.trt]  # ~15 s: in the default run, so CI builds these engines


def _export_cli():
    from specpress import cli

    if "export" not in cli.COMMANDS:
        pytest.skip("`specpress export` is not wired into this build's CLI")
    return cli.main


def _ok(main, args: list[str]) -> None:
    try:
        main(args)  # returns on success; a user error exits non-zero
    except SystemExit as exc:
        assert exc.code in (0, None), f"specpress {' '.join(args)} failed"


# What TensorRT for RTX 1.7.1.116 does with these exports on CPU (2026-12-01): the float plugin exports of
# eagle / eagle3 / mtp / lm build; the DFlash block graph aborts the whole process inside the builder
# (not yet diagnosed: skipped so the other cases still report); every int8 Q/DQ step graph fails in
# Myelin with "CHECK(is_value()) failed" (strict xfail: it turns red the day the build succeeds).
DFLASH_ABORTS = "TensorRT for RTX 1.7.1 aborts the process building the DFlash block graph (undiagnosed)"
QDQ_MYELIN = "TensorRT for RTX 1.7.1: Myelin CHECK(is_value()) fails on the int8 Q/DQ graphs"


@pytest.mark.parametrize("family", ["eagle", "eagle3", "mtp",
                                    pytest.param("dflash", marks=pytest.mark.skip(reason=DFLASH_ABORTS)), "lm"])
@pytest.mark.parametrize("quant", [None, pytest.param("int8", marks=pytest.mark.xfail(reason=QDQ_MYELIN, strict=True))])
def test_plugin_export_builds(family, quant, tmp_path):
    try:
        load_tensorrt("tensorrt_rtx")
    except TensorRTUnavailable as exc:
        pytest.skip(f"TensorRT for RTX is not installed ({exc})")
    main = _export_cli()
    from drafters_common import CONFIGS, L, randomize

    from specpress.models.drafter import build_drafter
    from specpress.models.drafter_io import save_drafter
    from specpress.models.target import TargetConfig, TargetModel, save_target

    # head size 64 in fp16: what TensorRT for RTX's kernels are built for
    shape = dict(hidden_size=128, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    target = TargetModel(TargetConfig(vocab_size=61, num_hidden_layers=L, max_position_embeddings=128, **shape))
    names = {f.name for f in dataclasses.fields(CONFIGS[family])}
    cfg = dataclasses.replace(CONFIGS[family], **shape, **({"target_hidden_size": 128} if "target_hidden_size" in names
                                                             else {}))
    drafter = randomize(build_drafter(cfg), 1).attach_target(target)
    if family == "eagle3":
        drafter.set_draft_vocab(torch.arange(24))
    tdir = save_target(target, tmp_path / "target")
    ddir = save_drafter(drafter, tmp_path / "drafter")
    if quant:
        _ok(main, ["quantize", "--drafter", str(ddir), "--out", str(tmp_path / "q"), "--scheme", quant])
        ddir = tmp_path / "q"
    args = ["export", "onnx", "--drafter", str(ddir), "--target", str(tdir), "--out", str(tmp_path / "onnx"),
            "--attention", "plugin", "--dtype", "fp16"] + (["--quant-format", "qdq"] if quant else [])
    _ok(main, args)
    manifest = build_engines(tmp_path / "onnx", tmp_path / "engines",
                             BuildOptions(budget=Budget(max_tree=32, max_context=128), targets=("sm89",)),
                             echo=lambda _m: None)
    assert manifest["engines"] and sum(e["plugin_layers"] for e in manifest["engines"].values()) > 0
    assert json.loads((tmp_path / "engines" / "manifest.json").read_text()) == manifest
