"""Issue 35, tracebacks that should be messages: hostile JSON in manifests, configs and prompts; exports whose
manifest was edited; a full disk inside onnx.save, torch.save of a checkpoint and the lock write; leftovers
of a killed run, removed by the next one; and the messages that misled (a torch backend given an export, a
drafter of another target exported silently, a damaged cache entry's warning naming an --out never given).

A full disk is the real thing where this process may mount a small tmpfs (root, as on the development
machines), else the write is made to fail with ENOSPC where it happens."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from drafters_common import make, random_eos_target, saved_target_and_drafter

from specpress.cli import cli
from specpress.errors import CheckpointError, DataError, RequestError, SpecpressError, WriteError


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tb")
    tdir, data, drafter = saved_target_and_drafter(root)
    res = invoke("export", "onnx", "--drafter", drafter, "--target", tdir, "--out", root / "onnx")
    assert res.exit_code == 0, (res.output, res.exception)
    prompts = root / "p.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n')
    return root, tdir, data, drafter, root / "onnx", prompts


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path / "cache"))


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line(res, kind=SpecpressError, *words: str) -> str:
    assert isinstance(res.exception, kind), (res.output, res.exception)
    msg = str(res.exception)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


NESTED = '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"
BINARY = b'{"format": "specpress-onnx", "x": "\xff\xfe\x00"}'


# ---------------------------------------------------------------------------------------------- hostile JSON


@pytest.mark.parametrize("content, words", [(NESTED, "nested more than 64 levels"), (BINARY, "not UTF-8")])
def test_hostile_json_in_a_manifest_a_config_or_prompts_is_one_line(setup, tmp_path, content, words):
    root, tdir, _, drafter, onnx, prompts = setup
    raw = content.encode() if isinstance(content, str) else content
    export = tmp_path / "onnx"
    shutil.copytree(onnx, export)
    (export / "manifest.json").write_bytes(raw)
    res = invoke("run", "--target", tdir, "--drafter", export, "--backend", "onnxruntime", "--prompt", "def")
    one_line(res, CheckpointError, str(export / "manifest.json"), words)

    model = tmp_path / "target"
    shutil.copytree(tdir, model)
    (model / "config.json").write_bytes(raw)
    one_line(invoke("inspect", model), CheckpointError, str(model / "config.json"), words)

    bad = tmp_path / "p.jsonl"
    bad.write_bytes(b'{"prompt": "def"}\n' + raw.replace(b"\n", b" ") + b"\n")
    res = invoke("bench", "--target", tdir, "--prompts", bad, "--max-new-tokens", 2)
    one_line(res, DataError, f"{bad}:2" if isinstance(content, str) else str(bad), words)


# ---------------------------------------------------------------------------------------------- tampered exports


def _edit(export: Path, edit) -> None:
    raw = json.loads((export / "manifest.json").read_text())
    edit(raw)
    (export / "manifest.json").write_text(json.dumps(raw))


TAMPER = {
    "an output renamed": (lambda m: m["graphs"][1]["outputs"][0].update(name="bogus"),
                          ["step.onnx: the manifest lists outputs", "bogus", "export it again"]),
    "kv heads changed": (lambda m: m["drafter"].update(kv_heads=3),
                         ["step.onnx refused the inputs", "past_key.0", "export it again"]),
    "hidden size changed": (lambda m: m["drafter"].update(hidden_size=7), ["fuse.onnx refused the inputs"]),
    "a field of the wrong type": (lambda m: m["drafter"].update(kv_heads="two"),
                                  ["'kv_heads' must be int, found 'two'", "export onnx"]),
}


@pytest.mark.parametrize("name", list(TAMPER))
def test_an_edited_export_manifest_is_refused_not_a_raw_onnxruntime_error(setup, tmp_path, name):
    _, tdir, _, _, onnx, _ = setup
    edit, words = TAMPER[name]
    export = tmp_path / "onnx"
    shutil.copytree(onnx, export)
    _edit(export, edit)
    res = invoke("run", "--target", tdir, "--drafter", export, "--backend", "onnxruntime", "--prompt", "def",
                 "--max-new-tokens", 4)
    one_line(res, CheckpointError, *words)


# ---------------------------------------------------------------------------------------------- a full disk


@pytest.fixture
def small_disk(tmp_path):
    """(a directory on a 48 KiB tmpfs, True), or (a plain directory, False) where mounting is not allowed."""
    d = tmp_path / "small"
    d.mkdir()
    mounted = os.geteuid() == 0 and shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(d)], capture_output=True).returncode == 0
    yield d, mounted
    if mounted:
        import gc

        gc.collect()  # a writer's file object left open by a failure would keep the mount busy
        if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(d)], check=True)  # detached now, freed when the last file closes


def enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_inside_onnx_save_is_one_line_and_leaves_nothing(setup, small_disk, monkeypatch):
    _, tdir, _, drafter, _, _ = setup
    disk, real = small_disk
    if not real:  # the graphs' writer fails half-way, as it does on a full disk
        import onnx

        def half_then_full(model, path, *a, **k):
            Path(path).write_bytes(b"\0" * 100)
            enospc()

        monkeypatch.setattr(onnx, "save", half_then_full)
    out = disk / "onnx"
    res = invoke("export", "onnx", "--drafter", drafter, "--target", tdir, "--out", out)
    one_line(res, WriteError, str(out), "No space left on device", "the partial write was removed")
    assert sorted(p.name for p in disk.iterdir()) == []  # no .onnx.tmp-*, no lock


def test_a_full_disk_in_a_checkpoint_is_one_line_and_keeps_the_last_one(setup, small_disk, monkeypatch):
    _, tdir, data, _, _, _ = setup
    disk, real = small_disk
    if not real:  # torch.save fails as it does on a full disk: its writer's RuntimeError over the file's OSError
        import torch

        def full_save(obj, f, *a, **k):
            f.write(b"\0" * 100)
            try:
                enospc()
            except OSError as exc:
                raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from exc

        monkeypatch.setattr(torch, "save", full_save)
    out = disk / "d"
    res = invoke("distill", "--target", tdir, "--family", "eagle3", "--data", data, "--out", out, "--steps", 2,
                 "--batch", 2, "--seq-len", 16, "--draft-vocab", 40, "--checkpoint-minutes", 0)
    one_line(res, WriteError, str(disk / "d.partial" / "state.pt"), "No space left on device")
    assert sorted(p.name for p in disk.iterdir()) == []  # no state.pt.tmp-*, no empty partial, no lock


def test_export_target_checks_the_space_its_weights_need_before_loading(setup, small_disk, monkeypatch):
    from specpress import artifacts
    from specpress.models.target import TargetModel

    _, tdir, _, _, _, _ = setup
    disk, real = small_disk
    if not real:
        free = type("Usage", (), {"free": 40_000})
        monkeypatch.setattr(artifacts.shutil, "disk_usage", lambda p: free)
    monkeypatch.setattr(TargetModel, "__init__", lambda *a, **k: pytest.fail("loaded the target first"))
    res = invoke("export", "target", "--target", tdir, "--out", disk / "t")
    one_line(res, RequestError, "needs at least 238,976 bytes", "59,744 parameters at fp32", "free some space")
    assert sorted(p.name for p in disk.iterdir()) == []


def test_a_full_disk_at_the_lock_write_is_one_line(setup, tmp_path, monkeypatch):
    """The lock is a hundred bytes written after the writability probe: a disk that fills in between."""
    from specpress import artifacts

    real_open = open

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, *a):
            return self.f.write(*a)

        def flush(self):
            enospc()

        def __getattr__(self, name):
            return getattr(self.f, name)

    def lock_open(path, *a, **k):
        f = real_open(path, *a, **k)
        return Full(f) if str(path).endswith(".lock") else f

    monkeypatch.setattr(artifacts, "open", lock_open, raising=False)
    _, _, _, drafter, _, _ = setup
    out = tmp_path / "q"
    res = invoke("quantize", "--drafter", drafter, "--scheme", "int8", "--out", out)
    one_line(res, WriteError, ".q.lock", "No space left on device", f"nothing was written to {out}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------- leftovers


def test_leftovers_of_a_killed_export_are_removed_by_the_next_run(setup, tmp_path):
    """SIGKILL mid-export leaves `.onnx.tmp-<pid>-*` (as large as an export) and `.onnx.lock`; the next export
    to that --out removes them and says so."""
    _, tdir, _, drafter, _, _ = setup
    out = tmp_path / "onnx"
    code = ("import sys, time\nfrom specpress import artifacts\nfrom specpress.cli import main\n"
            "real = artifacts.make_readable\n"
            "def stall(p):\n    print('WRITTEN', flush=True); time.sleep(60)\n"
            "artifacts.make_readable = stall\n"
            f"main(['export', 'onnx', '--drafter', {str(drafter)!r}, '--target', {str(tdir)!r}, "
            f"'--out', {str(out)!r}])\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "WRITTEN"  # graphs written, not renamed
        left = [p.name for p in tmp_path.iterdir()]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    assert any(n.startswith(f".onnx.tmp-{proc.pid}-") for n in left) and ".onnx.lock" in left, left
    res = invoke("export", "onnx", "--drafter", drafter, "--target", tdir, "--out", out)
    assert res.exit_code == 0, (res.output, res.exception)
    assert f"removed {tmp_path}/.onnx.tmp-{proc.pid}-" in res.output and "left by an interrupted run" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["onnx"]


def test_a_checkpoint_temp_file_of_a_dead_writer_is_removed(setup, tmp_path):
    _, tdir, data, _, _, _ = setup
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    part = tmp_path / "d.partial"
    part.mkdir()
    (part / f".state.pt.tmp-{dead.pid}").write_bytes(b"\0" * 1000)
    (tmp_path / ".d.lock").write_text(f"pid {dead.pid}: specpress distill\n")  # a lock its holder left
    res = invoke("distill", "--target", tdir, "--family", "eagle3", "--data", data, "--out", tmp_path / "d",
                 "--steps", 2, "--batch", 2, "--seq-len", 16, "--draft-vocab", 40, "--resume")
    assert res.exit_code == 0, (res.output, res.exception)
    assert f".state.pt.tmp-{dead.pid} (1,000 bytes), left by an interrupted run" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_a_replace_killed_between_its_renames_gets_the_old_artifact_back(setup, tmp_path):
    """atomic_dir renames the old artifact to `.<out>.old-<pid>` and the new one into place: a kill between the
    two leaves no <out>; the next claim puts the old one back instead of removing it."""
    _, _, _, drafter, _, _ = setup
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    shutil.copytree(drafter, tmp_path / f".q.old-{dead.pid}")
    res = invoke("quantize", "--drafter", drafter, "--scheme", "int8", "--out", tmp_path / "q")
    one_line(res, RequestError, "already exists", "--force")  # it is back, and an existing output needs --force
    assert (tmp_path / "q" / "model.safetensors").read_bytes() == (drafter / "model.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]


# ---------------------------------------------------------------------------------------------- misleading messages


def test_a_torch_backend_given_an_export_names_the_backend_that_runs_it(setup, monkeypatch):
    from specpress.models.target import TargetModel

    _, tdir, _, _, onnx, prompts = setup
    monkeypatch.setattr(TargetModel, "__init__", lambda *a, **k: pytest.fail("loaded the target first"))
    for args in (["run", "--prompt", "def"], ["bench", "--prompts", prompts, "--max-new-tokens", 2]):
        res = invoke(*args, "--target", tdir, "--drafter", onnx)
        one_line(res, RequestError, f"--drafter {onnx} is an `specpress export onnx` output directory",
                 "pass --backend onnxruntime to run it")


def test_export_onnx_of_a_drafter_for_another_target_warns_as_run_does(setup, tmp_path):
    from specpress.models.drafter_io import save_drafter
    from specpress.models.target import save_target

    _, tdir, _, _, _, _ = setup
    other = random_eos_target()
    with __import__("torch").no_grad():
        for p in other.parameters():
            p.add_(0.01)  # same shape, other weights
    save_target(other, tmp_path / "other")
    drafter = save_drafter(make("eagle3", other), tmp_path / "e3")
    res = invoke("export", "onnx", "--drafter", drafter, "--target", tdir, "--out", tmp_path / "onnx")
    assert res.exit_code == 0, (res.output, res.exception)
    assert f"warning: drafter {drafter} was built for a different target" in res.output
    res = invoke("run", "--target", tdir, "--drafter", drafter, "--prompt", "def", "--max-new-tokens", 2)
    assert f"warning: drafter {drafter} was built for a different target" in res.output  # the same words


def test_a_damaged_cache_manifest_never_mentions_an_out_never_given(setup, tmp_path):
    _, tdir, _, drafter, _, prompts = setup
    args = ["bench", "--target", tdir, "--drafter", drafter, "--backend", "onnxruntime", "--prompts", prompts,
            "--max-new-tokens", 2]
    assert invoke(*args).exit_code == 0
    (entry,) = (tmp_path / "cache" / "onnx").iterdir()
    for damage in (NESTED.encode(), BINARY, b'{"format": "specpress-onnx", "format_version": 3}'):
        (entry / "manifest.json").write_bytes(damage)
        res = invoke(*args)
        assert res.exit_code == 0, (res.output, res.exception)
        assert "failed its check" in res.output and "exporting it again" in res.output
        assert "--out" not in res.output, res.output
    from specpress.export.ondemand import cache_fix
    from specpress.manifest import open_export

    (entry / "manifest.json").write_bytes(BINARY)
    with pytest.raises(CheckpointError) as err:  # what a refusal of the entry says: delete it, never --out
        open_export(entry, cache_fix(entry))
    assert "--out" not in str(err.value) and f"delete {entry}" in str(err.value)


def test_sigterm_saves_the_checkpoint_as_ctrl_c_does(setup, tmp_path):
    """`kill PID` (a scheduler's SIGTERM) during distill: the run stops within seconds, saves its checkpoint and
    says how to resume, exit 130 - as Ctrl-C does; by default SIGTERM would kill it with nothing saved."""
    _, tdir, data, _, _, _ = setup
    out = tmp_path / "d"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "specpress.cli", "distill", "--target", str(tdir), "--family",
                             "eagle3", "--data", str(data), "--out", str(out), "--steps", "100000", "--batch", "2",
                             "--seq-len", "16", "--checkpoint-minutes", "60"],
                            stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stderr is not None
        seen = ""
        while "distill eagle3" not in seen:  # the progress bar: training has started
            line = proc.stderr.readline()
            assert line, seen
            seen += line
        proc.send_signal(signal.SIGTERM)
        err = seen + proc.stderr.read()
        assert proc.wait(60) == 130, err
    finally:
        proc.kill()
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err, err
    assert (tmp_path / "d.partial").is_dir() and not out.exists()
