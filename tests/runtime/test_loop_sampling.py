"""Speculative sampling through the whole loop reproduces the target's distribution exactly.

A tiny target with a 6-token vocabulary: the law of the first two generated tokens is enumerated
from the target itself and compared (chi-square) with the loop's empirical law. The same statistic
computed with a deliberately broken accept rule must exceed the bound, so the test visibly bites.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import specpress.runtime.loop as loop_mod
from specpress.models.lm import LMConfig, LMDrafter
from specpress.models.target import TargetConfig, TargetModel
from specpress.runtime import verify as verify_mod
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.policy import parse_policy
from specpress.runtime.sampling import SamplingParams, process_logits

V, TRIALS, TEMP = 6, 1200, 1.0
PROMPT = [1, 4, 2]
CRIT = 80.0  # chi-square, 35 dof: P(X > 80) ~ 2e-5


def tiny(seed: int, layers: int) -> TargetModel:
    torch.manual_seed(seed)
    cfg = TargetConfig(vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=layers,
                       num_attention_heads=2, max_position_embeddings=64)
    m = TargetModel(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3.0 if p.dim() > 1 else 1.0)
    return m


@pytest.fixture(scope="module")
def pair():
    target = tiny(0, 2)
    d = LMDrafter(LMConfig.from_target_config(target.config))
    d.load_state_dict(tiny(1, 2).state_dict())  # a different model: drafts are often rejected
    return target, d.eval().attach_target(target)


def exact_law(target) -> torch.Tensor:
    """P(first two tokens = (a, b)) under plain sampling from the target, enumerated: [V, V]."""
    law = torch.zeros(V, V)
    with torch.no_grad():
        p1 = process_logits(target(torch.tensor([PROMPT])).logits[0, -1], TEMP)
        for a, b in itertools.product(range(V), range(V)):
            p2 = process_logits(target(torch.tensor([PROMPT + [a]])).logits[0, -1], TEMP)
            law[a, b] = p1[a] * p2[b]
    return law


def chi2(target, drafter, policy: str) -> float:
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(V, V)
    pol = parse_policy(policy)
    for _ in range(TRIALS):
        out = loop_mod.speculative_generate(TorchTarget(target), drafter_runner(drafter), PROMPT, 2, pol,
                                            SamplingParams(TEMP), gen, eos_ids=())
        counts[out.tokens[0], out.tokens[1]] += 1
    expected = exact_law(target) * TRIALS
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


def broken_try_children(p, kids, tokens, q, generator):
    """A wrong rule: accept like the real one, but draw a rejection's correction from p itself."""
    result = REAL_TRY(p, kids, tokens, q, generator)
    return p if isinstance(result, torch.Tensor) else result


REAL_TRY = verify_mod._try_children


@pytest.mark.parametrize("policy", ["chain:2", "tree:[[0],[1],[0,0]]"])
def test_loop_sampling_matches_target_law_and_broken_rule_fails(pair, policy, monkeypatch):
    target, drafter = pair
    good = chi2(target, drafter, policy)
    assert good < CRIT, f"speculative sampling law differs from the target's (chi2 {good:.1f})"
    monkeypatch.setattr(verify_mod, "_try_children", broken_try_children)
    bad = chi2(target, drafter, policy)
    assert bad > CRIT, f"the broken rule was not detected (chi2 {bad:.1f}); the test has no power"
