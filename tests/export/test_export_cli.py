"""`specpress export onnx` end to end, the manifest's strict loading, and the export's refusals."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("onnxruntime")
from click.testing import CliRunner

from specpress.cli import cli
from specpress.errors import CheckpointError, RequestError
from specpress.export.onnx import ExportOptions, export_onnx
from specpress.manifest import load_manifest


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, target):
    from conftest import make_drafter

    from specpress.models.drafter_io import save_drafter
    from specpress.models.target import save_target

    root = tmp_path_factory.mktemp("cli")
    tdir = save_target(target, root / "target")
    ddir = save_drafter(make_drafter("eagle3", target), root / "eagle3")
    return root, tdir, ddir


def test_export_onnx_command_writes_a_validated_directory(dirs):
    root, tdir, ddir = dirs
    out = root / "onnx-plugin"
    res = CliRunner().invoke(cli, ["export", "onnx", "--drafter", str(ddir), "--target", str(tdir), "--out", str(out),
                                   "--attention", "plugin"])
    assert res.exit_code == 0, res.output
    assert "fuse" in res.output and "step" in res.output and "max_rel" in res.output
    m = load_manifest(out)
    assert m.family == "eagle3" and m.attention == "plugin" and m.opset == 23 and m.dtype == "fp32"
    assert {g.name for g in m.graphs} == {"fuse", "step"}
    assert m.drafter.draft_vocab_size == 24 and len(m.drafter.token_map) == 24
    assert m.shared_bytes == (out / m.shared_file).stat().st_size > 0
    assert m.drafter_bytes == sum((out / g.file).stat().st_size for g in m.graphs)
    assert m.graph("step").uses_shared and not m.graph("fuse").uses_shared
    step = m.graph("step")
    assert {"hidden", "ids", "positions", "committed", "tree_mask", "past_key.0"} <= set(step.input_names())
    assert all(e["max_rel"] < 1e-4 for g in m.validation.values() for e in g.values())
    assert "real rounds: chain:4" in res.output
    r = m.validation_rounds
    assert r["rounds"] > 0 and r["agree"] + r["near_ties"] == r["rounds"] and set(r["errors"]) == {"fuse", "step"}


def test_refusals_name_the_fix(dirs, exported, monkeypatch):
    root, tdir, ddir = dirs
    with pytest.raises(RequestError, match="opset >= 23"):
        ExportOptions(opset=21)
    with pytest.raises(RequestError, match="bf16"):
        ExportOptions(dtype="bf16")
    ExportOptions(attention="plugin", opset=18)  # the plugin form's function body needs only opset 18
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(RequestError, match=r"specpress\[ort\]"):
        from specpress.export.onnx import require_onnxruntime

        require_onnxruntime()


def test_over_tolerance_writes_nothing(tmp_path, target, monkeypatch):
    from conftest import make_drafter

    import specpress.export.onnx as exp
    from specpress.export.validate import ExportValidationError

    monkeypatch.setitem(exp.TOLERANCE, "fp32", 0.0)  # every float graph differs from torch by a rounding error
    with pytest.raises(ExportValidationError, match="step"):
        export_onnx(make_drafter("eagle", target), tmp_path / "out", target=target)
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_manifest_is_strict(exported, tmp_path):
    _, path, _ = exported("eagle")
    raw = json.loads((path / "manifest.json").read_text())
    for change, match in ((lambda d: d.update(format_version=99), "unknown export format_version 99"),
                          (lambda d: d.update(extra=1), "unknown key"),
                          (lambda d: d["drafter"].pop("taps"), "missing key")):
        d = json.loads(json.dumps(raw))
        change(d)
        (tmp_path / "manifest.json").write_text(json.dumps(d))
        with pytest.raises(CheckpointError, match=match):
            load_manifest(tmp_path)
    with pytest.raises(CheckpointError, match="export onnx"):
        load_manifest(tmp_path / "nowhere")


def test_export_on_demand_is_made_once_and_reused(dirs, tmp_path, monkeypatch):
    from specpress.export.ondemand import exported_dir_for

    _, tdir, ddir = dirs
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path))
    said: list[str] = []
    first, made = exported_dir_for(ddir, tdir, progress=said.append)
    assert made and first.parent == tmp_path / "onnx" and load_manifest(first).family == "eagle3"
    again, made_again = exported_dir_for(ddir, tdir, progress=said.append)
    assert again == first and not made_again and "cached" in said[-1]
    other, _ = exported_dir_for(ddir, tdir, ExportOptions(attention="plugin"))
    assert other != first and load_manifest(other).attention == "plugin"


def test_a_bf16_drafter_exports_against_its_fp32_copy(tmp_path):
    import torch
    from drafters_common import make, tiny_target

    target = tiny_target().to(torch.bfloat16)
    d = make("mtp", target.float()).to(torch.bfloat16)
    d.attach_target(target)
    rep = export_onnx(d, tmp_path / "o", target=target)
    assert max(e["max_rel"] for e in rep.errors["step.0"].values()) <= rep.tolerance


def test_unknown_drafter_artifact_version_is_refused(dirs, tmp_path):
    import shutil

    from specpress.export.onnx import export_from_dirs

    _, tdir, ddir = dirs
    newer = tmp_path / "newer"
    shutil.copytree(ddir, newer)
    cfg = json.loads((newer / "config.json").read_text())
    cfg["specpress"]["format_version"] = 99
    (newer / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="format_version 99"):
        export_from_dirs(newer, tdir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bench_with_onnxruntime_exports_a_drafter_artifact_on_demand(tmp_path, target, monkeypatch):
    from conftest import bench_inputs

    tdir, ddir, prompts = bench_inputs(tmp_path, target, "eagle", monkeypatch)
    outs = {}
    for backend in ("torch", "onnxruntime"):
        res = CliRunner().invoke(cli, ["bench", "--target", str(tdir), "--drafter", str(ddir), "--backend", backend,
                                       "--prompts", str(prompts), "--max-new-tokens", "8", "--policy", "chain:3",
                                       "--json", str(tmp_path / f"{backend}.json")])
        assert res.exit_code == 0, res.output
        outs[backend] = json.loads((tmp_path / f"{backend}.json").read_text())
    assert "exporting" in res.output and list((tmp_path / "cache" / "onnx").iterdir())
    assert outs["onnxruntime"]["config"]["provider"] == "CPUExecutionProvider"
    assert outs["onnxruntime"]["outputs"] == outs["torch"]["outputs"]
    assert outs["onnxruntime"]["tau"] == pytest.approx(outs["torch"]["tau"], rel=0.01)
