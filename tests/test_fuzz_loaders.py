"""Issue 35: mutated manifests, configs, prompts, recipes and data thrown at the loaders (hypothesis). Each valid
document is mutated (a value replaced by any JSON value, a key deleted or added, the bytes truncated, a byte
flipped, the text nested thousands deep) and handed to the loader the commands use; the loader must either
accept it or refuse it with a typed error (specpress.errors.SpecpressError): never a TypeError, KeyError,
RecursionError, UnicodeDecodeError or any other traceback. Examples are derandomized (the same every run)
and few enough that each test takes seconds."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from drafters_common import saved_target_and_drafter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specpress.cli import cli
from specpress.errors import SpecpressError

# SPECPRESS_FUZZ_EXAMPLES=2000 explores further (random, not derandomized) where there is time
_MORE = int(os.environ.get("SPECPRESS_FUZZ_EXAMPLES", "0"))
SETTINGS = settings(max_examples=_MORE or 60, deadline=None, derandomize=not _MORE, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

LEAVES = (st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
          | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
JSON = st.recursive(LEAVES, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=8)


@st.composite
def mutated(draw, doc):
    """`doc` (parsed JSON) with one mutation, as the text a file would hold (sometimes not JSON at all)."""
    how = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "truncate", "flip", "nest"]))
    text = json.dumps(doc)
    if how == "truncate":
        return text[:draw(st.integers(0, len(text)))]
    if how == "flip":
        i = draw(st.integers(0, len(text) - 1))
        return (text[:i].encode() + bytes([draw(st.integers(0, 255))]) + text[i + 1:].encode()).decode("latin-1")
    if how == "nest":
        return '{"x": ' + "[" * 5000 + "]" * 5000 + "}"
    doc = copy.deepcopy(doc)
    node, key = doc, None
    while isinstance(node, (dict, list)) and node:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = draw(st.sampled_from(keys))
        if not isinstance(node[key], (dict, list)) or not node[key] or draw(st.booleans()):
            break
        node = node[key]
    if key is None or not isinstance(node, (dict, list)):
        return json.dumps(draw(JSON))
    if how == "replace":
        node[key] = draw(JSON)
    elif how == "delete":
        del node[key]
    elif isinstance(node, dict):
        node[draw(st.text(max_size=8))] = draw(JSON)
    else:
        node.append(draw(JSON))
    return json.dumps(doc, allow_nan=True)


def write(path: Path, text: str) -> None:
    """`text` as the file's bytes: json.dumps writes ASCII, and a flipped byte comes as one latin-1 char."""
    path.write_bytes(text.encode("latin-1"))


def accepted_or_typed(fn) -> None:
    """`fn()` returns, or raises a SpecpressError; anything else fails the test with its traceback."""
    try:
        fn()
    except SpecpressError:
        pass


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny target, an EAGLE-3 drafter, its ONNX export and the target's export (read as the valid documents)."""
    root = tmp_path_factory.mktemp("fuzz")
    tdir, data, drafter = saved_target_and_drafter(root)
    for args in (["export", "onnx", "--drafter", drafter, "--target", tdir, "--out", root / "onnx"],
                 ["export", "target", "--target", tdir, "--out", root / "onnx-target"]):
        res = CliRunner().invoke(cli, [str(a) for a in args])
        assert res.exit_code == 0, (res.output, res.exception)
    return root, tdir, data, drafter


def _copy(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


@SETTINGS
@given(data=st.data())
def test_export_manifests(made, tmp_path, data):
    from specpress.manifest import open_export, open_target_export

    root = made[0]
    for name, manifest, opener in (("onnx", "manifest.json", open_export),
                                   ("onnx-target", "target_manifest.json", open_target_export)):
        d = _copy(root / name, tmp_path / name)
        write(d / manifest, data.draw(mutated(json.loads((root / name / manifest).read_text()))))
        accepted_or_typed(lambda: opener(d))  # noqa: B023 - called before the loop moves on


@SETTINGS
@given(data=st.data())
def test_model_configs(made, tmp_path, data):
    from specpress.models.drafter_io import load_drafter
    from specpress.models.inspect import inspect_artifact
    from specpress.models.target import load_target

    _, tdir, _, drafter = made
    target = load_target(tdir)
    for src, load in ((tdir, lambda d: load_target(d)), (drafter, lambda d: load_drafter(d, target))):
        d = _copy(src, tmp_path / src.name)
        write(d / "config.json", data.draw(mutated(json.loads((src / "config.json").read_text()))))
        accepted_or_typed(lambda: inspect_artifact(d))  # noqa: B023 - called before the loop moves on
        accepted_or_typed(lambda: load(d))  # noqa: B023


PROMPTS = [{"prompt": "def add(a, b):"}, {"input_ids": [3, 4, 5]}]


@SETTINGS
@given(data=st.data())
def test_prompt_files(made, tmp_path, data):
    from specpress.models.tokenizer import load_tokenizer
    from specpress.runtime.prompts import load_prompts

    tok = load_tokenizer(made[1])
    lines = [data.draw(mutated(p)) for p in PROMPTS]
    f = tmp_path / "p.jsonl"
    write(f, "\n".join(lines) + "\n")
    accepted_or_typed(lambda: load_prompts(f, tok, 61, 128))


@SETTINGS
@given(data=st.data())
def test_data_files(tmp_path, data):
    from specpress.compress.data import read_texts

    f = tmp_path / "d.jsonl"
    write(f, data.draw(mutated({"text": "def f(x):\n    return x\n"})) + "\n" +
          data.draw(mutated({"messages": [{"role": "user", "content": "hi"}]})) + "\n")
    accepted_or_typed(lambda: read_texts(f))


@SETTINGS
@given(data=st.data())
def test_recipes(made, tmp_path, data):
    from specpress.sweep.recipe import load_recipe

    _, tdir, data_file, drafter = made
    recipe = {"target": str(tdir), "drafter": str(drafter), "prompts": {"heldout": {"n": 4, "tokens": 8}},
              "policies": ["chain:2", "tree:[[0],[0,0],[1]]"], "max_new_tokens": 4, "calibration": str(data_file),
              "grid": [{"quantize": {"scheme": ["int8", "int4"], "group_size": [8, 16]}},
                       {"chain": [{"prune": {"ffn": 0.5}}, {"quantize": {"scheme": "int8"}}]}],
              "executor": {"kind": "local"}}
    f = tmp_path / "r.yaml"
    write(f, data.draw(mutated(recipe)))  # JSON is YAML
    accepted_or_typed(lambda: load_recipe(f))
