"""Paired bootstrap CI, the Pareto front, --find-smallest's search and --max-tau-loss parsing."""

from __future__ import annotations

import numpy as np
import pytest

from specpress.errors import RequestError
from specpress.stats import bootstrap_mean_ci, paired_comparison, pareto_flags
from specpress.sweep.driver import parse_loss
from specpress.sweep.search import Candidate, Trial, find_smallest


def test_constant_shift_is_resolved_and_pure_noise_is_not():
    rng = np.random.default_rng(1)
    base = list(3 + rng.normal(0, 0.5, 100))  # large prompt-to-prompt spread
    shifted = [b - 0.05 for b in base]  # a small, exactly paired shift
    res = paired_comparison(shifted, base)
    assert res["resolved"] and res["ci"][1] < 0 and res["delta_tau"] == pytest.approx(-0.05)
    noise = rng.normal(0, 0.1, 50)
    noisy = [b + e for b, e in zip(base, np.concatenate([noise, -noise]))]  # zero-mean noise
    res = paired_comparison(noisy, base)
    assert not res["resolved"] and res["ci"][0] < 0 < res["ci"][1]
    assert res["n"] == 100 and res["resamples"] == 2000


def test_bootstrap_is_seeded_and_brackets_the_mean():
    x = list(np.random.default_rng(0).normal(1.0, 1.0, 40))
    a, b = bootstrap_mean_ci(x, seed=3), bootstrap_mean_ci(x, seed=3)
    assert a == b and a[1] < a[0] < a[2]
    assert 0.3 < a[2] - a[1] < 1.0  # about 2 x 1.96 / sqrt(40)
    assert bootstrap_mean_ci([1.0]) is None


def test_paired_comparison_skips_missing_prompts_and_checks_lengths():
    res = paired_comparison([2.0, None, 3.0], [1.0, 2.0, 2.0])
    assert res["n"] == 2 and res["delta_tau"] == 1.0
    with pytest.raises(ValueError):
        paired_comparison([1.0], [1.0, 2.0])


def test_pareto_front_on_a_constructed_set():
    items = [(100, 3.6), (50, 3.6), (25, 3.5), (25, 3.2), (30, 3.4), (10, 2.0), (10, 2.0), (200, 3.7)]
    assert pareto_flags(items) == [False, True, True, False, False, True, True, True]


def _monotone(n: int, passes_from: int):
    calls: list[str] = []
    cands = [Candidate(f"p{i}", 1000 * (i + 1)) for i in range(n)]

    def evaluate(pid: str) -> Trial:
        calls.append(pid)
        i = int(pid[1:])
        return Trial(pid, 1000 * (i + 1), 0.9 + 0.1 * (i >= passes_from) + 0.001 * i)

    return cands[::-1], evaluate, calls  # given in any order: the search sorts by bytes


@pytest.mark.parametrize("first", [0, 5, 11, 15])
def test_find_smallest_on_a_monotone_case_evaluates_few(first):
    cands, evaluate, calls = _monotone(16, first)
    res = find_smallest(cands, evaluate, 0.97)
    assert res.found == f"p{first}"
    assert len(calls) <= 6 < len(cands)  # log2(16) + 1 + the neighbour check
    assert len(set(calls)) == len(calls)
    if first > 0:
        assert f"p{first - 1}" in calls  # the neighbour below was seen to fail


def test_find_smallest_when_nothing_passes():
    cands, evaluate, calls = _monotone(8, 99)
    res = find_smallest(cands, evaluate, 0.97)
    assert res.found is None and len(calls) <= 4


def test_find_smallest_walks_down_where_the_order_is_not_monotone():
    ret = {"a": 0.99, "b": 0.90, "c": 0.99, "d": 0.99, "e": 0.99}  # b breaks monotonicity
    cands = [Candidate(k, i) for i, k in enumerate("abcde", start=1)]
    res = find_smallest(cands, lambda pid: Trial(pid, 0, ret[pid]), 0.97)
    assert res.found == "c"  # c passes, b below it fails: stop there (a is never needed)
    ret["b"] = 0.98
    res = find_smallest(cands, lambda pid: Trial(pid, 0, ret[pid]), 0.97)
    assert res.found == "a"


def test_equal_bytes_form_one_bucket_and_failures_do_not_pass():
    ret = {"rtn": 0.95, "gptq": 0.98, "big": 1.0, "broken": None}
    cands = [Candidate("big", 10), Candidate("rtn", 5), Candidate("gptq", 5), Candidate("broken", 1)]
    res = find_smallest(cands, lambda pid: Trial(pid, 0, ret[pid]), 0.97)
    assert res.found == "gptq"
    assert [t.id for t in res.trials if t.id == "broken"] == ["broken"]


@pytest.mark.parametrize("text, value", [("3%", 0.03), ("0.05", 0.05), (" 2.5 % ".strip(), 0.025)])
def test_parse_loss(text, value):
    assert parse_loss(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "0", "100%", "-1%"])
def test_parse_loss_rejects(text):
    with pytest.raises(RequestError):
        parse_loss(text)
