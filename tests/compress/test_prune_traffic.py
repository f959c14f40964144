"""`prune --vocab --data PROMPTS.jsonl`: the draft vocabulary ranked on the target's continuations of the prompts."""

from __future__ import annotations

import json
from collections import Counter

import torch
from click.testing import CliRunner
from drafters_common import make, tiny_target

from specpress.cli import cli
from specpress.compress.traffic import is_prompts_file, traffic_stream
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.target import save_target
from specpress.runtime.backends.torch.runner import TorchTarget
from specpress.runtime.plain import decode_plain


def setup(tmp_path):
    target = tiny_target()
    with torch.no_grad():
        target.lm_head.weight[41] *= 25.0  # the target's continuations are dominated by token 41
    tdir = save_target(target, tmp_path / "target")
    d = make("eagle3", target)
    d.set_draft_vocab(torch.arange(0, 48, 2) + 1)  # 24 odd ids: token 41 is in the draft vocabulary
    ddir = save_drafter(d, tmp_path / "eagle3")
    prompts = tmp_path / "traffic.jsonl"
    rows = [[4, 8, 12, 2], [30, 32, 34], [6, 6, 10, 20, 22]]  # even ids: none of the prompts' own tokens is drafted
    prompts.write_text("\n".join(json.dumps({"input_ids": r}) for r in rows))
    return target, tdir, ddir, prompts, rows


def test_prompts_file_is_recognized_by_its_lines(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "def f("}\n')
    (tmp_path / "t.jsonl").write_text('{"text": "def f(): pass"}\n')
    assert is_prompts_file(tmp_path / "p.jsonl") and not is_prompts_file(tmp_path / "t.jsonl")


def plain_continuation(target, prompt, n):
    """decode_plain's greedy tokens up to (not including) the first EOS: what the stream holds."""
    eos = set(target.config.eos_ids)
    toks = decode_plain(TorchTarget(target), prompt, n).tokens
    return toks[:next((i for i, t in enumerate(toks) if t in eos), len(toks))]


def test_stream_holds_each_prompt_and_its_greedy_continuation(tmp_path):
    target, _, _, prompts, rows = setup(tmp_path)
    rows += [[3, 5, 7], [9, 11, 13], [1, 2, 3, 4, 5, 6]]  # equal lengths: continued as one batch
    prompts.write_text("\n".join(json.dumps({"input_ids": r}) for r in rows))
    seen = []
    stream, record = traffic_stream(target, prompts, None, new_tokens=12, batch=2,
                                    on_prompt=lambda i, n: seen.append((i, n)))
    sep = list(target.config.eos_ids)[:1]
    expected = []
    for r in rows:  # the file's order, whatever order the batches ran in
        expected += r + plain_continuation(target, r, 12) + sep
    assert stream.tolist() == expected and record["prompts"] == 6 and record["continuation_tokens"] == 12
    assert seen == [(i, 6) for i in range(6)]


def test_prune_ranks_the_vocabulary_on_the_prompts_continuations(tmp_path):
    target, tdir, ddir, prompts, rows = setup(tmp_path)
    out = tmp_path / "pruned"
    res = CliRunner().invoke(cli, ["prune", "--drafter", str(ddir), "--out", str(out), "--vocab", "4",
                                   "--vocab-source", "data", "--target", str(tdir), "--data", str(prompts),
                                   "--continuation-tokens", "24", "--seq-len", "16", "--batch", "2",
                                   "--vocab-tokens", "512"])
    assert res.exit_code == 0, (res.output, res.exception)
    generated = Counter(t for r in rows for t in decode_plain(TorchTarget(target), r,
                                                              24).tokens if t % 2 == 1 and t < 48)
    kept = set(load_drafter(out, target).to_target_ids(torch.arange(4)).tolist())
    assert generated.most_common(1)[0][0] == 41  # (a vocabulary ranked on nothing would keep the lowest ids)
    assert 41 in kept  # what the target emits, not the prompts' tokens
    step = load_drafter(out, target).provenance[-1]
    assert step["calibration"]["traffic"] == {"prompts": 3, "continuation_tokens": 24,
                                              "generated": sum(len(plain_continuation(target, r, 24)) for r in rows)}
    assert "ranked on" in res.output and "continuations of 3 prompts" in res.output


def test_continuation_tokens_needs_a_prompts_file(tmp_path):
    _, tdir, ddir, _, _ = setup(tmp_path)
    (tmp_path / "t.txt").write_text("plain text")
    res = CliRunner().invoke(cli, ["prune", "--drafter", str(ddir), "--out", str(tmp_path / "o"), "--vocab", "4",
                                   "--target", str(tdir), "--data", str(tmp_path / "t.txt"),
                                   "--continuation-tokens", "8"])
    assert res.exit_code != 0 and "--continuation-tokens" in res.output + str(res.exception)


def test_help_says_ranking_data_should_look_like_the_traffic():
    text = " ".join(CliRunner().invoke(cli, ["prune", "--help"]).output.split())
    assert "look like your traffic" in text and "--continuation-tokens" in text
