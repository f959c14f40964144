"""Issue 21 as a hostile user meets it at the command line: outputs are checked before any work (inputs never
destroyed, unwritable places found first, one writer per output), interrupted runs say how to continue,
and windows longer than the target's context (or than memory) are refused up front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
from pathlib import Path
from click.testing import CliRunner
from drafters_common import saved_target_and_drafter, stop_regen_at_batch

from specpress.artifacts import hold_lock, umask
from specpress.cli import cli
from specpress.errors import DataError, Interrupted, RequestError

TRAIN = ["--steps", "3", "--batch", "2", "--seq-len", "16", "--draft-vocab", "40"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    tdir, data, drafter = saved_target_and_drafter(root)
    return root, tdir, data, drafter


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a command loads the target: its refusal must come before any work."""
    from specpress.models.target import TargetModel

    monkeypatch.setattr(TargetModel, "__init__", lambda *a, **k: pytest.fail("built the target before refusing"))


def commands(root, tdir, data, drafter, out):
    return {
        "distill": ["distill", "--target", tdir, "--family", "eagle3", "--data", data, "--out", out, *TRAIN],
        "quantize": ["quantize", "--drafter", drafter, "--out", out, "--scheme", "int8", "--target", tdir,
                     "--data", data, "--seq-len", "16", "--batch", "2"],
        "prune": ["prune", "--drafter", drafter, "--out", out, "--ffn", "0.5", "--target", tdir, "--data", data,
                  "--seq-len", "16", "--batch", "2"],
        "regenerate": ["regenerate", "--target", tdir, "--data", data, "--out", out, "--sequences", "2",
                       "--prompt-tokens", "4", "--new-tokens", "4"],
    }


@pytest.mark.parametrize("cmd", ["distill", "quantize", "prune", "regenerate"])
def test_unwritable_out_is_refused_before_any_work(setup, cmd, no_loading):
    root, tdir, data, drafter = setup
    blocker = root / "a-file"
    blocker.write_text("x")
    res = invoke(*commands(root, tdir, data, drafter, blocker / "sub" / "out")[cmd])
    assert isinstance(res.exception, RequestError), (res.output, res.exception)
    assert "is a file, not a directory" in str(res.exception)


def test_bench_json_is_checked_before_decoding(setup, no_loading):
    root, tdir, _, _ = setup
    prompts = root / "p.jsonl"
    prompts.write_text('{"input_ids": [1, 2]}\n')
    (root / "a-file2").write_text("x")
    res = invoke("bench", "--target", tdir, "--prompts", prompts, "--max-new-tokens", "2",
                 "--json", root / "a-file2" / "m.json")
    assert isinstance(res.exception, RequestError) and "is a file, not a directory" in str(res.exception)
    res = invoke("bench", "--target", tdir, "--prompts", prompts, "--max-new-tokens", "2", "--json", prompts)
    assert isinstance(res.exception, RequestError) and "would destroy the input" in str(res.exception)


def test_read_only_directory_is_refused(setup, tmp_path, no_loading):
    root, tdir, data, drafter = setup
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    # root writes into a 0555 directory, but not into procfs: CI runs as root, so the test still bites there
    parent = Path("/proc/self") if os.geteuid() == 0 else ro
    try:
        res = invoke(*commands(root, tdir, data, drafter, parent / "out")["quantize"])
        assert isinstance(res.exception, RequestError) and "cannot write" in str(res.exception)
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("cmd, where", [("distill", "target"), ("quantize", "drafter"), ("prune", "inside"),
                                        ("regenerate", "data"), ("distill", "parent")])
def test_out_that_is_contains_or_lies_inside_an_input_is_refused_even_with_force(setup, cmd, where, no_loading):
    root, tdir, data, drafter = setup
    out = {"target": tdir, "drafter": drafter, "inside": drafter / "sub", "data": data, "parent": root}[where]
    before = sorted(p.name for p in root.rglob("*"))
    res = invoke(*commands(root, tdir, data, drafter, out)[cmd], "--force")
    assert isinstance(res.exception, RequestError), (res.output, res.exception)
    assert "would destroy the input" in str(res.exception) and "even with --force" in str(res.exception)
    assert sorted(p.name for p in root.rglob("*")) == before


@contextmanager
def held_elsewhere(out):
    """Another process holding the writer's lock on `out`; yields its pid."""
    code = ("import sys, time\nfrom specpress.artifacts import hold_lock\n"
            "with hold_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_a_second_writer_fails_at_once_naming_the_first(setup, tmp_path, no_loading):
    root, tdir, data, drafter = setup
    out = tmp_path / "q"
    with held_elsewhere(out) as pid:
        res = invoke(*commands(root, tdir, data, drafter, out)["quantize"])
    assert isinstance(res.exception, RequestError) and f"pid {pid}" in str(res.exception)
    assert "being written by another specpress process" in str(res.exception)
    assert not out.exists()
    with hold_lock(out):  # the holder is gone: the lock is free again (and reentrant in one process)
        with hold_lock(out):
            pass
    assert not (tmp_path / ".q.lock").exists()  # released and cleaned up


def test_partial_runs_need_resume_or_force_and_ctrl_c_says_how_to_continue(setup, tmp_path, monkeypatch):
    root, tdir, data, drafter = setup
    out = tmp_path / "d"
    args = commands(root, tdir, data, drafter, out)["distill"]
    import specpress.compress.progress as progress

    real = progress.TrainProgress.update

    def stop_at_2(self, step, recent):
        real(self, step, recent)
        if step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(progress.TrainProgress, "update", stop_at_2)
    res = invoke(*args, "--checkpoint-minutes", "100")
    assert isinstance(res.exception, Interrupted) and res.exception.exit_code == 130
    assert f"step 2 of 3 saved in {out}.partial" in str(res.exception) and "--resume" in str(res.exception)
    monkeypatch.setattr(progress.TrainProgress, "update", real)

    res = invoke(*args)  # a rerun without --resume would discard the checkpoint: refused
    assert isinstance(res.exception, RequestError) and "--resume" in str(res.exception)
    assert (out.with_name("d.partial")).is_dir()
    res = invoke(*args, "--resume")
    assert res.exit_code == 0, (res.output, res.exception)
    assert not out.with_name("d.partial").exists()

    res = invoke(*commands(root, tdir, data, drafter, tmp_path / "e")["distill"], "--resume")
    assert res.exit_code == 0, (res.output, res.exception)
    assert "no interrupted run" in res.output and "starting from the beginning" in res.output

    (tmp_path / "f.partial").mkdir()
    res = invoke(*commands(root, tdir, data, drafter, tmp_path / "f")["distill"], "--force")
    assert res.exit_code == 0 and "discarding the interrupted run" in res.output


def test_regenerate_ctrl_c_says_what_was_saved(setup, tmp_path, monkeypatch):
    root, tdir, data, drafter = setup
    import specpress.compress.regen as regen

    real = stop_regen_at_batch(monkeypatch)
    out = tmp_path / "r.jsonl"
    args = [*commands(root, tdir, data, drafter, out)["regenerate"], "--batch", "1"]
    res = invoke(*args)
    assert isinstance(res.exception, Interrupted)
    assert f"1 of 2 sequences saved in {out}.partial" in str(res.exception)
    monkeypatch.setattr(regen, "continue_batch", real)
    res = invoke(*args)
    assert isinstance(res.exception, RequestError) and "--resume" in str(res.exception)
    res = invoke(*args, "--resume")
    assert res.exit_code == 0 and len(out.read_text().splitlines()) == 2, (res.output, res.exception)
    res = invoke(*commands(root, tdir, data, drafter, tmp_path / "fresh.jsonl")["regenerate"], "--resume")
    assert res.exit_code == 0 and "starting from the beginning" in res.output, (res.output, res.exception)


def test_ctrl_c_in_gptq_and_bench_says_what_was_kept_not_aborted(setup, tmp_path, monkeypatch):
    """Issue 57, item 5: Ctrl-C in quantize --method gptq or bench printed 'aborted' and nothing else. A command
    with nothing to resume says that nothing was written to its output, that what was there stands, and how to
    go on; exit 130 (cli.main, as a shell runs it)."""
    import shutil

    from cli_common import run_main

    import specpress.compress.quantize.gptq as gptq

    root, tdir, data, drafter = setup

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(gptq, "collect_hessians", ctrl_c)
    out = tmp_path / "q"
    shutil.copytree(drafter, out)  # an earlier quantize output, replaced with --force
    before = (out / "model.safetensors").read_bytes()
    res = run_main("quantize", "--drafter", drafter, "--out", out, "--scheme", "int8", "--method", "gptq", "--target",
                   tdir, "--data", data, "--seq-len", "16", "--batch", "2", "--calib-batches", "1", "--force")
    assert res.exit_code == 130, (res.exit_code, res.stderr)
    last = res.stderr.strip().splitlines()[-1]
    assert last == (f"error: interrupted: nothing was written to {out} (it is written only when the command "
                    f"finishes); the {out} that was there is untouched; run the same command again to start over"), \
        res.stderr
    assert "aborted" not in res.stderr and (out / "model.safetensors").read_bytes() == before

    import specpress.decode.bench_pipeline as bench_pipeline

    monkeypatch.setattr(bench_pipeline, "run_bench", ctrl_c)
    prompts = root / "p-ctrl-c.jsonl"
    prompts.write_text('{"input_ids": [1, 2]}\n')
    bench = ["bench", "--target", tdir, "--prompts", prompts, "--max-new-tokens", "2"]
    res = run_main(*bench, "--json", tmp_path / "m.json")
    assert res.exit_code == 130 and f"error: interrupted: nothing was written to {tmp_path / 'm.json'}" in res.stderr
    res = run_main(*bench)  # no output claimed: nothing written, said as such
    assert res.exit_code == 130, res.stderr
    assert res.stderr.strip().splitlines()[-1] == ("error: interrupted: nothing was written; run the same command "
                                                   "again to start over"), res.stderr


def test_outputs_are_readable_like_any_other_file(setup, tmp_path):
    root, tdir, data, drafter = setup
    out = tmp_path / "q"
    res = invoke(*commands(root, tdir, data, drafter, out)["quantize"])
    assert res.exit_code == 0, (res.output, res.exception)
    for f in out.iterdir():
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask(), f
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask()


def test_seq_len_past_the_context_or_memory_is_refused(setup, tmp_path, no_loading):
    root, tdir, data, drafter = setup
    res = invoke(*commands(root, tdir, data, drafter, tmp_path / "a")["distill"][:-6], "--seq-len", "1024",
                 "--steps", "1")
    assert isinstance(res.exception, RequestError) and "longer than the target's context (128" in str(res.exception)
    big = tmp_path / "big-context"
    big.mkdir()
    for f in tdir.iterdir():
        (big / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((big / "config.json").read_text())
    (big / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 10 ** 7}))
    res = invoke("distill", "--target", big, "--family", "eagle3", "--data", data, "--out", tmp_path / "b",
                 "--steps", "1", "--seq-len", "1000000")
    assert isinstance(res.exception, RequestError) and "needs at least" in str(res.exception)
    assert "available" in str(res.exception)
    res = invoke(*commands(root, big, data, drafter, tmp_path / "c")["regenerate"][:-4], "--prompt-tokens",
                 "900000", "--new-tokens", "4", "--batch", "64")
    assert isinstance(res.exception, RequestError) and "--prompt-tokens 900000" in str(res.exception)


def test_malformed_inputs_are_named(setup, tmp_path):
    root, tdir, data, drafter = setup
    bad = tmp_path / "p.jsonl"
    bad.write_bytes(b'{"prompt": "ok"}\n{"prompt": "\xff\xfe"}\n')
    res = invoke("bench", "--target", tdir, "--prompts", bad, "--max-new-tokens", "2")
    assert isinstance(res.exception, DataError) and f"{bad}:2: not UTF-8" in str(res.exception)
    res = invoke("bench", "--target", tdir, "--prompts", tmp_path, "--max-new-tokens", "2")
    assert isinstance(res.exception, DataError) and "is a directory" in str(res.exception)

    q = tmp_path / "q"
    assert invoke(*commands(root, tdir, data, drafter, q)["quantize"]).exit_code == 0
    res = invoke(*commands(root, tdir, data, drafter, tmp_path / "ft")["distill"], "--init", q)
    assert isinstance(res.exception, RequestError) and "is quantized (int8)" in str(res.exception)

    trunc = tmp_path / "trunc"
    trunc.mkdir()
    for f in drafter.iterdir():
        (trunc / f.name).write_bytes(f.read_bytes())
    w = trunc / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    res = CliRunner().invoke(cli, ["inspect", str(trunc)])
    assert res.exit_code != 0 and "truncated" in str(res.exception) and str(w) in str(res.exception)
