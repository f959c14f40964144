"""Draft-policy strings: the five forms parse, round-trip, and bad input fails with the grammar."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpress.errors import RequestError
from specpress.runtime.policy import (GRAMMAR, BlockPolicy, ChainPolicy, DynamicPolicy, MTPPolicy, TreePolicy,
                                      parse_policy)


@pytest.mark.parametrize("text, expected", [
    ("chain:4", ChainPolicy(4)),
    (" chain: 1 ", ChainPolicy(1)),
    ("mtp:3", MTPPolicy(3)),
    ("block:16", BlockPolicy(16)),
    ("dynamic:depth=5,topk=8,budget=48", DynamicPolicy(5, 8, 48)),
    ("dynamic: budget=48, topk=8 ,depth=5", DynamicPolicy(5, 8, 48)),
    ("tree:[[0],[0,0],[1],[0,1]]", TreePolicy(((0,), (0, 0), (1,), (0, 1)))),
    ("tree:[(0,),(0,0),(1,)]", TreePolicy(((0,), (0, 0), (1,)))),   # vLLM speculative_token_tree form
    ("tree: [[1], [0], [1, 0]]", TreePolicy(((0,), (1,), (1, 0)))),
])
def test_parses(text: str, expected: object) -> None:
    assert parse_policy(text) == expected


def test_derived_sizes() -> None:
    tree = parse_policy("tree:[[0],[1],[0,0],[0,2],[0,0,0]]")
    assert isinstance(tree, TreePolicy)
    assert (tree.num_draft_tokens, tree.max_depth, tree.max_topk) == (5, 3, 3)
    dyn = parse_policy("dynamic:depth=2,topk=3,budget=10")
    assert (dyn.num_draft_tokens, dyn.max_depth) == (10, 3)
    assert parse_policy("block:16").num_draft_tokens == 15
    assert parse_policy("chain:4").max_depth == 4


@pytest.mark.parametrize("text, hint", [
    ("chain", "KIND:SPEC"),
    ("chain:0", "[1, 1024]"),
    ("chain:-1", "positive integer"),
    ("chain:2.5", "positive integer"),
    ("mtp:", "positive integer"),
    ("block:1", "[2, 1025]"),
    ("beam:4", "unknown policy kind 'beam'"),
    ("dynamic:depth=5,topk=8", "missing budget"),
    ("dynamic:depth=5,topk=8,budget=48,width=3", "unknown key 'width'; allowed: depth, topk, budget"),
    ("dynamic:depth=5,depth=6,topk=8,budget=4", "given twice"),
    ("dynamic:depth=1,topk=2,budget=7", "[1, 6]"),
    ("dynamic:depth=0,topk=2,budget=1", "dynamic depth"),
    ("tree:[]", "non-empty"),
    ("tree:[[0],[0,0],[0,1,0]]", "needs its parent [0, 1]"),
    ("tree:[[0],[0]]", "more than once"),
    ("tree:[[0],[-1]]", "ranks >= 0"),
    ("tree:[[True]]", "ranks >= 0"),
    ("tree:[[0],[]]", "non-empty"),
    ("tree:[[0],", "not a list literal"),
    ("tree:__import__('os')", "not a list literal"),
])
def test_bad_strings_show_the_grammar(text: str, hint: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_policy(text)
    msg = str(info.value)
    assert hint in msg
    assert GRAMMAR in msg
    for example in ("chain:4", "tree:[[0],[1],[0,0]", "dynamic:depth=5,topk=8,budget=48", "block:16", "mtp:3"):
        assert example in msg


def test_direct_construction_validates() -> None:
    with pytest.raises(RequestError):
        ChainPolicy(0)
    with pytest.raises(RequestError):
        TreePolicy(((0, 1),))
    with pytest.raises(RequestError):
        DynamicPolicy(2, 2, 11)  # 2 + 2*4 = 10 candidates at most
    assert DynamicPolicy(2, 2, 10).budget == 10


paths_st = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=20)


def _close(paths: list[list[int]]) -> list[tuple[int, ...]]:
    """Make any list of paths prefix-closed and duplicate-free."""
    out = {tuple(p[:i]) for p in paths for i in range(1, len(p) + 1)}
    return list(out)


@settings(max_examples=60, deadline=None)
@given(paths_st, st.randoms(use_true_random=False))
def test_tree_round_trip(paths: list[list[int]], rnd) -> None:
    choices = _close(paths)
    rnd.shuffle(choices)
    policy = parse_policy("tree:" + repr([list(c) for c in choices]))
    assert parse_policy(str(policy)) == policy
    assert set(policy.choices) == set(choices)
    assert list(policy.choices) == sorted(choices, key=lambda c: (len(c), c))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 200))
def test_dynamic_round_trip(depth: int, topk: int, budget: int) -> None:
    text = f"dynamic:depth={depth},topk={topk},budget={budget}"
    if budget > topk + depth * topk * topk:
        with pytest.raises(RequestError):
            parse_policy(text)
    else:
        assert str(parse_policy(text)) == text


def test_policy_module_does_not_import_torch() -> None:
    code = ("import sys, specpress.runtime, specpress.runtime.policy as p; p.parse_policy('chain:3'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
