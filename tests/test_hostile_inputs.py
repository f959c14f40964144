"""Issue 21, items 7 and 9: no false alarms about the right target, a refusal for the wrong one, and
messages that say what the user typed and what the command accepts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from drafters_common import CONFIGS, make, random_eos_target, save_with_tokenizer

from specpress.cli import cli
from specpress.errors import CheckpointError
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.target import TargetConfig, TargetModel, load_target, save_target


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    t = random_eos_target()
    tdir, data = save_with_tokenizer(t, root)
    return root, t, tdir, data


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_strict_accepts_the_right_target_in_any_dtype(setup, dtype):
    root, t, tdir, _ = setup
    drafter = root / "e3"
    if not drafter.exists():
        save_drafter(make("eagle3", t), drafter)
    res = invoke("run", "--target", tdir, "--drafter", drafter, "--dtype", dtype, "--strict", "--prompt", "def add",
                 "--max-new-tokens", "2")
    assert res.exit_code == 0, (res.output, res.exception)


def test_eagle3_records_its_taps_and_refuses_a_target_of_another_depth(setup, tmp_path):
    root, t, tdir, _ = setup
    d = save_drafter(make("eagle3", t), tmp_path / "e3")
    cfg = json.loads((d / "config.json").read_text())
    n = t.config.num_hidden_layers
    assert cfg["num_target_layers"] == n and cfg["eagle_aux_hidden_state_layer_ids"] == [2, n // 2, n - 3]
    import dataclasses

    shallow = TargetModel(dataclasses.replace(t.config, num_hidden_layers=4)).eval()
    with pytest.raises(CheckpointError, match="num_target_layers\\) = 8, target .* = 4"):
        load_drafter(d, shallow)
    for key in ("num_target_layers", "eagle_aux_hidden_state_layer_ids", "eagle_config"):  # a public checkpoint
        cfg.pop(key)
    (d / "config.json").write_text(json.dumps(cfg))
    assert load_drafter(d, shallow).taps == (2, 2, 1)  # unrecorded: the target's default taps, as before


def test_an_unknown_architecture_is_refused_even_with_a_draft_vocab(tmp_path):
    cfg = {"architectures": ["MysteryForCausalLM"], "hidden_size": 32, "vocab_size": 61, "draft_vocab_size": 24,
           "num_attention_heads": 4, "intermediate_size": 40}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    res = invoke("inspect", tmp_path / "config.json")
    assert "none claims architectures ['MysteryForCausalLM']" in str(res.exception)
    assert "LlamaForCausalLMEagle3" in str(res.exception) and "LlamaForCausalLM" in str(res.exception)


def test_context_errors_quote_what_the_user_typed(setup, tmp_path):
    root, t, tdir, _ = setup
    drafter = root / "e3"
    if not drafter.exists():
        save_drafter(make("eagle3", t), drafter)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input_ids": [1] * 120}) + "\n")  # context 128
    res = invoke("bench", "--target", tdir, "--drafter", drafter, "--prompts", prompts, "--max-new-tokens", "6",
                 "--policy", "chain:4")
    msg = str(res.exception)
    assert "with --max-new-tokens 6 (+" in msg and "for the drafts)" in msg, msg


def test_without_a_tokenizer_nobody_is_told_to_use_input_ids_where_they_cannot(setup, tmp_path):
    root, t, _, data = setup
    bare = save_target(t, tmp_path / "bare")
    res = invoke("run", "--target", bare, "--prompt", "def", "--max-new-tokens", "2")
    assert "no tokenizer.json" in str(res.exception) and "input_ids" not in str(res.exception)
    res = invoke("distill", "--target", bare, "--family", "eagle3", "--data", data, "--out", tmp_path / "d",
                 "--steps", "1", "--seq-len", "16")
    assert "no tokenizer.json" in str(res.exception) and "input_ids" not in str(res.exception)


def test_inspect_shows_the_chain_of_steps_readably(setup, tmp_path):
    root, t, tdir, data = setup
    d, q = tmp_path / "d", tmp_path / "q"
    res = invoke("distill", "--target", tdir, "--family", "eagle3", "--data", data, "--out", d, "--steps", "2",
                 "--batch", "2", "--seq-len", "16", "--draft-vocab", "40")
    assert res.exit_code == 0, (res.output, res.exception)
    res = invoke("quantize", "--drafter", d, "--out", q, "--scheme", "int8", "--target", tdir, "--data", data,
                 "--seq-len", "16", "--batch", "2")
    assert res.exit_code == 0, (res.output, res.exception)
    res = invoke("inspect", q)
    assert res.exit_code == 0, (res.output, res.exception)
    lines = res.output.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("  1. "))
    assert lines[first].startswith("  1. distill eagle3: 2 steps, loss ")
    chain = "\n".join(lines[first:])
    assert str(data) in chain and "\n  2. quantize int8 rtn: " in chain and "acc@k" in chain
    assert "{" not in chain  # no raw JSON
