"""A whole sweep on tiny random models (seconds): results, resume, failures, refusal, tables, plots, search."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from drafters_common import V, lm_sweep_inputs

from specpress.cli import cli
from specpress.errors import ConfigError, DataError, RequestError, UsageError
from specpress.stats import pareto_flags
from specpress.sweep.driver import cores
from specpress.sweep.recipe import load_recipe
from specpress.sweep.results import guard_out, read_results

RECIPE = {
    "target": "target",
    "drafter": "drafter",
    "prompts": "prompts.jsonl",
    "policies": ["chain:3"],
    "max_new_tokens": 12,
    "calibration": "ids.jsonl",
    "agreement_data": "ids.jsonl",
    "agreement_batches": 1,
    "grid": [
        {"quantize": {"scheme": "int8"}},
        {"quantize": {"scheme": "int4", "group_size": 8}},
        {"prune": {"ffn": 20}},  # 20 of the lm drafter's 40 FFN channels stay
        {"prune": {"vocab": 10}},  # an lm drafter has no draft vocabulary to cut: this point fails
    ],
    "tolerate_failures": True,  # ... on purpose: the sweep exits 0 and says the failure was tolerated
}
FIELDS = ("point", "steps", "provenance", "bytes", "bits_per_param", "tau", "ar", "histogram", "per_prompt_tau",
          "tokens_per_s", "speedup", "lossless_mismatches", "backend", "policy", "temperature", "agreement",
          "wall_s", "paired", "retention", "bytes_pct_base16", "pareto", "recipe")


def write_setup(root: Path) -> Path:
    """A tiny target, an lm drafter holding the target's own weights (every draft accepted until it is
    compressed), prompts and token data as input_ids; returns the recipe file."""
    lm_sweep_inputs(root, prompts=8)
    (root / "recipe.yaml").write_text(yaml.safe_dump(RECIPE))
    return root / "recipe.yaml"


def sweep(*args: str):
    return CliRunner().invoke(cli, ["sweep", *map(str, args)])


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    recipe = write_setup(root)
    res = sweep(recipe, "--out", root / "out")
    assert res.exit_code == 0, (res.output, res.exception)
    return root, recipe, root / "out", res.output


def by_point(out: Path) -> dict[str, dict]:
    return {r["point"]: r for r in read_results(out)}


def test_results_have_every_field_and_paired_stats(done):
    root, _, out, output = done
    recs = by_point(out)
    assert list(recs) == ["base", "int8", "int4-g8", "ffn20", "vocab10"]
    for pid in ("base", "int8", "int4-g8", "ffn20"):
        r = recs[pid]
        assert r["status"] == "ok" and all(f in r for f in FIELDS), sorted(set(FIELDS) - set(r))
        assert len(r["per_prompt_tau"]) == 8 and r["lossless_mismatches"] == 0
        assert len(r["agreement"]) == 1 and r["prompts"] == 8
    base = recs["base"]
    assert base["tau"] == pytest.approx(4.0) and base["retention"] == 1.0 and base["paired"] is None
    assert base["bytes_pct_base16"] == pytest.approx(200, rel=0.01)  # stored in fp32
    assert recs["int4-g8"]["bytes"] < recs["int8"]["bytes"] < recs["ffn20"]["bytes"] < base["bytes"]
    ffn = recs["ffn20"]
    assert ffn["paired"]["resolved"] and ffn["paired"]["ci"][1] < 0 and ffn["retention"] < 0.9
    assert ffn["retention"] == pytest.approx(ffn["tau"] / base["tau"])
    assert [s for s in ffn["provenance"] if s["step"] == "prune"]
    assert recs["int8"]["steps"] == [{"quantize": {"scheme": "int8"}}]
    for pid in ("int8", "ffn20"):  # float_dtype auto: an fp32 base's compressed points store bf16
        assert json.loads((out / "points" / pid / "drafter" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert ffn["bytes_pct_base16"] == pytest.approx(100 * ffn["bytes"] / (base["bytes"] / 2))


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(done):
    _, _, out, output = done
    bad = by_point(out)["vocab10"]
    assert bad["status"] == "failed" and "eagle3" in bad["error"] and bad["traceback"]
    assert "1 of 5 runs failed: vocab10" in output and "tolerated: tolerate_failures: true" in output


def test_failed_points_make_the_sweep_exit_non_zero(done, tmp_path):
    from specpress.errors import SweepFailed

    root, _, _, _ = done
    strict = root / "strict.yaml"
    strict.write_text(yaml.safe_dump({**RECIPE, "grid": RECIPE["grid"][3:], "tolerate_failures": False}))
    res = sweep(strict, "--out", tmp_path / "s")
    assert isinstance(res.exception, SweepFailed) and res.exit_code == 1
    assert "1 of 2 runs failed: vocab10" in str(res.exception) and "--tolerate-failures" in str(res.exception)
    res = sweep(strict, "--out", tmp_path / "s", "--resume", "--tolerate-failures")
    assert res.exit_code == 0, (res.output, res.exception)
    assert "tolerated: --tolerate-failures" in res.output


def test_data_outside_the_vocabulary_is_refused_when_the_sweep_opens(done, tmp_path):
    root, _, _, _ = done
    (tmp_path / "big.jsonl").write_text(json.dumps({"input_ids": [1, 2, V + 5] * 60}) + "\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**RECIPE, "target": str(root / "target"), "drafter": str(root / "drafter"),
                                   "prompts": str(root / "prompts.jsonl"), "calibration": "big.jsonl",
                                   "agreement_data": "big.jsonl",
                                   "grid": RECIPE["grid"][:1]}))
    res = sweep(bad, "--out", tmp_path / "o")
    assert isinstance(res.exception, DataError), (res.output, res.exception)
    assert f"token id {V + 5} is outside the target's vocabulary" in str(res.exception)
    assert not (tmp_path / "o" / "results.jsonl").exists()  # refused before any point ran


def test_recipe_files_that_are_not_utf8_or_repeat_a_key_are_refused(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_bytes(b"target: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_recipe(f)
    f.write_text("target: a\ndrafter: b\ntarget: c\n")
    with pytest.raises(ConfigError, match="line 3: key 'target' is given twice"):
        load_recipe(f)


def test_a_second_sweep_into_the_same_out_fails_at_once(done, tmp_path):
    from specpress.artifacts import hold_lock

    _, recipe, _, _ = done
    with hold_lock(tmp_path / "busy"):
        code = ("import sys\nfrom specpress.cli import main\nmain(sys.argv[1:])")
        import subprocess
        import sys

        proc = subprocess.run([sys.executable, "-c", code, "sweep", str(recipe), "--out", str(tmp_path / "busy")],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "being written by another specpress process" in proc.stderr
    assert f"pid {__import__('os').getpid()}" in proc.stderr


def test_pareto_flags_tables_and_plots(done):
    _, _, out, output = done
    ok = [r for r in read_results(out) if r["status"] == "ok"]
    assert [r["pareto"] for r in ok] == pareto_flags([(r["bytes"], r["tau"]) for r in ok])
    assert by_point(out)["int4-g8"]["pareto"]  # the smallest is always on the front
    md = (out / "table.md").read_text()
    for col in ("point", "bytes", "% base@16-bit", "bits/param", "τ", "retention", "Δτ [95 % CI]", "resolved",
                "acc@1", "speedup", "lossless"):
        assert col in md
    assert "| ffn20 |" in md and "failed:" in md
    csv = (out / "table.csv").read_text().splitlines()
    assert csv[0].startswith("point,policy,temperature") and len(csv) == 6
    for name in ("tau_vs_bytes", "speedup_vs_bytes", "acceptance"):
        for ext in ("png", "svg"):
            assert (out / "plots" / f"{name}.{ext}").stat().st_size > 1000
    assert "int4-g8" in output and "Δτ" in output


def test_resume_skips_finished_points(done, tmp_path, monkeypatch):
    import specpress.sweep.run as run

    root, recipe, out, _ = done
    calls = []
    real = run.bench_speculative
    monkeypatch.setattr(run, "bench_speculative", lambda *a, **k: calls.append(k["config"]["point"]) or real(*a, **k))
    res = sweep(recipe, "--out", out)
    assert res.exit_code != 0 and "--resume" in str(res.exception)  # finished results: not without --resume
    mine = tmp_path / "out"
    shutil.copytree(out, mine)
    res = sweep(recipe, "--out", mine, "--resume")
    assert res.exit_code == 0, res.output
    assert calls == []  # every ok run was skipped; the failed point was retried (it fails before benching)
    lines = (mine / "results.jsonl").read_text().splitlines()
    (mine / "results.jsonl").write_text("\n".join(ln for ln in lines if '"point": "int8"' not in ln) + "\n")
    res = sweep(recipe, "--out", mine, "--resume")
    assert res.exit_code == 0, res.output
    assert calls == ["int8"]
    recs = by_point(mine)
    assert recs["int8"]["artifact_reused"] and len(recs) == 5


def test_changing_float_dtype_rebuilds_the_points(done, tmp_path):
    """A point built with bf16 floats is not reused when the recipe asks for fp32 (it is in the artifact key)."""
    root, _, out, _ = done
    changed = root / "fp32.yaml"
    changed.write_text(yaml.safe_dump({**RECIPE, "float_dtype": "fp32", "grid": [{"quantize": {"scheme": "int8"}}]}))
    mine = tmp_path / "o"
    shutil.copytree(out, mine)
    res = sweep(changed, "--out", mine, "--force")
    assert res.exit_code == 0, res.output
    assert by_point(mine)["int8"]["artifact_reused"] is False
    assert json.loads((mine / "points" / "int8" / "drafter" / "config.json").read_text())["torch_dtype"] == "float32"


def test_refuses_another_recipes_out_dir(done, tmp_path):
    root, _, out, _ = done
    other = load_recipe(root / "recipe.yaml")
    changed = root / "changed.yaml"
    changed.write_text(yaml.safe_dump({**RECIPE, "max_new_tokens": 13}))
    res = sweep(changed, "--out", out, "--resume")
    assert res.exit_code != 0 and "different recipe" in str(res.exception)
    mine = tmp_path / "o"
    shutil.copytree(out, mine)
    guard_out(mine, load_recipe(changed), resume=False, force=True)  # --force: previous outputs cleared
    assert not (mine / "results.jsonl").exists() and (mine / "points" / "int8").is_dir()
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "x.txt").write_text("mine")
    with pytest.raises(RequestError, match="not a sweep output"):
        guard_out(tmp_path / "foreign", other, resume=False, force=False)


def test_find_smallest_evaluates_fewer_points_than_the_grid(done, tmp_path):
    root, recipe, _, _ = done
    res = sweep(recipe, "--out", tmp_path / "s", "--find-smallest", "--max-tau-loss", "3%")
    assert res.exit_code == 0, (res.output, res.exception)
    s = json.loads((tmp_path / "s" / "search.json").read_text())
    assert s["threshold"] == pytest.approx(0.97) and s["grid"] == 3 and s["unsized"][0]["point"] == "vocab10"
    assert 1 <= s["evaluated"] < 3 and s["found"] in ("int4-g8", "int8")
    sizes = {c["id"]: c["bytes"] for c in s["candidates"]}
    for t in s["trials"]:
        assert t["bytes"] == sizes[t["id"]]  # the cheap sizing build predicts the artifact's bytes exactly
    assert "tried 1:" in res.output and s["found"] in res.output
    assert {r["point"] for r in read_results(tmp_path / "s")} == {"base", *(t["id"] for t in s["trials"])}


def test_distilled_base_drafter_is_cached(tmp_path, monkeypatch):
    import specpress.compress.distill as distill_mod
    from specpress.sweep.context import resolve_drafter

    write_setup(tmp_path)
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({**RECIPE, "drafter": {"distill": {
        "family": "lm", "steps": 2, "batch": 2, "seq_len": 16, "layers": 1, "eval_batches": 1,
        "data": "ids.jsonl"}}}))
    recipe = load_recipe(tmp_path / "r.yaml")
    first = resolve_drafter(recipe, tmp_path / "target", log=lambda m: None)
    assert (first / "config.json").is_file() and first.parent == tmp_path / "cache" / "drafters"
    monkeypatch.setattr(distill_mod, "distill", lambda *a, **k: pytest.fail("distilled again"))
    assert resolve_drafter(recipe, tmp_path / "target", log=lambda m: None) == first


def test_jobs_run_points_in_parallel_processes(done, tmp_path):
    root, _, serial, _ = done
    small = root / "parallel.yaml"
    small.write_text(yaml.safe_dump({**RECIPE, "grid": RECIPE["grid"][:2]}))
    res = sweep(small, "--out", tmp_path / "p", "--jobs", "2")
    assert res.exit_code == 0, (res.output, res.exception)
    assert "2 processes" in res.output
    recs = by_point(tmp_path / "p")
    assert set(recs) == {"base", "int8", "int4-g8"} and all(r["status"] == "ok" for r in recs.values())
    for pid in ("int8", "int4-g8"):  # the same numbers as the serial sweep: greedy decoding is deterministic
        assert recs[pid]["per_prompt_tau"] == by_point(serial)[pid]["per_prompt_tau"]
        assert recs[pid]["bench_config"]["threads"] == max(1, cores() // 2) and recs[pid]["paired"] is not None


def test_a_recipe_distill_window_past_the_context_is_refused_before_training(tmp_path, monkeypatch):
    from specpress.sweep.context import resolve_drafter

    write_setup(tmp_path)
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({**RECIPE, "drafter": {"distill": {
        "family": "lm", "steps": 2, "batch": 2, "seq_len": 4096, "layers": 1, "data": "ids.jsonl"}}}))
    with pytest.raises(RequestError, match="drafter: distill: seq_len 4096 is longer than the target's context"):
        resolve_drafter(load_recipe(tmp_path / "r.yaml"), tmp_path / "target", log=lambda m: None)
    assert not (tmp_path / "cache" / "drafters").exists()


def test_a_quantize_step_recovers_with_recover_steps(tmp_path):
    """`recover_steps` in a quantize stage: the point recovers (recorded in its provenance, id suffix -rN), stores
    the same bytes as the point without recovery, sizes as it (find-smallest's cheap build), and a partial
    recovery left by an interrupted build is continued, not restarted, when its key matches."""
    from specpress.sweep.context import dir_digest, open_context
    from specpress.sweep.driver import sizing_bytes
    from specpress.sweep.grid import expand_grid
    from specpress.sweep.recipe import load_recipe as load
    from specpress.sweep.run import build_point

    recipe = write_setup(tmp_path)
    spec = yaml.safe_load(recipe.read_text())
    spec["grid"] = [{"quantize": {"scheme": "int2", "group_size": 8, "seq_len": 16, "recover_batch": 2,
                                  "recover_steps": [0, 3]}}]
    spec.pop("tolerate_failures")
    recipe.write_text(yaml.safe_dump(spec))
    res = sweep(recipe, "--out", tmp_path / "out")
    assert res.exit_code == 0, (res.output, res.exception)
    recs = by_point(tmp_path / "out")
    assert sorted(recs) == ["base", "int2-g8", "int2-g8-sl16-r3-rb2"]
    plain, rec = recs["int2-g8"], recs["int2-g8-sl16-r3-rb2"]
    assert rec["status"] == "ok" and rec["lossless_mismatches"] == 0 and rec["bytes"] == plain["bytes"]
    step = [s for s in rec["provenance"] if s["step"] == "quantize"][-1]
    assert step["recovery"]["steps"] == 3 and step["recovery"]["config"]["batch"] == 2
    assert step["recovery"]["data"] and "recovery" not in [s for s in plain["provenance"]
                                                           if s["step"] == "quantize"][-1]
    assert not (tmp_path / "out" / "points" / "int2-g8-sl16-r3-rb2" / "recovery.partial").exists()
    points, _ = expand_grid(spec["grid"])
    r = load(recipe)
    ctx = open_context(r, tmp_path / "again", tmp_path / "target", tmp_path / "drafter",
                       dir_digest(tmp_path / "drafter"))
    from specpress.models.drafter_io import load_drafter

    assert sizing_bytes(ctx, points[2], load_drafter(tmp_path / "drafter", ctx.target)) == rec["bytes"]
    import safetensors.torch as st

    from specpress.compress.progress import TrainProgress

    real = TrainProgress.update

    def interrupted(self, step, *a, **k):  # Ctrl-C after the second recovery step of a build into a fresh out dir
        if step == 2:
            raise KeyboardInterrupt
        return real(self, step, *a, **k)

    TrainProgress.update = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            build_point(ctx, points[2])
    finally:
        TrainProgress.update = real
    assert (tmp_path / "again" / "points" / points[2].id / "recovery.partial" / "state.pt").is_file()
    art, reused = build_point(ctx, points[2])  # continued from step 2, to the same codes as the uninterrupted run
    assert load_drafter(art).provenance[-1]["recovery"]["resumed_from"] == 2

    a = st.load_file(str(art / "model.safetensors"))
    b = st.load_file(str(tmp_path / "out" / "points" / "int2-g8-sl16-r3-rb2" / "drafter" / "model.safetensors"))
    assert not reused and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _ok_line(lines: list[str], point: str) -> int:
    return next(i for i, ln in enumerate(lines) if json.loads(ln)["point"] == point and '"status": "ok"' in ln)


@pytest.mark.parametrize("edit, words", [
    ({"tau": 99.0}, "tau must be between 1 and 4 (policy chain:3: at most 3 drafted tokens accepted a round"),
    ({"bytes": -5}, "bytes must be a positive integer"),
    ({"tau": 1.5}, "retention"),  # in range, but no longer tau / base tau
    ({"retention": 0.5}, "retention 0.5 is not tau / base tau"),
    ({"status": "great"}, "status must be 'ok' or 'failed'"),
    ({"per_prompt_tau": [0.0]}, "per_prompt_tau[0] must be between 1 and 4"),
])
def test_resume_refuses_a_result_edited_by_hand(done, tmp_path, monkeypatch, edit, words):
    """Issue 57, item 3: a results.jsonl line changed by hand (tau 99.0, bytes -5) was accepted and shown."""
    import specpress.sweep.run as run

    _, recipe, out, _ = done
    mine = tmp_path / "out"
    shutil.copytree(out, mine)
    lines = (mine / "results.jsonl").read_text().splitlines()
    i = _ok_line(lines, "int8")
    lines[i] = json.dumps({**json.loads(lines[i]), **edit})
    (mine / "results.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(run, "bench_speculative", lambda *a, **k: pytest.fail("measured before refusing"))
    res = sweep(recipe, "--out", mine, "--resume")
    assert isinstance(res.exception, RequestError), (res.output, res.exception)
    msg = str(res.exception)
    assert f"{mine / 'results.jsonl'}:{i + 1}: " in msg and words in msg and "remove that line" in msg, msg


def test_resume_drops_a_line_cut_short_and_says_so(done, tmp_path, monkeypatch):
    """A kill mid-write leaves the last line without its newline: dropped with a note, its run measured again."""
    import specpress.sweep.run as run

    _, recipe, out, _ = done
    mine = tmp_path / "out"
    shutil.copytree(out, mine)
    lines = (mine / "results.jsonl").read_text().splitlines()
    i = _ok_line(lines, "int8")
    (mine / "results.jsonl").write_text("".join(ln + "\n" for ln in lines[:i] + lines[i + 1:]) + lines[i][:40])
    calls = []
    real = run.bench_speculative
    monkeypatch.setattr(run, "bench_speculative", lambda *a, **k: calls.append(k["config"]["point"]) or real(*a, **k))
    res = sweep(recipe, "--out", mine, "--resume")
    assert res.exit_code == 0, (res.output, res.exception)
    flat = "".join(res.output.split())  # the console wraps long lines
    assert f"note:{mine / 'results.jsonl'}:{len(lines)}wascutshort" in flat, res.output
    assert calls == ["int8"] and by_point(mine)["int8"]["status"] == "ok"


def test_ctrl_c_says_how_many_runs_are_kept_and_how_to_go_on(done, tmp_path, monkeypatch):
    """Issue 57, item 5: a Ctrl-C mid-sweep says what results.jsonl keeps and that --resume continues."""
    import specpress.sweep.run as run
    from specpress.errors import Interrupted

    _, recipe, out, _ = done
    mine = tmp_path / "out"
    shutil.copytree(out, mine)
    lines = (mine / "results.jsonl").read_text().splitlines()
    (mine / "results.jsonl").write_text("".join(ln + "\n" for ln in lines if '"point": "int8"' not in ln))

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "bench_speculative", ctrl_c)
    res = sweep(recipe, "--out", mine, "--resume")
    assert isinstance(res.exception, Interrupted) and res.exception.exit_code == 130, (res.output, res.exception)
    assert str(res.exception) == (f"interrupted: 3 finished run(s) kept in {mine / 'results.jsonl'} (the run in "
                                  f"progress is lost); to continue, run the same command again with --resume")


def test_a_grid_of_hundreds_of_runs_says_so_and_needs_allow_large(done, tmp_path, monkeypatch):
    """Issue 57, item 7: a recipe expanding to hundreds of runs started without a word. Past 64 points the sweep
    is refused (exit 2) with the count and a lower bound on the time, before anything is built; --allow-large
    runs it, with the same words as a note. The recipes CI runs stay below the threshold."""
    from specpress.sweep import driver

    root, _, _, _ = done
    big = {**RECIPE, "target": str(root / "target"), "drafter": str(root / "drafter"),
           "prompts": str(root / "prompts.jsonl"), "calibration": str(root / "ids.jsonl"),
           "agreement_data": str(root / "ids.jsonl"), "policies": ["chain:3", "chain:2"],
           "grid": [{"prune": {"ffn": list(range(1, 40))}},
                    {"chain": [{"prune": {"ffn": list(range(1, 40))}}, {"quantize": {"scheme": "int8"}}]}]}
    recipe = tmp_path / "big.yaml"
    recipe.write_text(yaml.safe_dump(big))
    assert len(load_recipe(recipe).points) == 79
    monkeypatch.setattr(driver.Sweep, "open", lambda self: pytest.fail("opened the sweep before refusing"))
    res = sweep(recipe, "--out", tmp_path / "o")
    assert isinstance(res.exception, UsageError) and res.exception.exit_code == 2, (res.output, res.exception)
    msg = str(res.exception)
    assert "the recipe expands to 79 points x 2 run(s) = 158 benched runs (" in msg, msg
    assert "target forwards: at least " in msg and "needs --allow-large" in msg, msg
    assert not (tmp_path / "o").exists()

    class Opened(Exception):
        pass

    def opened(self):
        raise Opened

    monkeypatch.setattr(driver.Sweep, "open", opened)
    res = sweep(recipe, "--out", tmp_path / "o", "--allow-large")
    assert isinstance(res.exception, Opened), (res.output, res.exception)
    assert "note: the recipe expands to 79 points x 2 run(s)" in res.output and "(--allow-large)" in res.output
    from specpress.sweep.size import LARGE_GRID

    assert LARGE_GRID < 79
    for f in sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml")):
        assert len(load_recipe(f).points) <= LARGE_GRID, f  # what the repo ships runs without the flag
