"""The speculative loop is lossless: at temperature 0 it emits exactly plain greedy decoding."""

from __future__ import annotations

import pytest
import torch
from drafters_common import CONFIGS, make, tiny_target

from specpress.errors import RequestError
from specpress.models.lm import LMDrafter
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.loop import speculative_generate
from specpress.runtime.plain import decode_plain
from specpress.runtime.policy import parse_policy

TREE = "tree:[[0],[1],[0,0],[1,0],[0,1],[0,0,0]]"
DYN = "dynamic:depth=3,topk=3,budget=8"
CASES = {
    "eagle": ["chain:3", TREE, DYN],
    "eagle3": ["chain:3", TREE, DYN],
    "lm": ["chain:4", TREE, DYN],
    "mtp": ["mtp:3"],
    "dflash": ["block:4"],
}
PROMPTS = [[5, 9, 13, 2, 44, 7], [30, 31, 32, 33, 34, 35, 36, 37, 38], [11, 12]]


@pytest.fixture(scope="module")
def target():
    """A random target whose head favours a few tokens, so that random drafters get some drafts accepted."""
    t = tiny_target()
    with torch.no_grad():
        t.lm_head.weight[1:4] *= 6.0
    return t


def drafter_for(family, target):
    d = make(family, target)
    if family == "eagle3":
        d.set_draft_vocab(torch.arange(24))
    if family == "lm":  # a noisy copy of the target: agrees often, not always
        d = oracle_lm(target, noise=0.5)
    return d


@pytest.fixture(scope="module")
def easy_target():
    """A random target that nearly always predicts token 1: even a random drafter sharing its head agrees."""
    t = tiny_target()
    with torch.no_grad():
        t.lm_head.weight[1] *= 25.0
    return t


@pytest.mark.parametrize("family,policy", [(f, p) for f, ps in CASES.items() for p in ps])
def test_greedy_speculative_equals_plain(target, easy_target, family, policy):
    accepted = 0
    for tgt in (target, easy_target):
        d = drafter_for(family, tgt)
        for prompt in PROMPTS:
            ref = decode_plain(TorchTarget(tgt), prompt, 30, eos_ids=()).tokens
            got = speculative_generate(TorchTarget(tgt), drafter_runner(d), prompt, 30, parse_policy(policy),
                                       eos_ids=())
            assert got.tokens == ref, f"{family} {policy} prompt {prompt}"
            accepted += sum(r.accepted for r in got.rounds)
    assert accepted > 0, "no draft was ever accepted: the accept path went untested"


def oracle_lm(target, noise: float = 0.0):
    """An lm drafter holding the target's own weights (+ relative noise): at noise 0 every draft is accepted."""
    d = LMDrafter(CONFIGS["lm"].__class__.from_target_config(target.config))
    d.load_state_dict(target.state_dict())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std())
    return d.eval().attach_target(target)


@pytest.mark.parametrize("policy", ["chain:4", TREE, DYN])
def test_oracle_drafter_accepts_everything(target, policy):
    d = oracle_lm(target)
    prompt = PROMPTS[0]
    ref = decode_plain(TorchTarget(target), prompt, 40, eos_ids=()).tokens
    got = speculative_generate(TorchTarget(target), drafter_runner(d), prompt, 40, parse_policy(policy), eos_ids=())
    assert got.tokens == ref
    rounds = got.rounds[:-1]  # the last round may be cut by the token budget
    if policy == DYN:
        # the budget rerank may cut the greedy path below full depth, but it is always near the top
        assert sum(r.accepted for r in rounds) / len(rounds) >= 2.0
    else:  # static trees hold the top-1 path to full depth: all of it is accepted
        depth = {"chain:4": 4, TREE: 3}[policy]
        assert all(r.accepted == depth for r in rounds)


def test_eos_stops_like_plain(target):
    d = drafter_for("eagle", target)
    prompt = PROMPTS[1]
    free = decode_plain(TorchTarget(target), prompt, 30, eos_ids=()).tokens
    eos = free[7]
    ref = decode_plain(TorchTarget(target), prompt, 30, eos_ids=[eos]).tokens
    got = speculative_generate(TorchTarget(target), drafter_runner(d), prompt, 30, parse_policy("chain:3"),
                               eos_ids=[eos])
    assert got.tokens == ref and got.tokens[-1] == eos


def test_policy_family_mismatch_is_clear(target):
    d = drafter_for("dflash", target)
    with pytest.raises(RequestError, match="cannot run with a dflash drafter.*block:B"):
        speculative_generate(TorchTarget(target), drafter_runner(d), PROMPTS[0], 10, parse_policy("chain:3"))


@pytest.mark.parametrize("family,policy", [("eagle3", "chain:3"), ("lm", DYN), ("dflash", "block:4")])
def test_round_timing_attributes_drafter_compute(target, family, policy, monkeypatch):
    """Time spent inside the drafter is counted as drafter compute, not as the loop's own overhead."""
    import time

    d = drafter_for(family, target)
    forward, calls = d.forward, []

    def slow_forward(*args, **kwargs):
        calls.append(1)
        time.sleep(0.004)
        return forward(*args, **kwargs)

    monkeypatch.setattr(d, "forward", slow_forward)
    got = speculative_generate(TorchTarget(target), drafter_runner(d), PROMPTS[0], 20, parse_policy(policy), eos_ids=())
    assert calls and got.rounds
    for r in got.rounds:
        assert 0 < r.draft_forward_ms <= r.draft_ms + r.other_ms + 1e-6
        assert r.draft_forward_ms >= 4.0  # at least one slowed drafter call per round
        assert r.overhead_ms == pytest.approx(r.draft_ms + r.other_ms - r.draft_forward_ms)
    total_fwd = sum(r.draft_forward_ms for r in got.rounds)
    assert total_fwd >= 4.0 * (len(calls) - 1)  # every call after the prefill's start falls in a round
