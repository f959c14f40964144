"""README's "Python API" block, run as written on a tiny EAGLE-3 drafter: it writes the artifact the CLI
writes and prints the CLI's lines; quantize_request refuses what the CLI refuses, with its messages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from drafters_common import make, tiny_target

from specpress.cli import cli
from specpress.compress.quantize.request import quantize_request
from specpress.errors import UsageError
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.io import tensor_index

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block() -> str:
    section = README.read_text().split("### Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's Python API section has no python block"
    return match.group(1)


def test_readme_python_api(tmp_path, monkeypatch, capsys):
    t = tiny_target()
    save_drafter(make("eagle3", t), tmp_path / "drafters" / "eagle3")
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_block(), "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()

    out = tmp_path / "drafters" / "eagle3-int8"
    assert load_drafter(out, t).provenance[-1]["scheme"] == "int8"
    keys = set(tensor_index(out))
    assert "midlayer.mlp.down_proj.qweight" in keys and "fc.weight" in keys  # --exclude fc kept fc in float

    cli_out = tmp_path / "cli-int8"
    res = CliRunner().invoke(cli, ["quantize", "--drafter", "drafters/eagle3", "--out", str(cli_out),
                                   "--scheme", "int8", "--exclude", "fc"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert res.output.replace(str(cli_out), "drafters/eagle3-int8").splitlines() == printed[:-1]
    assert set(tensor_index(cli_out)) == keys


@pytest.mark.parametrize(("kw", "message"), [
    ({}, "give --scheme WORD (one format for every Linear) or --budget SIZE"),
    ({"budget": "18KiB", "scheme": "int4", "group_size": 8}, "drop --scheme, --group-size (group sizes"),
    ({"budget": "18KiB", "recover_steps": 5}, "--recover-steps trains one scheme's codes"),
    ({"scheme": "int8", "sensitivity": "kl"}, "--sensitivity scores the candidates of --budget"),
    ({"scheme": "int8", "resume": True}, "--resume continues an interrupted recovery"),
])
def test_request_refuses_what_the_cli_refuses(kw, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        quantize_request(**kw)


def test_request_builds_what_the_run_takes():
    req = quantize_request(budget="18KiB", candidates="int8,int4:g8", include="lm_head")
    assert req.budget is not None and len(req.candidates) == 2 and req.recovery is None
    assert req.config.include == ("lm_head",)
    with pytest.warns(FutureWarning, match="--float-dtype bfloat16 is deprecated"):
        assert quantize_request(scheme="int4", legacy_float_dtype="bfloat16").float_dtype == "bf16"
    req = quantize_request(scheme="int3", recover_steps=3, seq_len=16, resume=True)
    assert req.recovery.steps == 3 and req.recovery.seq_len == 16 and req.run_kwargs()["resume"] is True


def test_readme_python_api_names_import():
    """Every function README's Python API section names by its dotted path (specpress.x.y.name) exists."""
    import importlib

    section = README.read_text().split("### Python API", 1)[1].split("\n## ", 1)[0]
    names = set(re.findall(r"`(specpress(?:\.\w+)+)\.(\w+)[(`]", section))
    names |= {("specpress.sweep.pipeline", "run_sweep"),  # named bare, after the dotted name of their module
              ("specpress.decode.run_pipeline", "run_decode"), ("specpress.decode.run_pipeline", "stats_line"),
              ("specpress.compress.regen_pipeline", "report_lines"), ("specpress.export.pipeline", "target_export"),
              ("specpress.export.pipeline", "onnx_lines"), ("specpress.export.pipeline", "target_lines"),
              ("specpress.models.inspect_report", "inspect_lines"), ("specpress.plan.report", "recipe_plans_to"),
              ("specpress.plan.report", "plan_lines"), ("specpress.plan.report", "recipe_lines")}
    assert {("specpress.sweep.pipeline", "sweep_request"), ("specpress.decode.run_pipeline", "run_request"),
            ("specpress.compress.regen_pipeline", "regenerate_from_dirs"),
            ("specpress.export.pipeline", "onnx_export"), ("specpress.export.trt.pipeline", "engines_from_onnx"),
            ("specpress.export.hf.pipeline", "hf_export"), ("specpress.models.inspect_report", "inspect_to"),
            ("specpress.plan.report", "plan_to"), ("specpress.runtime.heldout", "write_heldout_prompts"),
            ("specpress.zoo", "build_zoo")} <= names
    for module, name in sorted(names):
        assert callable(getattr(importlib.import_module(module), name)), f"{module}.{name}"
