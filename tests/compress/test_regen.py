"""Target-regenerated data: batched continuations equal plain decoding; interruption loses nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from drafters_common import random_eos_target, save_with_tokenizer

from specpress.compress.regen import RegenConfig, card_path, continue_batch, prompt_windows, regenerate
from specpress.errors import ConfigError, RequestError
from specpress.runtime.backends.torch.runner import TorchTarget
from specpress.runtime.plain import decode_plain
from specpress.runtime.sampling import SamplingParams

GREEDY = SamplingParams(0.0)


def test_greedy_batch_equals_plain_decoding_row_by_row():
    target = random_eos_target()
    stream = np.random.default_rng(3).integers(1, target.config.vocab_size, 400).astype(np.int32)
    prompts = torch.from_numpy(prompt_windows(stream, RegenConfig(sequences=6, prompt_tokens=9)))
    rows = continue_batch(target, prompts, 24, GREEDY, None, target.config.eos_ids)
    for p, row in zip(prompts.tolist(), rows):
        plain = decode_plain(TorchTarget(target), p, 24).tokens
        assert row == [t for t in plain if t not in target.config.eos_ids]
    assert len(rows) == 6


def test_eos_cuts_a_row_and_the_rest_keep_going():
    target = random_eos_target()
    prompts = torch.tensor([[3, 4, 5], [7, 8, 9]])
    plain = [decode_plain(TorchTarget(target), p, 10, eos_ids=()).tokens for p in prompts.tolist()]
    stop = next(t for t in plain[0][2:] if t not in plain[1])  # ends row 0 early, never row 1
    rows = continue_batch(target, prompts, 10, GREEDY, None, (stop,))
    assert rows == [plain[0][:plain[0].index(stop)], plain[1]]
    assert len(rows[0]) < 10


def test_sampling_is_seeded():
    target = random_eos_target()
    prompts = torch.tensor([[3, 4, 5]] * 4)
    params = SamplingParams(1.0)
    draw = lambda s: continue_batch(target, prompts, 12, params, torch.Generator().manual_seed(s), (0,))  # noqa: E731
    assert draw(1) == draw(1)
    assert draw(1) != draw(2)


def _inputs(tmp_path):
    from specpress.models.tokenizer import load_tokenizer
    from specpress.compress.data import encode_stream, read_texts

    target = random_eos_target()
    tdir, data = save_with_tokenizer(target, tmp_path)
    tok = load_tokenizer(tdir)
    return target, tok, encode_stream(read_texts(data), tok, 0)


def test_interrupted_run_resumes_to_the_same_file(tmp_path):
    target, tok, stream = _inputs(tmp_path)
    cfg = RegenConfig(sequences=7, prompt_tokens=6, new_tokens=8, batch=3)
    whole = regenerate(target, tok, stream, cfg, tmp_path / "whole.jsonl")
    assert whole["sequences"] == 7 and whole["generated_tokens"] > 0
    assert json.loads(card_path(tmp_path / "whole.jsonl").read_text())["generated_tokens"] == whole["generated_tokens"]

    def stop_after_first(done: int, total: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    out = tmp_path / "cut.jsonl"
    with pytest.raises(KeyboardInterrupt):
        regenerate(target, tok, stream, cfg, out, on_batch=stop_after_first)
    assert not out.exists() and out.with_name("cut.jsonl.partial").exists()
    with pytest.raises(RequestError, match="batch"):  # a different run cannot continue it
        regenerate(target, tok, stream, RegenConfig(sequences=7, prompt_tokens=6, new_tokens=8, batch=2), out,
                   resume=True)
    resumed = regenerate(target, tok, stream, cfg, out, resume=True)
    assert out.read_text() == (tmp_path / "whole.jsonl").read_text()
    assert {k: v for k, v in resumed.items() if k not in ("seconds", "tokens_per_s", "file")} == \
           {k: v for k, v in whole.items() if k not in ("seconds", "tokens_per_s", "file")}
    assert not out.with_name("cut.jsonl.partial").exists()
    lines = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    assert len(lines) == 7 and all(lines)


def test_existing_output_is_kept_and_bad_settings_are_refused(tmp_path):
    target, tok, stream = _inputs(tmp_path)
    out = tmp_path / "d.jsonl"
    out.write_text("keep me\n")
    with pytest.raises(RequestError, match="--force"):
        regenerate(target, tok, stream, RegenConfig(sequences=2, new_tokens=2), out)
    assert out.read_text() == "keep me\n"
    with pytest.raises(RequestError, match="no interrupted run"):
        regenerate(target, tok, stream, RegenConfig(sequences=2, new_tokens=2), tmp_path / "e.jsonl", resume=True)
    with pytest.raises(ConfigError, match="new_tokens"):
        RegenConfig(new_tokens=0)
    with pytest.raises(Exception, match="top_p"):
        RegenConfig(temperature=1.0, top_p=0.0)


def test_cli_output_feeds_distill(tmp_path):
    from click.testing import CliRunner

    from specpress.cli import cli

    target, _, _ = _inputs(tmp_path)
    tdir, data = tmp_path / "target", tmp_path / "data.jsonl"
    out = tmp_path / "regen.jsonl"
    res = CliRunner().invoke(cli, ["regenerate", "--target", str(tdir), "--data", str(data), "--out", str(out),
                                   "--sequences", "6", "--prompt-tokens", "8", "--new-tokens", "12", "--batch", "4"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "6 sequences" in res.output and "re-encode exactly" in res.output
    res = CliRunner().invoke(cli, ["distill", "--target", str(tdir), "--family", "dflash", "--data", str(out),
                                   "--out", str(tmp_path / "drafter"), "--steps", "2", "--batch", "2",
                                   "--seq-len", "12", "--block-size", "4", "--anchors", "2"])
    assert res.exit_code == 0, res.output + repr(res.exception)
