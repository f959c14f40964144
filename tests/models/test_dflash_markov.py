"""DFlash with DSpark's sequential Markov head: layout, left-to-right drafting, lossless decoding, training."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from drafters_common import CONFIGS, V, make, randomize, run, tiny_target
from safetensors.torch import load_file

from specpress.compress.agreement import batch_loss
from specpress.compress.config import DistillConfig
from specpress.compress.data import WindowSampler
from specpress.compress.distill import distill
from specpress.compress.students import init_student
from specpress.errors import ConfigError
from specpress.models.dflash import read_config, write_config
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.loop import speculative_generate
from specpress.runtime.plain import decode_plain
from specpress.runtime.policy import parse_policy

RANK = 6


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def markov_drafter(target, seed: int = 1):
    d = build_drafter(dataclasses.replace(CONFIGS["dflash"], markov_rank=RANK))
    return randomize(d, seed).attach_target(target)  # randomize also makes markov_w2 non-zero


def test_public_names_and_round_trip(target, tmp_path):
    d = markov_drafter(target)
    out = save_drafter(d, tmp_path / "d")
    keys = load_file(str(out / "model.safetensors"))
    assert keys["markov_head.markov_w1.weight"].shape == (V, RANK)
    assert keys["markov_head.markov_w2.weight"].shape == (V, RANK)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dflash_config"]["markov_rank"] == RANK and cfg["dflash_config"]["markov_head_type"] == "vanilla"
    back = load_drafter(out, target)
    assert back.config == d.config and torch.equal(run(back, target), run(d, target))
    plain = write_config(CONFIGS["dflash"])
    assert "markov_rank" not in plain["dflash_config"] and read_config(plain, "x").markov_rank == 0


def test_bad_markov_config_is_named():
    cfg = write_config(dataclasses.replace(CONFIGS["dflash"], markov_rank=RANK))
    cfg["dflash_config"]["markov_head_type"] = "rnn"
    with pytest.raises(ConfigError, match="markov_head_type"):
        read_config(cfg, "x/config.json")
    with pytest.raises(ConfigError, match="markov_rank"):
        dataclasses.replace(CONFIGS["dflash"], markov_rank=-1)
    with pytest.raises(ConfigError, match="dflash"):
        DistillConfig(family="eagle3", steps=1, markov_rank=4)


def test_drafts_go_left_to_right_through_the_bias(target):
    d = markov_drafter(target)
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(0))
    drafts = d.greedy_drafts(logits, anchor=7)
    prev, expect = 7, []
    for k in range(1, 5):
        prev = int((logits[k] + d.markov_head(torch.tensor(prev))).argmax())
        expect.append(prev)
    assert drafts == expect
    assert drafts != logits[1:].argmax(-1).tolist()  # the bias changes the drafts here: the head is in use
    assert make("dflash", target).greedy_drafts(logits, anchor=7) == logits[1:].argmax(-1).tolist()


def test_greedy_speculative_equals_plain(target):
    easy = tiny_target()
    with torch.no_grad():  # nearly always predicts token 1: the shared head makes some drafts land
        easy.lm_head.weight[1] *= 25.0
    accepted = 0
    for tgt in (target, easy):
        d = markov_drafter(tgt)
        for prompt in ([5, 9, 13, 2, 44, 7], [11, 12]):
            ref = decode_plain(TorchTarget(tgt), prompt, 30, eos_ids=()).tokens
            got = speculative_generate(TorchTarget(tgt), drafter_runner(d), prompt, 30, parse_policy("block:4"),
                                       eos_ids=())
            assert got.tokens == ref
            accepted += sum(r.accepted for r in got.rounds)
    assert accepted > 0, "no draft was ever accepted: the accept path went untested"


def test_training_lowers_the_loss_and_trains_the_head():
    target = tiny_target()
    with torch.no_grad():
        target.lm_head.weight.mul_(4)  # confident, as in test_distill: the loss is what the student can learn
    stream = np.tile(np.random.default_rng(0).integers(1, V, size=23), 100).astype(np.int32)
    c = DistillConfig(family="dflash", steps=30, batch=4, seq_len=24, lr=3e-3, block_size=4, eval_batches=1,
                      markov_rank=RANK)
    data = WindowSampler(stream, c.seq_len, c.batch, c.seed)
    student = init_student(c, target, stream)
    assert student.config.markov_rank == RANK and not student.markov_head.markov_w2.weight.any()
    ids = data.batch_at(0)
    with torch.no_grad():
        before = float(batch_loss(target, student, ids, c).loss)
    rep = distill(target, c, data, None)
    with torch.no_grad():
        after = float(batch_loss(target, rep.drafter, ids, c).loss)
    assert after < 0.75 * before, (before, after)
    assert rep.drafter.markov_head.markov_w2.weight.any()  # zero-initialised, then trained
