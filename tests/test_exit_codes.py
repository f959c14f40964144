"""Issue 57, items 4 and 6: one rule for exit codes (errors.py, README "Exit codes"): a command line that is wrong
whatever the inputs - an option's value, two options that do not fit, an option that cannot apply - exits 2 with
the help hint, before anything loads; an error that depends on the inputs exits 1. Before, a scheme x method that
does not exist, --group-size 7 or a bad --target-quant exited 1 beside similar errors that exited 2, and
--act-calibration on a weight-only scheme or --candidates without --budget were accepted and ignored."""

from __future__ import annotations

import pytest
from cli_common import run_main
from drafters_common import saved_target_and_drafter

from specpress.errors import ConfigError
from specpress.models.quantized.scheme import config_for


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("codes")
    tdir, data, drafter = saved_target_and_drafter(root)
    (root / "p.jsonl").write_text('{"input_ids": [1, 2]}\n')
    return root, tdir, data, drafter


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a command builds the target or loads a drafter: a wrong command line is refused first."""
    from specpress.models import drafter_io
    from specpress.models.target import TargetModel

    monkeypatch.setattr(TargetModel, "__init__", lambda *a, **k: pytest.fail("built the target before refusing"))
    monkeypatch.setattr(drafter_io, "load_drafter", lambda *a, **k: pytest.fail("loaded a drafter before refusing"))


Q = ("quantize", "--drafter", "{drafter}", "--out", "{out}")
USAGE = {  # command line -> words its error must hold
    "scheme x method": (*Q, "--scheme", "int4", "--method", "smoothquant"),
    "int4 group 7": (*Q, "--scheme", "int4", "--group-size", "7"),
    "fixed:nan": (*Q, "--scheme", "fp8", "--activations", "static", "--act-calibration", "fixed:nan"),
    "percentile:200": (*Q, "--scheme", "fp8", "--activations", "static", "--act-calibration", "percentile:200"),
    "target-quant int5": (*Q, "--scheme", "int8", "--target-quant", "int5"),
    "distill target-quant": ("distill", "--target", "{tdir}", "--family", "eagle3", "--data", "{data}", "--out",
                             "{out}", "--steps", "1", "--target-quant", "int5"),
    "bench target-quant group": ("bench", "--target", "{tdir}", "--prompts", "{prompts}", "--max-new-tokens", "2",
                                 "--target-quant", "int4:group=7"),
    "run target-quant option": ("run", "--target", "{tdir}", "--prompt", "x", "--target-quant", "int4:bogus=1"),
    # options that cannot apply (item 4): refused, not recorded as if they had
    "act-calibration weight-only": (*Q, "--scheme", "int4", "--group-size", "8", "--act-calibration", "max"),
    "act-calibration nf4": (*Q, "--scheme", "nf4", "--act-calibration", "max"),
    "act-calibration dynamic": (*Q, "--scheme", "fp8", "--act-calibration", "max"),
    "candidates without budget": (*Q, "--scheme", "int8", "--candidates", "int4"),
    # already exit 2 before: the same rule
    "bad budget": (*Q, "--budget", "1XB"),
    "bad candidates": (*Q, "--budget", "1MB", "--candidates", "int9"),
}
WORDS = {
    "scheme x method": "--scheme int4 does not take --method smoothquant",
    "int4 group 7": "int4 group_size must be even",
    "fixed:nan": "--act-calibration 'fixed:nan'",
    "percentile:200": "--act-calibration 'percentile:200'",
    "target-quant int5": "--target-quant 'int5': unknown scheme",
    "distill target-quant": "--target-quant 'int5': unknown scheme",
    "bench target-quant group": "--target-quant 'int4:group=7': int4 group_size must be even",
    "run target-quant option": "unknown option 'bogus'",
    "act-calibration weight-only": "--act-calibration max finds static input scales, but --scheme int4 --method "
                                   "rtn is weight-only: nothing would be calibrated; drop --act-calibration",
    "act-calibration nf4": "weight-only",
    "act-calibration dynamic": "scales its activations at run time by default (--activations dynamic)",
    "candidates without budget": "--candidates int4 would be ignored: give --budget SIZE or drop --candidates",
    "bad budget": "--budget '1XB'",
    "bad candidates": "--candidates 'int9': unknown scheme 'int9'",
}


@pytest.mark.parametrize("name", list(USAGE))
def test_a_wrong_command_line_exits_2_before_any_work(setup, tmp_path, no_loading, name):
    root, tdir, data, drafter = setup
    args = [a.format(drafter=drafter, out=tmp_path / "out", tdir=tdir, data=data, prompts=root / "p.jsonl")
            for a in USAGE[name]]
    res = run_main(*args)
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    first = res.stderr.splitlines()[0]
    assert first.startswith("error: ") and WORDS[name] in first, res.stderr
    assert f"Try 'specpress {args[0]} --help' for help." in res.stderr
    assert not (tmp_path / "out").exists()


def test_an_error_that_depends_on_the_inputs_still_exits_1(setup, tmp_path):
    """The other side of the rule: int4's default group of 64 does not divide this drafter's fc (96 inputs)."""
    _, _, _, drafter = setup
    res = run_main("quantize", "--drafter", drafter, "--out", tmp_path / "q", "--scheme", "int4")
    assert res.exit_code == 1 and "does not divide fc's in_features 96" in res.stderr, res.stderr
    assert "--help" not in res.stderr


def test_a_recipe_with_a_calibration_that_cannot_apply_is_a_config_error():
    """config_for is what recipes expand through too: there the file is wrong, a ConfigError (exit 1)."""
    with pytest.raises(ConfigError, match="--act-calibration mse finds static input scales"):
        config_for("int4", act_calibration="mse")
    assert config_for("fp8", activations="static", act_calibration="max").act_calibration == "max"
    assert config_for("int8", activations="static").act_mode == "static"  # the default calibration: nothing given


def test_the_first_stderr_line_is_ours_not_bitsandbytes(setup, tmp_path):
    """Issue 57, item 8: importing bitsandbytes (0.50, on an AVX512-BF16 CPU without the `kernels` package) logged
    "Failed to load CPU gemm_4bit_forward from kernels-community ... trust_remote_code" above our output. Fresh
    processes, as a user's shell runs them (the import happens inside the command): an nf4 quantize, then a bench
    of its drafter that fails on a prompt past the context, whose first stderr line must be our error."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("bitsandbytes")
    root, tdir, _, drafter = setup
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def specpress(*args):
        return subprocess.run([sys.executable, "-m", "specpress.cli", *map(str, args)], capture_output=True,
                              text=True, env=env, timeout=300)

    q = tmp_path / "nf4"
    proc = specpress("quantize", "--drafter", drafter, "--out", q, "--scheme", "nf4", "--group-size", "32",
                     "--exclude", "fc,midlayer.mlp.down_proj,midlayer.self_attn.o_proj")
    assert proc.returncode == 0, proc.stderr
    assert "gemm_4bit_forward" not in proc.stderr + proc.stdout and "trust_remote_code" not in proc.stderr
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"input_ids": [1] * 120}) + "\n")
    proc = specpress("bench", "--target", tdir, "--drafter", q, "--prompts", long, "--max-new-tokens", "6")
    assert proc.returncode == 1, proc.stderr
    first = next(ln for ln in proc.stderr.splitlines() if ln.strip())
    assert first.startswith("error: prompt 1 has 120 tokens"), proc.stderr
