"""Issue 35, reading back what specpress wrote: an export (and the on-demand export caches) is checked against
the sizes and sha256 its manifest records before onnxruntime or TensorRT opens a file of it, and every path
a manifest names stays inside the export. A damaged user export is refused with one line naming the file and
the fix; a damaged cache is exported again, saying so; `export trt` refuses a tampered source before building."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
from click.testing import CliRunner

from specpress.cli import cli
from specpress.errors import CheckpointError
from specpress.manifest import sha256_file


@pytest.fixture(scope="module")
def setup(tmp_path_factory, target):
    """(root, target dir, drafter artifact, its export, prompts file, cache dir)."""
    from conftest import make_drafter
    from drafters_common import save_with_tokenizer

    from specpress.export.onnx import export_from_dirs
    from specpress.models.drafter_io import save_drafter

    root = tmp_path_factory.mktemp("readback")
    tdir, _ = save_with_tokenizer(target, root)
    ddir = save_drafter(make_drafter("eagle3", target), root / "eagle3")
    export_from_dirs(ddir, tdir, root / "export")
    prompts = root / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"input_ids": [3, 5, 7, 9 + i]}) for i in range(2)) + "\n")
    return root, tdir, ddir, root / "export", prompts, root / "cache"


@pytest.fixture(autouse=True)
def cache_env(setup, monkeypatch):
    monkeypatch.setenv("SPECPRESS_CACHE", str(setup[5]))


def bench(setup, drafter, *extra):
    root, tdir, _, _, prompts, _ = setup
    out = root / "bench.json"
    res = CliRunner().invoke(cli, ["bench", "--target", str(tdir), "--drafter", str(drafter), "--prompts", str(prompts),
                                   "--max-new-tokens", "6", "--policy", "chain:2", "--backend", "onnxruntime",
                                   "--json", str(out), "--force", *extra])
    return res, (json.loads(out.read_text()) if res.exit_code == 0 else None)


def flip(path: Path) -> None:
    """Flip every bit of the byte in the middle of `path` (its size unchanged)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def refused(res, *words: str) -> str:
    """The one-line CheckpointError a refused command ended with; it contains every word of `words`."""
    assert res.exit_code != 0 and isinstance(res.exception, CheckpointError), (res.output, res.exception)
    msg = str(res.exception)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


@pytest.mark.parametrize("kind, name", [("onnx-target", "target.onnx"), ("onnx-target", "target.onnx.data"),
                                        ("onnx", "step.onnx"), ("onnx", "target_shared.bin")])
def test_a_damaged_cache_is_exported_again_and_said_so(setup, kind, name):
    _, _, ddir, _, _, cache = setup
    res, first = bench(setup, ddir, "--target-backend", "onnxruntime")
    assert res.exit_code == 0, res.output
    (entry,) = (cache / kind).iterdir()
    want = sha256_file(entry / name)
    flip(entry / name)
    res, again = bench(setup, ddir, "--target-backend", "onnxruntime")
    assert res.exit_code == 0, res.output
    assert f"{entry / name} does not match its sha256" in res.output and "exporting it again" in res.output
    assert again["outputs"] == first["outputs"] and sha256_file(entry / name) == want


def _copy(setup, tmp_path) -> Path:
    d = tmp_path / "export"
    shutil.copytree(setup[3], d)
    return d


def _edit_manifest(d: Path, edit) -> None:
    raw = json.loads((d / "manifest.json").read_text())
    edit(raw)
    (d / "manifest.json").write_text(json.dumps(raw))


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name("swap.tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _graph_to(name: str):
    def edit(raw):
        raw["graphs"][0]["file"] = name
    return edit


DAMAGE = {  # name -> (what it does to an export dir, words of the refusal)
    "bit flip in a graph": (lambda d: flip(d / "step.onnx"), ["step.onnx does not match its sha256", "export onnx"]),
    "bit flip in the shared tensors": (lambda d: flip(d / "target_shared.bin"),
                                       ["target_shared.bin does not match its sha256", "export onnx"]),
    "truncated graph": (lambda d: (d / "step.onnx").write_bytes((d / "step.onnx").read_bytes()[:100]),
                        ["step.onnx is 100 bytes, the manifest records", "truncated", "export onnx"]),
    "two graphs swapped": (lambda d: _swap(d / "fuse.onnx", d / "step.onnx"),
                           ["fuse.onnx", "swapped with another file", "export onnx"]),
    "missing graph": (lambda d: (d / "fuse.onnx").unlink(), ["fuse.onnx is missing from the export", "export onnx"]),
    "manifest names ../outside.onnx": (lambda d: _edit_manifest(d, _graph_to("../outside.onnx")),
                                       ["names the file '../outside.onnx'", "not a path inside", "export onnx"]),
    "manifest names an absolute path": (lambda d: _edit_manifest(d, _graph_to("/etc/passwd")),
                                        ["names the file '/etc/passwd'", "export onnx"]),
    "a graph symlinked out": (lambda d: ((d.parent / "elsewhere.onnx").write_bytes((d / "fuse.onnx").read_bytes()),
                                         (d / "fuse.onnx").unlink(), (d / "fuse.onnx").symlink_to(d.parent / "elsewhere.onnx")),
                              ["leads out of the export", "export onnx"]),
    "an older export without hashes": (lambda d: _edit_manifest(d, lambda raw: raw.pop("files")),
                                       ["records no sizes or sha256", "older specpress", "export onnx"]),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_export_is_refused_naming_the_file_and_the_fix(setup, tmp_path, case):
    d = _copy(setup, tmp_path)
    assert {"fuse.onnx", "step.onnx", "target_shared.bin"} <= {p.name for p in d.iterdir()}
    damage, words = DAMAGE[case]
    damage(d)
    res, _ = bench(setup, d)
    refused(res, *words)


def test_an_intact_export_runs(setup, tmp_path):
    res, got = bench(setup, _copy(setup, tmp_path))
    assert res.exit_code == 0 and got["lossless_mismatches"] == 0, res.output


def test_an_unloadable_graph_with_good_hashes_is_a_message_not_a_traceback(setup, tmp_path):
    """A graph onnxruntime refuses (here: not protobuf at all, recorded as if it were) still ends in one line."""
    from specpress.manifest import file_records

    d = _copy(setup, tmp_path)
    (d / "step.onnx").write_bytes(b"\x00not an onnx graph")
    _edit_manifest(d, lambda raw: raw["files"].update(file_records(d, ["step.onnx"])))
    res, _ = bench(setup, d)
    refused(res, "step.onnx: onnxruntime", "cannot load it", "export onnx")


def _version(v):
    def edit(raw):
        raw["format_version"] = v
    return edit


def _sha(raw):
    raw["files"]["step.onnx"]["sha256"] = "0" * 64


TAMPERED = {  # name -> (what it does to the source, words of the refusal)
    "format_version 99": (lambda d: _edit_manifest(d, _version(99)), ["format_version 99", "re-export"]),
    "foreign format": (lambda d: _edit_manifest(d, lambda raw: raw.update(format="other")), ["expected 'specpress-onnx'"]),
    "graph outside": (lambda d: _edit_manifest(d, _graph_to("../outside.onnx")), ["'../outside.onnx'"]),
    "recorded hash changed": (lambda d: _edit_manifest(d, _sha), ["step.onnx does not match its sha256"]),
    "graph bit flip": (lambda d: flip(d / "step.onnx"), ["step.onnx does not match its sha256"]),
    "graph not recorded": (lambda d: _edit_manifest(d, lambda raw: raw["files"].pop("step.onnx")),
                           ["'step.onnx' but records no sha256"]),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_export_trt_refuses_a_tampered_source_before_building(setup, tmp_path, monkeypatch, case):
    from specpress.export.trt import builder

    monkeypatch.setattr(builder, "load_tensorrt", lambda *a, **k: pytest.fail("loaded TensorRT before refusing"))
    d = _copy(setup, tmp_path)
    damage, words = TAMPERED[case]
    damage(d)
    res = CliRunner().invoke(cli, ["export", "trt", "--onnx", str(d), "--out", str(tmp_path / "engines")])
    refused(res, *words)
    assert not (tmp_path / "engines").exists()


def test_export_trt_builds_only_the_graphs_the_checked_manifest_lists(setup, tmp_path):
    from specpress.export.trt.builder import read_source_manifest, source_graphs

    d = _copy(setup, tmp_path)
    (d / "stray.onnx").write_bytes(b"not listed")
    names = [p.name for p in source_graphs(d, read_source_manifest(d))]
    assert names == [g["file"] for g in json.loads((d / "manifest.json").read_text())["graphs"]]
    assert "stray.onnx" not in names
