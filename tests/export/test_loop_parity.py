"""The speculative loop through the onnxruntime runner drafts what the torch runner drafts: every family x
policy kind x attention form, at temperature 0 in fp32 - the same draft tokens in >= 99 % of rounds and
tau within 1 % (the outputs match trivially: the torch target verifies both)."""

from __future__ import annotations

import pytest
import torch

import specpress.runtime.loop as loop
from specpress.runtime.backends.onnxruntime.runner import load_runner
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.loop import speculative_generate
from specpress.runtime.policy import parse_policy

POLICIES = {
    "eagle": ["chain:4", "tree:[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]", "dynamic:depth=4,topk=3,budget=8"],
    "eagle3": ["chain:4", "dynamic:depth=4,topk=3,budget=8"],
    "mtp": ["mtp:3", "chain:2"],
    "lm": ["chain:3", "dynamic:depth=3,topk=2,budget=5"],
    "dflash": ["block:4"],
    "dflash_markov": ["block:4"],
}
# the default run: each family's first policy in the standard form, plus the plugin form on two families
DEFAULT = [(f, ps[0], "standard") for f, ps in POLICIES.items()] + [("eagle3", "dynamic:depth=4,topk=3,budget=8",
                                                                     "plugin"), ("dflash", "block:4", "plugin")]
MATRIX = [(f, p, form) for f, ps in POLICIES.items() for p in ps for form in ("standard", "plugin")]
PROMPTS = [[3, 17, 5, 40, 22, 9, 11], [50, 2, 2, 8, 31], [7, 7, 12, 45, 33, 19, 4, 26, 14]]


def drafts_of(runner, target, policy, monkeypatch):
    """(generated tokens, the draft tree tokens of every round, tau) over PROMPTS."""
    rounds: list[tuple[int, ...]] = []
    make = loop.make_session

    def recording(r, capacity):
        session = make(r, capacity)
        propose = session.propose

        def wrapped(*a, **kw):
            p = propose(*a, **kw)
            rounds.append(tuple(p.tree.tokens))
            return p

        session.propose = wrapped
        return session

    monkeypatch.setattr(loop, "make_session", recording)
    outs, accepted, n = [], 0, 0
    for prompt in PROMPTS:
        gen = speculative_generate(TorchTarget(target), runner, prompt, 24, parse_policy(policy))
        outs.append(gen.tokens)
        accepted += sum(r.accepted + 1 for r in gen.rounds)
        n += len(gen.rounds)
    monkeypatch.setattr(loop, "make_session", make)
    return outs, rounds, accepted / n


def check_parity(exported, target, family, policy, form, monkeypatch):
    d, path, _ = exported(family, form)
    t_out, t_rounds, t_tau = drafts_of(drafter_runner(d), target, policy, monkeypatch)
    o_out, o_rounds, o_tau = drafts_of(load_runner(path, target, torch.device("cpu")), target, policy, monkeypatch)
    assert o_out == t_out
    same = sum(a == b for a, b in zip(t_rounds, o_rounds))
    assert len(o_rounds) == len(t_rounds) and same >= 0.99 * len(t_rounds), (same, len(t_rounds))
    assert abs(o_tau - t_tau) <= 0.01 * t_tau


@pytest.mark.parametrize("family,policy,form", DEFAULT)
def test_onnxruntime_drafts_what_torch_drafts(exported, target, family, policy, form, monkeypatch):
    check_parity(exported, target, family, policy, form, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("family,policy,form", [c for c in MATRIX if c not in DEFAULT])
def test_parity_matrix(exported, target, family, policy, form, monkeypatch):
    check_parity(exported, target, family, policy, form, monkeypatch)
