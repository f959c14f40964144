"""Re-aligning a drafter to a compressed target: distill --target-quant (training on its signals), quantize
--target-quant (calibrating on them), and the target precision that export hf and inspect then show."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from drafters_common import random_eos_target, save_with_tokenizer

from specpress.cli import cli
from specpress.models.inspect import inspect_artifact, target_precision
from specpress.models.io import read_weights


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny target with a tokenizer, its data, and a 3-step eagle3 drafter distilled on the float target."""
    root = tmp_path_factory.mktemp("realign")
    tdir, data = save_with_tokenizer(random_eos_target(), root)
    base = invoke("distill", "--target", tdir, "--family", "eagle3", "--data", data, "--out", root / "base",
                  "--steps", "3", "--batch", "2", "--seq-len", "16", "--draft-vocab", "40")
    assert "written to" in base
    return root, tdir, data


def invoke(*args) -> str:
    res = CliRunner().invoke(cli, [str(a) for a in args])
    assert res.exit_code == 0, (res.output, res.exception)
    return res.output


def realign(setup, name: str, *extra) -> dict:
    root, tdir, data = setup
    invoke("distill", "--target", tdir, "--family", "eagle3", "--data", data, "--init", root / "base", "--out",
           root / name, "--steps", "3", "--batch", "2", "--seq-len", "16", *extra)
    return read_weights(root / name)


def test_distill_trains_on_the_compressed_targets_signals(setup):
    root = setup[0]
    plain, float_spec, fp8 = realign(setup, "r0"), realign(setup, "r1", "--target-quant", "none"), \
        realign(setup, "r2", "--target-quant", "fp8")
    assert all(torch.equal(plain[k], float_spec[k]) for k in plain)  # `none` is the float target
    assert any(not torch.equal(plain[k], fp8[k]) for k in plain if plain[k].is_floating_point())
    step = json.loads((root / "r2" / "config.json").read_text())["specpress"]["steps"][-1]
    assert step["step"] == "distill" and step["data"]["target_quant"] == {"spec": "fp8", "label": "fp8-dyn"}
    assert inspect_artifact(root / "r2")["target_precision"] == {"label": "fp8-dyn", "spec": "fp8", "step": 2,
                                                                 "by": "distill"}
    assert inspect_artifact(root / "r0")["target_precision"]["label"] == "float"
    out = invoke("inspect", root / "r2")
    assert "target precision" in out and "fp8-dyn (--target-quant fp8): aligned with it by step 2" in out
    assert "target compressed as fp8-dyn" in out


def test_distill_calibrates_a_static_target_on_its_own_data(setup):
    root = setup[0]
    realign(setup, "r3", "--target-quant", "fp8:activations=static")
    tq = json.loads((root / "r3" / "config.json").read_text())["specpress"]["steps"][-1]["data"]["target_quant"]
    assert tq["label"] == "fp8-static" and tq["calibration"]["windows"] == 32


def test_quantize_recalibrates_on_the_compressed_target_and_export_records_it(setup):
    root, tdir, data = setup
    args = ["quantize", "--drafter", root / "base", "--scheme", "int8", "--method", "gptq", "--target", tdir,
            "--data", data, "--seq-len", "16", "--calib-batches", "2", "--eval-batches", "1"]
    invoke(*args, "--out", root / "q-float")
    out = invoke(*args, "--out", root / "q-fp8", "--target-quant", "fp8")
    assert "against the target compressed as fp8-dyn" in out
    a, b = read_weights(root / "q-float"), read_weights(root / "q-fp8")
    assert any(not torch.equal(a[k], b[k]) for k in a if k.endswith("qweight"))  # GPTQ saw other inputs
    step = json.loads((root / "q-fp8" / "config.json").read_text())["specpress"]["steps"][-1]
    assert step["target_quant"]["label"] == "fp8-dyn"
    assert inspect_artifact(root / "q-fp8")["target_precision"]["by"] == "quantize"
    assert inspect_artifact(root / "q-float")["target_precision"]["label"] == "float"
    res = CliRunner().invoke(cli, ["export", "hf", "--drafter", str(root / "q-fp8"), "--out", str(root / "hf"),
                                   "--format", "speculators", "--target", str(tdir)])
    assert res.exit_code == 0, (res.output, res.exception)
    cfg = json.loads((root / "hf" / "config.json").read_text())
    assert cfg["specpress"]["target_precision"]["label"] == "fp8-dyn" and "serve it beside a target" in res.output
    assert inspect_artifact(root / "hf")["target_precision"]["label"] == "fp8-dyn"


def test_quantize_target_quant_needs_a_target(setup, tmp_path):
    root = setup[0]
    res = CliRunner().invoke(cli, ["quantize", "--drafter", str(root / "base"), "--out", str(tmp_path / "x"),
                                   "--scheme", "int8", "--target-quant", "fp8"])
    assert res.exit_code != 0 and "pass --target DIR and --data PATH" in str(res.exception)
    assert not (tmp_path / "x").exists()


def test_target_precision_reads_the_last_step_that_ran_a_target():
    tq = {"spec": "nvfp4:activations=static", "label": "nvfp4-static"}
    steps = [{"step": "distill", "data": {}}, {"step": "prune", "config": {}},
             {"step": "distill", "data": {"target_quant": tq}}, {"step": "quantize", "config": {}}]
    assert target_precision(steps) == {**tq, "step": 3, "by": "distill"}  # an uncalibrated quantize ran no target
    steps.append({"step": "quantize", "calibration": {"windows": 8}})
    assert target_precision(steps) == {"label": "float", "spec": "none", "step": 5, "by": "quantize"}
    assert target_precision([{"step": "prune"}]) is None and target_precision(None) is None


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_export_for_an_engine_records_the_precision_and_names_the_float_target(setup, engine):
    """Engines load the drafter as any other (the target's precision is the served target checkpoint's): the
    export records what it was aligned with, and says so when the serve line names the float target."""
    root, tdir, data = setup
    if not (root / "r2").exists():
        realign(setup, "r2", "--target-quant", "fp8")
    res = CliRunner().invoke(cli, ["export", "hf", "--drafter", str(root / "r2"), "--out", str(root / f"e-{engine}"),
                                   "--for", engine, "--target", str(tdir)])
    assert res.exit_code == 0, (res.output, res.exception)
    cfg = json.loads((root / f"e-{engine}" / "config.json").read_text())
    assert cfg["specpress"]["target_precision"] == {"label": "fp8-dyn", "spec": "fp8", "step": 2, "by": "distill"}
    assert cfg["specpress"]["exported_as"].startswith(engine)
    out = " ".join(res.output.split())
    assert "reads no such field" in out and f"--target {tdir}, a float target" in out
    plain = CliRunner().invoke(cli, ["export", "hf", "--drafter", str(root / "base"), "--out",
                                     str(root / f"p-{engine}"), "--for", engine, "--target", str(tdir)])
    assert plain.exit_code == 0, (plain.output, plain.exception)
    assert "aligned with" not in plain.output
    assert json.loads((root / f"p-{engine}" / "config.json").read_text())["specpress"]["target_precision"]["label"] \
        == "float"
