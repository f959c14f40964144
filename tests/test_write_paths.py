"""Issue 35, how to make it last: every command writes only through the output helper (specpress.artifacts).

Each command of the CLI runs on tiny inputs under a Python audit hook that records every write the process
makes (files opened for writing, renames, removals, new directories), and every written path must lie under
an output or cache entry the command claimed at the time (`artifacts.claimed_roots`): its --out, its partial,
its lock and temp files beside it (`.<name>.*`). A command that writes anywhere else fails here, naming the
path and the operation. `test_every_command_is_audited` fails when a command is added to the CLI without a
case here.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from drafters_common import saved_target_and_drafter

from specpress import artifacts
from specpress.cli import cli
from specpress.commands import COMMANDS

_RECORD: list[tuple[str, str, list[Path]]] | None = None  # (event, path, roots claimed then) while a case runs
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _written(event: str, args: tuple) -> list[str]:
    """The paths an audited operation writes (none for a read)."""
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int) or path is None or os.path.isdir(path):
            return []  # a directory opened for writing is O_TMPFILE (tempfile): the file made is audited as such
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE_FLAGS)
        return [os.fsdecode(path)] if writes else []
    if event == "os.rename":
        return [] if args[2] is not None or args[3] is not None else [os.fsdecode(args[0]), os.fsdecode(args[1])]
    if event == "os.mkdir" and (args[2] is not None or os.path.isdir(args[0])):
        return []  # mkdir(exist_ok=True) of a directory that exists makes nothing
    if event in ("os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate", "os.symlink", "os.link",
                 "os.chmod", "os.utime"):
        if isinstance(args[0], int) or (event in ("os.remove", "os.rmdir", "shutil.rmtree") and args[-1] is not None):
            return []  # relative to a dir_fd: a step of an audited rmtree
        return [os.fsdecode(args[0])]
    return []


def _hook(event: str, args: tuple) -> None:
    if _RECORD is None:
        return
    for p in _written(event, args):
        _RECORD.append((event, p, artifacts.claimed_roots()))


sys.addaudithook(_hook)  # audit hooks cannot be removed: it records only while a case runs


def _inside(path: Path, root: Path, event: str) -> bool:
    """`path` is `root`, lies under it, is one of its companions beside it (`.<name>.*`: its lock and temp
    files; `<name>.partial*`), or is a directory it lies in, being made."""
    if path == root or root in path.parents or (event == "os.mkdir" and path in root.parents):
        return True
    return any(sib.parent == root.parent and sib.name.startswith((f".{root.name}.", f"{root.name}.partial"))
               for sib in (path, *path.parents))


def audited(args: list) -> list[str]:
    """Run the CLI with `args`; the writes it made outside what it had claimed at that moment."""
    global _RECORD
    _RECORD = []
    try:
        res = CliRunner().invoke(cli, [str(a) for a in args])
    finally:
        record, _RECORD = _RECORD, None
    assert res.exit_code == 0, (res.output, res.exception)
    stray = []
    for event, p, roots in record:
        path = Path(os.path.abspath(p))
        if not any(_inside(path, r, event) for r in roots):
            stray.append(f"{event} {path} (claimed then: {', '.join(map(str, roots)) or 'nothing'})")
    return sorted(set(stray))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("writes")
    tdir, data, drafter = saved_target_and_drafter(root)
    prompts = root / "prompts.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n{"input_ids": [3, 4, 5]}\n')
    return root, tdir, data, drafter, prompts


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path / "cache"))


TRAIN = ["--steps", "2", "--batch", "2", "--seq-len", "16", "--draft-vocab", "40", "--checkpoint-minutes", "0"]


def cases(root, tdir, data, drafter, prompts, out):
    """command -> its arguments, writing under `out`."""
    recipe = out.parent / "recipe.json"
    recipe.write_text(json.dumps({"target": str(tdir), "drafter": str(drafter), "prompts": str(prompts),
                                  "policies": ["chain:2"], "max_new_tokens": 4, "calibration": str(data),
                                  "agreement_batches": 0, "grid": [{"quantize": {"scheme": "int8"}}]}))
    export = root / "onnx"
    return {
        "distill": ["distill", "--target", tdir, "--family", "eagle3", "--data", data, "--out", out, *TRAIN,
                    "--cache-teacher", out.parent / "teacher"],
        "quantize": ["quantize", "--drafter", drafter, "--out", out, "--scheme", "int8"],
        "prune": ["prune", "--drafter", drafter, "--out", out, "--ffn", "0.5"],
        "regenerate": ["regenerate", "--target", tdir, "--data", data, "--out", out, "--sequences", "2",
                       "--prompt-tokens", "4", "--new-tokens", "4"],
        "export onnx": ["export", "onnx", "--drafter", drafter, "--target", tdir, "--out", export, "--force"],
        "export target": ["export", "target", "--target", tdir, "--out", out],
        "export hf": ["export", "hf", "--drafter", drafter, "--format", "speculators", "--verifier", tdir,
                      "--out", out],
        "export trt": ["export", "trt", "--probe", "--out", out, "--max-tree", "8", "--max-context", "64",
                       "--flavour", "tensorrt_rtx"],  # a tiny drafter's head size has no TensorRT kernel
        "bench": ["bench", "--target", tdir, "--drafter", drafter, "--prompts", prompts, "--max-new-tokens", "4",
                  "--backend", "onnxruntime", "--target-backend", "onnxruntime", "--json", out],
        "run": ["run", "--target", tdir, "--drafter", drafter, "--prompt", "def", "--max-new-tokens", "4",
                "--backend", "onnxruntime"],
        "inspect": ["inspect", drafter],
        "plan": ["plan", "--json", out, "export", "onnx", "--drafter", drafter, "--target", tdir, "--out", export],
        "prompts": ["prompts", "--target", tdir, "--out", out, "--n", "2", "--tokens", "8"],
        "sweep": ["sweep", recipe, "--out", out],
        "zoo build": None,  # tests/zoo builds a tiny zoo through build_zoo; see test_zoo_build_writes_only_its_out
    }


def leaf_commands() -> list[str]:
    import importlib

    import click

    names = []
    for name, (module, attr, _) in COMMANDS.items():
        cmd = getattr(importlib.import_module(module), attr)
        if isinstance(cmd, click.Group):
            names += [f"{name} {sub}" for sub in cmd.commands]
        else:
            names.append(name)
    return sorted(names)


def test_every_command_is_audited(inputs, tmp_path):
    assert sorted(cases(*inputs, tmp_path / "out")) == leaf_commands()


ORDER = ["export onnx", "export trt", "export target", "export hf", "quantize", "prune", "distill", "regenerate",
         "bench", "run", "inspect", "plan", "prompts", "sweep"]


@pytest.mark.parametrize("name", ORDER)
def test_a_command_writes_only_under_what_it_claimed(inputs, tmp_path, name):
    if name == "export trt":
        from specpress.runtime.backends.tensorrt.library import TensorRTUnavailable, load_tensorrt

        try:
            load_tensorrt("tensorrt_rtx")
        except TensorRTUnavailable as exc:  # CI installs it (the trt-rtx extra)
            pytest.skip(f"TensorRT for RTX is not installed ({exc})")
    out = tmp_path / ("out.json" if name == "bench" else "out.jsonl" if name in ("regenerate", "prompts") else "out")
    args = cases(*inputs, out)[name]
    stray = audited(args)
    assert stray == [], "\n".join(stray)


def test_zoo_build_writes_only_its_out(tmp_path, monkeypatch):
    """`zoo build` on a tiny preset and a two-file corpus (the real one takes minutes)."""
    from specpress.zoo import build as zb

    tiny = zb.preset_with("small", hidden_size=32, intermediate_size=64, num_heads=2, vocab_size=300, seq_len=32,
                          batch_size=4, steps=2, warmup_steps=1, max_position_embeddings=64, compile=False)
    monkeypatch.setitem(zb.PRESETS, "small", tiny)
    real = zb.corpus_files
    monkeypatch.setattr(zb, "corpus_files", lambda root=None, max_files=None: real(max_files=2))
    assert audited(["zoo", "build", "--out", tmp_path / "zoo"]) == []
