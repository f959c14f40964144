"""`specpress export trt` as a command object (the `export` group attaches it with `register`), and the
guarded imports: without TensorRT every entry point names what is missing and how to install it."""

from __future__ import annotations

import json
import sys

import click
import pytest
from click.testing import CliRunner

from specpress.commands.export_trt import register, trt
from specpress.errors import RequestError
from specpress.runtime.backends.tensorrt.library import TensorRTUnavailable, load_tensorrt
from specpress.export.trt.probe import save_probe


def _rtx_or_skip():
    try:
        load_tensorrt("tensorrt_rtx")
    except TensorRTUnavailable as exc:
        pytest.skip(f"TensorRT for RTX is not installed ({exc})")


@pytest.mark.trt
def test_export_trt_builds_from_an_onnx_dir(tmp_path):
    _rtx_or_skip()
    src = tmp_path / "onnx"
    save_probe(src / "level_step.onnx")  # bare graphs (no manifest.json: a foreign one is refused)
    res = CliRunner().invoke(trt, ["--onnx", str(src), "--out", str(tmp_path / "e"), "--target-gpu", "sm89",
                                   "--max-tree", "48", "--max-context", "640",
                                   "--axis", "slots=1:32:700", "--flavour", "tensorrt_rtx"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    m = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert m["budget"] == {"max_tree": 48, "max_context": 640}
    prof = m["engines"]["level_step"]["profiles"]
    assert prof["draft"]["q"]["max"][2] == 48 and prof["prefill"]["q"]["max"][2] == 640
    assert prof["draft"]["k"]["max"][2] == 700
    assert "level_step.engine" in res.output and "wrote" in res.output


@pytest.mark.trt
def test_export_trt_probe_flag_overrides_budget(tmp_path):
    _rtx_or_skip()
    res = CliRunner().invoke(trt, ["--probe", "--out", str(tmp_path / "e"), "--max-tree", "8", "--max-context", "64"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    m = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert m["engines"]["tree_attention_probe"]["plugin_layers"] == 1
    assert m["budget"] == {"max_tree": 8, "max_context": 64}


def test_usage_errors(tmp_path):
    runner = CliRunner()
    res = runner.invoke(trt, ["--out", str(tmp_path / "e")])
    assert isinstance(res.exception, RequestError) and "--onnx DIR" in str(res.exception)
    res = runner.invoke(trt, ["--probe", "--onnx", str(tmp_path), "--out", str(tmp_path / "e")])
    assert isinstance(res.exception, RequestError)
    (tmp_path / "src").mkdir()  # beside --out: an --out inside its --onnx input is refused first
    res = runner.invoke(trt, ["--onnx", str(tmp_path / "src"), "--out", str(tmp_path / "e")])
    assert isinstance(res.exception, RequestError) and "no .onnx files" in str(res.exception)
    res = runner.invoke(trt, ["--probe", "--out", str(tmp_path / "e"), "--axis", "tree"])
    assert isinstance(res.exception, RequestError) and "NAME=MIN:OPT:MAX" in str(res.exception)


def test_register_attaches_to_a_group():
    group = click.Group("export")
    register(group)
    assert group.get_command(click.Context(group), "trt") is trt


def test_no_tensorrt_says_how_to_install(tmp_path, monkeypatch):
    for name in ("tensorrt", "tensorrt_rtx"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    with pytest.raises(TensorRTUnavailable, match=r"pip install 'specpress\[trt-rtx\]'"):
        load_tensorrt()
    with pytest.raises(TensorRTUnavailable, match="unknown TensorRT flavour"):
        load_tensorrt("tensorrt_lean")
    save_probe(tmp_path / "onnx" / "p.onnx")
    res = CliRunner().invoke(trt, ["--onnx", str(tmp_path / "onnx"), "--out", str(tmp_path / "e")])
    assert isinstance(res.exception, TensorRTUnavailable) and "specpress[trt]" in str(res.exception)
    assert not (tmp_path / "e").exists()


def test_type_stubs_alone_are_not_a_tensorrt(tmp_path, monkeypatch):
    """`tensorrt-stubs` in a path makes `import tensorrt` an empty namespace package: not a builder."""
    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.pyi").write_text("class Builder: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    with pytest.raises(TensorRTUnavailable, match="has no Builder/OnnxParser"):
        load_tensorrt("tensorrt")
    from specpress.runtime.backends.tensorrt.runner import TensorRTRuntimeUnavailable, import_runtime

    monkeypatch.setitem(sys.modules, "tensorrt_lean", None)
    with pytest.raises(TensorRTRuntimeUnavailable, match="no Runtime"):
        import_runtime("tensorrt")
