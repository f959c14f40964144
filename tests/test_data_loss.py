"""Issue 35, data loss: nothing specpress writes may destroy what it reads. The export commands claim --out
like every other command; single-file outputs (bench --json) are refused inside an input; --force replaces
only what specpress wrote; regenerate --resume refuses a partial file that is not what it recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from drafters_common import saved_target_and_drafter, stop_regen_at_batch

from specpress.artifacts import MARKERS, artifact_kind, write_file
from specpress.cli import cli
from specpress.errors import Interrupted, RequestError, UsageError, WriteError


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("loss")
    tdir, data, drafter = saved_target_and_drafter(root)
    (root / "notes.txt").write_text("my notes\n")
    onnx = root / "onnx"  # stands for an `export onnx` output: export trt's input
    onnx.mkdir()
    (onnx / "manifest.json").write_text(json.dumps({"format": "specpress-onnx", "format_version": 2}))
    return root, tdir, data, drafter, onnx


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes: an input must come out of a refused command byte for byte."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a command builds the target or loads a drafter: its refusal must come before any work."""
    from specpress.models import drafter_io
    from specpress.models.target import TargetModel

    monkeypatch.setattr(TargetModel, "__init__", lambda *a, **k: pytest.fail("built the target before refusing"))
    monkeypatch.setattr(drafter_io, "load_drafter", lambda *a, **k: pytest.fail("loaded a drafter before refusing"))


def export_args(cmd, tdir, drafter, onnx, out):
    return {
        "onnx": ["export", "onnx", "--drafter", drafter, "--target", tdir, "--out", out],
        "target": ["export", "target", "--target", tdir, "--out", out],
        "hf": ["export", "hf", "--drafter", drafter, "--format", "speculators", "--target", tdir, "--out", out],
        "trt": ["export", "trt", "--onnx", onnx, "--out", out],
    }[cmd]


@pytest.mark.parametrize("cmd, where", [("onnx", "drafter"), ("onnx", "target"), ("onnx", "parent"),
                                        ("onnx", "inside"), ("target", "target"), ("target", "parent"),
                                        ("hf", "drafter"), ("hf", "verifier"), ("trt", "onnx")])
def test_export_out_over_an_input_is_refused_even_with_force(setup, cmd, where, no_loading):
    root, tdir, _, drafter, onnx = setup
    out = {"drafter": drafter, "target": tdir, "verifier": tdir, "parent": root, "inside": drafter / "graphs",
           "onnx": onnx}[where]
    before = snapshot(root)
    res = invoke(*export_args(cmd, tdir, drafter, onnx, out), "--force")
    assert isinstance(res.exception, UsageError) and res.exception.exit_code == 2, (res.output, res.exception)
    assert "would destroy the input" in str(res.exception) and "even with --force" in str(res.exception)
    assert snapshot(root) == before


@pytest.mark.parametrize("cmd", ["onnx", "target", "hf", "trt"])
def test_export_out_that_cannot_be_written_is_refused_before_any_work(setup, cmd, no_loading):
    root, tdir, _, drafter, onnx = setup
    res = invoke(*export_args(cmd, tdir, drafter, onnx, root / "notes.txt" / "sub"))
    assert isinstance(res.exception, RequestError), (res.output, res.exception)
    assert "is a file, not a directory" in str(res.exception)


@pytest.mark.parametrize("where", ["drafter weights", "target config", "tokenizer", "prompts"])
def test_bench_json_inside_an_input_is_refused(setup, where, no_loading):
    root, tdir, _, drafter, _ = setup
    prompts = root / "p.jsonl"
    prompts.write_text('{"input_ids": [1, 2]}\n')
    path = {"drafter weights": drafter / "model.safetensors", "target config": tdir / "config.json",
            "tokenizer": tdir / "tokenizer.json", "prompts": prompts}[where]
    before = snapshot(root)
    for force in ([], ["--force"]):
        res = invoke("bench", "--target", tdir, "--drafter", drafter, "--prompts", prompts, "--max-new-tokens", "2",
                     "--json", path, *force)
        assert isinstance(res.exception, UsageError) and res.exception.exit_code == 2, (res.output, res.exception)
        assert "would destroy the input" in str(res.exception) and str(path) in str(res.exception)
    assert snapshot(root) == before


def test_bench_json_over_an_existing_file_needs_force_and_is_written_atomically(setup, tmp_path, monkeypatch):
    _, tdir, _, _, _ = setup
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input_ids": [1, 2]}\n')
    out = tmp_path / "m.json"
    out.write_text("keep me\n")
    base = ["bench", "--target", tdir, "--prompts", prompts, "--max-new-tokens", "2", "--json", out]
    res = invoke(*base)
    assert isinstance(res.exception, RequestError) and "already exists" in str(res.exception)
    assert "--force" in str(res.exception) and out.read_text() == "keep me\n"
    res = invoke(*base, "--force")
    assert res.exit_code == 0, (res.output, res.exception)
    assert json.loads(out.read_text())["tau"] == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "p.jsonl"]  # no temp file or lock left

    from specpress import artifacts

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(artifacts.os, "fsync", full_disk)
    with pytest.raises(WriteError, match="No space left on device.*the old m.json is untouched"):
        write_file(out, "new")
    assert json.loads(out.read_text())["tau"] == 1.0  # the old file stands and no temp file is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "p.jsonl"]


def test_force_replaces_only_what_specpress_wrote(setup, tmp_path, no_loading):
    _, tdir, data, drafter, onnx = setup
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "thesis.tex").write_text("four years of work\n")
    (junk / "figures").mkdir()
    quantize = ["quantize", "--drafter", drafter, "--scheme", "int8", "--out", junk]
    for args in (quantize, export_args("onnx", tdir, drafter, onnx, junk), export_args("trt", tdir, drafter, onnx, junk)):
        for force in ([], ["--force"]):
            res = invoke(*args, *force)
            assert isinstance(res.exception, RequestError) and res.exception.exit_code == 1, (res.output, res.exception)
            msg = str(res.exception)
            assert str(junk) in msg and "figures, thesis.tex" in msg and "remove it by hand" in msg, msg
    assert (junk / "thesis.tex").read_text() == "four years of work\n"

    from specpress.sweep.recipe import load_recipe
    from specpress.sweep.results import guard_out

    recipe = tmp_path / "r.yaml"
    recipe.write_text(json.dumps({"target": str(tdir), "drafter": str(drafter), "prompts": str(data),
                                  "policies": ["chain:3"], "max_new_tokens": 4,
                                  "grid": [{"quantize": {"scheme": "int8"}}]}))  # JSON is YAML
    with pytest.raises(RequestError, match="remove it by hand"):
        guard_out(junk, load_recipe(recipe), resume=False, force=True)
    assert sorted(p.name for p in junk.iterdir()) == ["figures", "thesis.tex"]


def test_force_still_replaces_an_artifact_or_an_empty_dir(setup, tmp_path):
    _, _, _, drafter, _ = setup
    empty = tmp_path / "empty"
    empty.mkdir()
    res = invoke("quantize", "--drafter", drafter, "--scheme", "int8", "--out", empty, "--force")
    assert res.exit_code == 0, (res.output, res.exception)
    assert artifact_kind(empty) == "a specpress drafter"
    res = invoke("quantize", "--drafter", drafter, "--scheme", "int4", "--group-size", "8", "--out", empty, "--force")
    assert res.exit_code == 0, (res.output, res.exception)
    assert json.loads((empty / "config.json").read_text())["specpress"]["steps"][-1]["scheme"] == "int4"


def _zoo_target(root: Path, tdir: Path) -> Path:
    """A directory marked as `zoo build` marks its target (zoo.json), holding the tiny target: an input of
    every other command."""
    import shutil

    zoo = root / "zoo"
    shutil.copytree(tdir, zoo)
    (zoo / "zoo.json").write_text(json.dumps({"format": "specpress-zoo", "steps": 1}))
    return zoo


@pytest.mark.parametrize("cmd, victim, words", [
    ("quantize", "zoo", "is a zoo target (zoo build), not a drafter"),
    ("distill", "onnx", "is an ONNX export (export onnx), not a drafter"),
    ("onnx", "drafter", "is a drafter (distill, prune, quantize, export hf), not an ONNX export"),
    ("target", "zoo", "is a zoo target (zoo build), not a target's ONNX export"),
    ("trt", "drafter", "is a drafter (distill, prune, quantize, export hf), not a TensorRT engine export"),
])
def test_force_replaces_only_an_artifact_of_the_kind_the_command_writes(setup, tmp_path, no_loading, cmd, victim,
                                                                        words):
    """Issue 57, item 1: `quantize --out ZOO --force` replaced a zoo target with a drafter and exited 0."""
    import shutil

    _, tdir, data, drafter, onnx = setup
    out = {"zoo": lambda: _zoo_target(tmp_path, tdir), "onnx": lambda: shutil.copytree(onnx, tmp_path / "onnx"),
           "drafter": lambda: shutil.copytree(drafter, tmp_path / "e3")}[victim]()
    args = {"quantize": ["quantize", "--drafter", drafter, "--scheme", "int8", "--out", out],
            "distill": ["distill", "--target", tdir, "--family", "eagle3", "--data", data, "--out", out, "--steps", "1"]
            }.get(cmd) or export_args(cmd, tdir, drafter, onnx, out)
    before = snapshot(tmp_path)
    for force in ([], ["--force"]):
        res = invoke(*args, *force)
        assert isinstance(res.exception, RequestError) and res.exception.exit_code == 1, (res.output, res.exception)
        msg = str(res.exception)
        assert f"--out {out} {words}" in msg and "left untouched" in msg, msg
    assert snapshot(tmp_path) == before


def test_a_writer_called_without_a_claim_keeps_the_kind_too(setup, tmp_path):
    """The library's writers (atomic_dir) refuse the same replacement, before the rename: the zoo target stands."""
    from drafters_common import make, random_eos_target

    from specpress.models.drafter_io import save_drafter

    _, tdir, _, _, _ = setup
    zoo = _zoo_target(tmp_path, tdir)
    before = snapshot(zoo)
    with pytest.raises(RequestError, match="is a zoo target .*, not a drafter .*: it was left untouched"):
        save_drafter(make("eagle3", random_eos_target()), zoo, force=True)
    assert snapshot(zoo) == before and sorted(p.name for p in tmp_path.iterdir()) == ["zoo"]


@pytest.mark.parametrize("dangling", [False, True])
def test_force_onto_a_symlinked_out_is_refused_before_any_work(setup, tmp_path, no_loading, dangling):
    """Issue 57, item 2: `--out LINK --force` (LINK -> an earlier quantize output) ended, after the work, in
    `OSError: Cannot call rmtree on a symbolic link`. Refused up front, naming where the link points."""
    import shutil

    _, _, _, drafter, _ = setup
    real = tmp_path / "q-v1"
    if not dangling:
        shutil.copytree(drafter, real)
    link = tmp_path / "latest"
    link.symlink_to(real)
    before = snapshot(tmp_path)
    res = invoke("quantize", "--drafter", drafter, "--scheme", "int8", "--out", link, "--force")
    assert isinstance(res.exception, RequestError) and res.exception.exit_code == 1, (res.output, res.exception)
    msg = str(res.exception)
    assert f"--out {link} is a symbolic link to {real}" in msg and f"pass --out {real}" in msg, msg
    assert link.is_symlink() and snapshot(tmp_path) == before


def test_every_writer_is_recognised():
    """artifact_kind knows each format tag the writers put in their manifests (kept as literals there)."""
    from specpress.manifest import FORMAT, TARGET_FORMAT
    from specpress.zoo.card import ZOO_FORMAT

    assert MARKERS["manifest.json"][0] == FORMAT and MARKERS["target_manifest.json"] == (TARGET_FORMAT,)
    assert MARKERS["zoo.json"] == (ZOO_FORMAT,)
    trt = pytest.importorskip("specpress.export.trt.builder")
    assert trt.FORMAT in MARKERS["manifest.json"]


def _interrupted_regen(tdir, data, out, monkeypatch):
    """Run regenerate with one sequence per batch, stopped by Ctrl-C in its second batch."""
    from specpress.compress import regen

    args = ["regenerate", "--target", tdir, "--data", data, "--out", out, "--sequences", "3", "--prompt-tokens", "4",
            "--new-tokens", "4", "--batch", "1"]
    real = stop_regen_at_batch(monkeypatch)
    res = invoke(*args)
    assert isinstance(res.exception, Interrupted), (res.output, res.exception)
    monkeypatch.setattr(regen, "continue_batch", real)
    return args


@pytest.mark.parametrize("damage", ["cut short", "changed", "other run"])
def test_regenerate_resume_refuses_a_partial_that_is_not_what_it_recorded(setup, tmp_path, monkeypatch, damage):
    _, tdir, data, _, _ = setup
    out = tmp_path / "r.jsonl"
    args = _interrupted_regen(tdir, data, out, monkeypatch)
    part = out.with_name("r.jsonl.partial")
    text = part.read_bytes()
    assert json.loads(part.with_name("r.jsonl.partial.state").read_text())["bytes"] == len(text)
    damaged = {"cut short": text[:len(text) // 2], "changed": text.replace(b'"text"', b'"TEXT"', 1),
               "other run": text}[damage]
    part.write_bytes(damaged)
    if damage != "other run":  # the partial's bytes are checked before the target is loaded
        from specpress.models.target import TargetModel

        monkeypatch.setattr(TargetModel, "__init__", lambda *a, **k: pytest.fail("loaded the target first"))
    res = invoke(*args, "--resume", *(["--seed", "1"] if damage == "other run" else []))
    monkeypatch.undo()
    assert isinstance(res.exception, RequestError) and res.exception.exit_code == 1, (res.output, res.exception)
    msg = str(res.exception)
    assert str(part) in msg and "\n" not in msg and "--force instead of --resume" in msg
    assert {"cut short": "cut short", "changed": "sha256 differs", "other run": "different run"}[damage] in msg
    assert part.read_bytes() == damaged and not out.exists()  # never padded, never continued

    res = invoke(*args, "--force")  # the fix the message names
    assert res.exit_code == 0, (res.output, res.exception)
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["text"] for line in lines) and b"\0" not in out.read_bytes()


def test_regenerate_resume_of_an_intact_partial_still_writes_the_same_file(setup, tmp_path, monkeypatch):
    _, tdir, data, _, _ = setup
    whole = tmp_path / "whole.jsonl"
    res = invoke("regenerate", "--target", tdir, "--data", data, "--out", whole, "--sequences", "3",
                 "--prompt-tokens", "4", "--new-tokens", "4", "--batch", "1")
    assert res.exit_code == 0, (res.output, res.exception)
    out = tmp_path / "r.jsonl"
    args = _interrupted_regen(tdir, data, out, monkeypatch)
    res = invoke(*args, "--resume")
    assert res.exit_code == 0, (res.output, res.exception)
    assert out.read_bytes() == whole.read_bytes()
