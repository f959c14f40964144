"""`bench --drafter`: the contract JSON, the lossless self-check, and the wrong-target guard."""

from __future__ import annotations

import json

import pytest
import torch
from cli_common import run_main
from click.testing import CliRunner
from drafters_common import make, tiny_target

from specpress.cli import cli
from specpress.models.drafter_io import save_drafter
from specpress.models.target import save_target


def setup(tmp_path, family="eagle3"):
    target = tiny_target()
    with torch.no_grad():
        target.lm_head.weight[1] *= 25.0  # so a random drafter gets drafts accepted
    tdir = save_target(target, tmp_path / "target")
    ddir = save_drafter(make(family, target), tmp_path / family)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"input_ids": p}) for p in ([5, 9, 13, 2], [30, 31, 32], [7, 7])))
    return target, tdir, ddir, prompts


def test_bench_with_drafter_writes_contract(tmp_path):
    _, tdir, ddir, prompts = setup(tmp_path)
    out = tmp_path / "res.json"
    res = CliRunner().invoke(cli, ["bench", "--target", str(tdir), "--drafter", str(ddir), "--prompts", str(prompts),
                                   "--max-new-tokens", "20", "--policy", "dynamic:depth=3,topk=3,budget=8",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["lossless_mismatches"] == 0
    assert d["tau"] > 1.0 and d["tau"] == 1 + sum(int(k) * v for k, v in d["histogram"].items()) / d["rounds"]
    assert d["ar"] == sorted(d["ar"], reverse=True) and 0 < d["ar"][0] <= 1
    assert d["drafter_bytes"] > 0 and d["speedup"] > 0 and d["baseline_tokens_per_s"] > 0
    assert 0 < d["draft_forward_ms"] <= d["draft_ms"] + d["other_ms"]
    assert 0 <= d["overhead_fraction"] < 1
    assert d["overhead_ms"] == pytest.approx(d["draft_ms"] + d["other_ms"] - d["draft_forward_ms"])
    assert len(d["outputs"]) == 3 and d["config"]["policy"] == "dynamic:depth=3,topk=3,budget=8"


def test_sampling_bench_runs(tmp_path):
    _, tdir, ddir, prompts = setup(tmp_path, "lm")
    out = tmp_path / "res.json"
    res = CliRunner().invoke(cli, ["bench", "--target", str(tdir), "--drafter", str(ddir), "--prompts", str(prompts),
                                   "--max-new-tokens", "12", "--temperature", "0.8", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["lossless_mismatches"] is None


def test_drafter_for_another_target_warns_or_refuses(tmp_path):
    target, tdir, ddir, prompts = setup(tmp_path)
    with torch.no_grad():
        target.lm_head.weight.mul_(1.01)  # "retrained": same config, other weights
    other = save_target(target, tmp_path / "other-target")
    args = ["bench", "--target", str(other), "--drafter", str(ddir), "--prompts", str(prompts),
            "--max-new-tokens", "4"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0 and "different target" in res.output
    res = CliRunner().invoke(cli, args + ["--strict"])
    assert res.exit_code != 0 and "different target" in str(res.exception)


def test_bad_policy_shows_grammar(tmp_path):
    _, tdir, ddir, prompts = setup(tmp_path)
    res = CliRunner().invoke(cli, ["bench", "--target", str(tdir), "--drafter", str(ddir), "--prompts", str(prompts),
                                   "--max-new-tokens", "4", "--policy", "chain:x"])
    assert res.exit_code != 0 and "dynamic:depth=" in str(res.exception)


@pytest.mark.parametrize("family, policy", [("eagle3", "dynamic:depth=3,topk=3,budget=8"), ("lm", "chain:3")])
def test_compiled_drafter_stays_lossless_and_compiles(tmp_path, family, policy):
    """--compile: Inductor really runs the drafter, outputs stay lossless, and (lm = the target itself, so
    every draft must be accepted) the compiled drafter's cache bookkeeping is intact: tau = 4."""
    import torch._dynamo

    _, tdir, ddir, prompts = setup(tmp_path, family)
    drafter = tdir if family == "lm" else ddir
    out = tmp_path / "res.json"
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        res = CliRunner().invoke(cli, ["bench", "--target", str(tdir), "--drafter", str(drafter), "--prompts",
                                       str(prompts), "--max-new-tokens", "13", "--policy", policy, "--compile",
                                       "--json", str(out)])
        assert res.exit_code == 0, res.output
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    finally:
        torch._dynamo.reset()
    d = json.loads(out.read_text())
    assert d["lossless_mismatches"] == 0 and d["tau"] > 1.0
    assert d["config"]["compile"] is True and d["config"]["warmup_prompts"] == 3
    if family == "lm":
        assert d["tau"] == 4.0 and d["ar"] == [1.0, 1.0, 1.0]


def test_compile_needs_a_drafter(tmp_path):
    _, tdir, _, prompts = setup(tmp_path)
    res = run_main("bench", "--target", tdir, "--prompts", prompts, "--max-new-tokens", "4", "--compile")
    assert res.exit_code == 2 and res.stderr.startswith("error: --compile compiles the drafter; pass --drafter")
    assert "Try 'specpress bench --help' for help." in res.stderr


def test_backend_choices_come_from_the_registry(tmp_path):
    from specpress.runtime.backends import names

    _, tdir, ddir, prompts = setup(tmp_path)
    base = ["bench", "--target", str(tdir), "--drafter", str(ddir), "--prompts", str(prompts), "--max-new-tokens", "4"]
    res = run_main(*base, "--backend", "nope")
    assert res.exit_code == 2 and all(name in res.stderr for name in names()) and "tensorrt" in names()
    out = tmp_path / "res.json"
    res = CliRunner().invoke(cli, base + ["--backend", "torch", "--json", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["config"]["backend"] == "torch" and d["lossless_mismatches"] == 0
    for command in ("run", "bench"):
        help_text = CliRunner().invoke(cli, [command, "--help"]).output
        assert "--backend" in help_text and all(name in help_text for name in names())
    res = run_main(*base, "--backend", "tensorrt")  # accepted; it reads engines, not a drafter artifact
    assert res.exit_code == 1 and "export it first with `specpress export trt" in res.stderr, res.stderr


def bench_json(tmp_path, args, name="res.json"):
    out = tmp_path / name
    res = CliRunner().invoke(cli, ["bench", *args, "--json", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text()), res.output


def test_compare_drafter_interleaves_a_second_drafter(tmp_path):
    """The compared drafter decodes the same prompts in the same process: its tau and outputs equal its own
    bench run's (interleaving changes nothing computed), and the JSON carries both drafters' medians."""
    target, tdir, ddir, prompts = setup(tmp_path)
    other = save_drafter(make("eagle3", target, seed=3), tmp_path / "other")
    common = ["--target", str(tdir), "--prompts", str(prompts), "--max-new-tokens", "12", "--policy", "chain:3"]
    d, output = bench_json(tmp_path, [*common, "--drafter", str(ddir), "--compare-drafter", str(other)])
    alone, _ = bench_json(tmp_path, [*common, "--drafter", str(other)], "alone.json")
    first, _ = bench_json(tmp_path, [*common, "--drafter", str(ddir)], "first.json")
    c = d["compare"]
    assert c["drafter"] == str(other) and c["backend"] == "torch" and d["config"]["compare"]["drafter"] == str(other)
    assert c["tau"] == alone["tau"] and c["histogram"] == alone["histogram"] and c["lossless_mismatches"] == 0
    assert d["tau"] == first["tau"] and d["outputs"] == first["outputs"]
    assert c["drafter_bytes"] == alone["drafter_bytes"] > 0
    for name in ("draft_forward_ms", "round_ms"):
        assert c[f"{name}_median"] > 0 and c[f"base_{name}_median"] > 0
        assert c[f"{name}_ratio"] == pytest.approx(c[f"{name}_median"] / c[f"base_{name}_median"])
    assert "compare" in output and "lossless mismatches 0" in output


def test_compare_options_need_their_partners(tmp_path):
    _, tdir, ddir, prompts = setup(tmp_path)
    base = ["bench", "--target", str(tdir), "--prompts", str(prompts), "--max-new-tokens", "4"]
    res = run_main(*base, "--compare-drafter", ddir)
    assert res.exit_code == 2 and "pass --drafter too" in res.stderr
    res = run_main(*base, "--drafter", ddir, "--compare-backend", "torch")
    assert res.exit_code == 2 and "pass --compare-drafter too" in res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("with_drafter", [False, True])
def test_compile_target_compiles_the_target_for_both_sides(tmp_path, with_drafter):
    """--compile-target: Inductor compiles the target (no drafter compiled), warm-up runs both ways, and the
    speculative outputs still equal the (compiled) plain baseline."""
    import torch._dynamo

    _, tdir, ddir, prompts = setup(tmp_path)
    args = ["--target", str(tdir), "--prompts", str(prompts), "--max-new-tokens", "10", "--compile-target"]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        d, _ = bench_json(tmp_path, args + (["--drafter", str(ddir), "--policy", "chain:3"] if with_drafter else []))
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    finally:
        torch._dynamo.reset()
    assert d["config"]["compile_target"] is True and d["config"]["compile"] is False
    assert d["config"]["warmup_prompts"] == 3 and d["lossless_mismatches"] == 0
