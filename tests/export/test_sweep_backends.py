"""A recipe with `backends: [torch, onnxruntime]`: each point is exported on demand and measured on both."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

pytest.importorskip("onnxruntime")


def _sweep_module():
    path = Path(__file__).resolve().parents[1] / "sweep" / "test_sweep_end_to_end.py"
    spec = importlib.util.spec_from_file_location("sweep_e2e", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_recipe_runs_every_point_on_both_backends(tmp_path, monkeypatch):
    from specpress.sweep.results import read_results

    e2e = _sweep_module()
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path / "cache"))
    recipe = e2e.write_setup(tmp_path)
    obj = yaml.safe_load(recipe.read_text())
    obj.update(backends=["torch", "onnxruntime"], grid=[{"quantize": {"scheme": "int8"}}])
    recipe.write_text(yaml.safe_dump(obj))
    res = e2e.sweep(recipe, "--out", tmp_path / "out")
    assert res.exit_code == 0, (res.output, res.exception)
    recs = {(r["point"], r["backend"]): r for r in read_results(tmp_path / "out")}
    assert set(recs) == {(p, b) for p in ("base", "int8") for b in ("torch", "onnxruntime")}
    for p in ("base", "int8"):
        t, o = recs[(p, "torch")], recs[(p, "onnxruntime")]
        assert t["status"] == o["status"] == "ok", (t.get("error"), o.get("error"))
        assert o["lossless_mismatches"] == 0
        assert o["tau"] == pytest.approx(t["tau"], rel=0.01), (p, t["per_prompt_tau"], o["per_prompt_tau"])
    assert len(list((tmp_path / "cache" / "onnx").iterdir())) == 2  # one export per point
