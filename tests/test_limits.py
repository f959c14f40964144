"""Issue 35, resources and limits checked before the work: the KV cache of run / bench, absurd config sizes
(inspect included), absurd recipes, special and oversized data and prompt files. Each refusal is one line,
comes before the target's weights are loaded, and leaves the inputs as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from drafters_common import saved_target_and_drafter

from specpress.cli import cli
from specpress.errors import ConfigError, DataError, RequestError, SpecpressError


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits")
    tdir, data, drafter = saved_target_and_drafter(root)
    long_ctx = root / "long"  # the same target with a long context: memory, not the context, is the limit
    long_ctx.mkdir()
    for f in tdir.iterdir():
        (long_ctx / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tdir / "config.json").read_text())
    (long_ctx / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 1 << 26}))
    prompts = root / "p.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n{"input_ids": [3, 4, 5]}\n')
    return root, tdir, data, drafter, long_ctx, prompts


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def refused(res, kind=SpecpressError, *words: str) -> str:
    assert isinstance(res.exception, kind), (res.output, res.exception)
    msg = str(res.exception)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a command builds the target: its refusal must come before the weights are loaded."""
    from specpress.models.target import TargetModel

    monkeypatch.setattr(TargetModel, "__init__", lambda *a, **k: pytest.fail("built the target before refusing"))


@pytest.fixture
def one_gib_free(monkeypatch):
    """The machine has 1 GiB free (MemAvailable): what the checks compare against."""
    from specpress import machine

    monkeypatch.setattr(machine, "available_bytes", lambda: 1 << 30)


# ---------------------------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("cmd", ["run", "bench"])
def test_kv_cache_past_memory_is_refused_before_loading(setup, cmd, no_loading, one_gib_free):
    root, _, _, drafter, long_ctx, prompts = setup
    before = snapshot(root)
    args = {"run": ["run", "--target", long_ctx, "--drafter", drafter, "--prompt", "def add"],
            "bench": ["bench", "--target", long_ctx, "--drafter", drafter, "--prompts", prompts]}[cmd]
    res = invoke(*args, "--max-new-tokens", 9_000_000)  # 9M positions x 8 layers x 2 KV heads x 8 x fp32: 8.6 GiB
    msg = refused(res, RequestError, "--max-new-tokens 9000000", "KV cache", "8.6 GiB", "1.0 GiB is available",
                  "lower --max-new-tokens")
    assert res.exception.exit_code == 1 and "9,000,0" in msg  # the machine, not the command line
    assert snapshot(root) == before


def test_kv_cache_within_memory_still_runs(setup, one_gib_free):
    _, _, _, _, long_ctx, prompts = setup
    res = invoke("bench", "--target", long_ctx, "--prompts", prompts, "--max-new-tokens", 3)
    assert res.exit_code == 0, (res.output, res.exception)


def test_context_is_checked_before_loading_too(setup, no_loading):
    _, tdir, _, _, _, prompts = setup
    res = invoke("bench", "--target", tdir, "--prompts", prompts, "--max-new-tokens", 500)
    refused(res, RequestError, "context is 128", "lower --max-new-tokens")


# ---------------------------------------------------------------------------------------------- configs

ABSURD = [("hidden_size", 1e9), ("vocab_size", 10**19), ("intermediate_size", 1e15), ("head_dim", 10**12),
          ("hidden_size", "1e400"), ("hidden_size", True), ("hidden_size", "32"), ("num_attention_heads", 0),
          ("architectures", 5)]  # "1e400": JSON's 1e400, which reads as infinity
CASES = ([("target", f, v) for f, v in ABSURD + [("num_hidden_layers", 10**9), ("eos_token_id", "x")]]
         + [("drafter", f, v) for f, v in ABSURD + [("num_target_layers", 10**9), ("draft_vocab_size", 10**12)]])


@pytest.mark.parametrize("what, field, value", CASES)
def test_absurd_config_sizes_are_refused_before_allocation(setup, tmp_path, what, field, value, no_loading):
    """inspect (meta device) overflowed torch's size arithmetic or built a billion layers; loading did worse."""
    _, tdir, _, drafter, _, _ = setup
    src = tdir if what == "target" else drafter
    d = tmp_path / "m"
    d.mkdir()
    for f in src.iterdir():  # weights (and tokenizer) as they were; config.json edited
        (d / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    text = json.dumps({**cfg, field: value}).replace('"1e400"', "1e400")
    (d / "config.json").write_text(text)
    res = invoke("inspect", d)
    msg = refused(res, SpecpressError, field)
    assert any(w in msg for w in ("is outside", "whole number", "must be")), msg
    if what == "target":
        refused(invoke("run", "--target", d, "--prompt", "x"), SpecpressError, field)
    else:  # refused before the target is built (no_loading), not after loading it
        refused(invoke("run", "--target", tdir, "--drafter", d, "--prompt", "x"), SpecpressError, field)
        refused(invoke("export", "onnx", "--drafter", d, "--target", tdir, "--out", tmp_path / "x"),
                SpecpressError, field)


def test_inspect_warns_when_parameters_and_bytes_disagree(setup, tmp_path):
    _, tdir, _, _, _, _ = setup
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").write_bytes((tdir / "model.safetensors").read_bytes())
    cfg = json.loads((tdir / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "hidden_size": 65536, "intermediate_size": 200_000}))
    res = invoke("inspect", d)
    assert res.exit_code == 0 and "warning: config.json implies" in res.output and "disagree" in res.output
    res = invoke("inspect", tdir)  # a consistent one says nothing
    assert res.exit_code == 0 and "warning" not in res.output


# ---------------------------------------------------------------------------------------------- recipes


def _recipe(setup, tmp_path, text: str) -> Path:
    _, tdir, _, drafter, _, prompts = setup
    f = tmp_path / "r.yaml"
    f.write_text(f"target: {tdir}\ndrafter: {drafter}\nprompts: {prompts}\nmax_new_tokens: 4\n" + text)
    return f


def _laughs() -> str:
    d = 'description: [&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'
    for i in range(1, 10):
        d += f", &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]"
    return d + "]\ngrid: [{quantize: {scheme: int8}}]\n"


RECIPES = {  # name -> (recipe text after the common head, words of the refusal)
    "a grid of 2e9 points": ("grid: [{quantize: {scheme: int4, group_size: " + json.dumps(list(range(8, 2008)))
                             + ", calib_batches: " + json.dumps(list(range(1, 1001))) + ", batch: "
                             + json.dumps(list(range(1, 1001))) + "}}]\n", ["2,000,000,000 points", "at most 10,000"]),
    "billion laughs": (_laughs(), ["more than 100,000 values", "aliases"]),
    "nested 50,000 deep": ("grid: " + "[" * 50_000 + "]" * 50_000 + "\n", ["nested more than"]),
    "an alias inside itself": ("grid: &g [*g]\n", ["alias contains itself"]),
    "a 2 MiB recipe": ("description: '" + "x" * (2 << 20) + "'\ngrid: [{quantize: {scheme: int8}}]\n",
                       ["a recipe is at most 1.0 MiB"]),
}


@pytest.mark.parametrize("name", list(RECIPES))
def test_absurd_recipes_are_refused_with_their_size(setup, tmp_path, name):
    text, words = RECIPES[name]
    f = _recipe(setup, tmp_path, text)
    res = invoke("sweep", f, "--out", tmp_path / "out")
    refused(res, ConfigError, str(f), *words)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- data, prompts


def test_dev_zero_as_data_or_prompts_is_refused(setup, tmp_path, no_loading):
    _, tdir, _, _, _, _ = setup
    res = invoke("distill", "--target", tdir, "--family", "eagle3", "--data", "/dev/zero", "--out", tmp_path / "d",
                 "--steps", "2")
    refused(res, DataError, "/dev/zero is a character device, not a regular file")
    res = invoke("bench", "--target", tdir, "--prompts", "/dev/zero", "--max-new-tokens", 2)
    refused(res, DataError, "/dev/zero is a character device, not a regular file")


@pytest.mark.parametrize("how", ["bench", "run"])
def test_a_10_mb_prompt_is_refused_before_it_is_tokenized(setup, tmp_path, how, no_loading, monkeypatch):
    _, tdir, _, _, _, _ = setup
    text = "def add(a, b): return a\n" * 420_000  # 10 MB
    from specpress.models import tokenizer
    from specpress.runtime import bench

    class NoEncode:
        def __init__(self, tok):
            self.tok = tok

        def encode(self, *a, **k):
            pytest.fail("tokenized the prompt before refusing it")

        def __getattr__(self, name):
            return getattr(self.tok, name)

    real = tokenizer.load_tokenizer
    for module in (tokenizer, bench):
        monkeypatch.setattr(module, "load_tokenizer", lambda *a, **k: NoEncode(real(*a, **k)))
    if how == "bench":
        f = tmp_path / "big.jsonl"
        f.write_text(json.dumps({"prompt": text}) + "\n")
        res = invoke("bench", "--target", tdir, "--prompts", f, "--max-new-tokens", 2)
        refused(res, DataError, f"{f}:1", "10,500,014 bytes", "1,048,576", "shorten it")
    else:
        res = invoke("run", "--target", tdir, "--prompt", text, "--max-new-tokens", 2)
        refused(res, DataError, "--prompt", "1,048,576", "shorten it")


def test_data_larger_than_memory_is_refused_with_its_size(setup, tmp_path, monkeypatch):
    from specpress import machine
    from specpress.compress.data import read_texts

    f = tmp_path / "d.txt"
    f.write_text("x = 1\n" * 100_000)  # 600 KB against 1 MB free
    monkeypatch.setattr(machine, "available_bytes", lambda: 1 << 20)
    with pytest.raises(DataError, match=r"d.txt is 585.9 KiB; .* 1.0 MiB is free"):
        read_texts(f)
