"""Draft trees: the views agree with each other on random trees; EAGLE-2's builder keeps the best subtree."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from hypothesis import given, settings
from hypothesis import strategies as st

from specpress.errors import RequestError
from specpress.models.target import TargetConfig, TargetModel
from specpress.runtime.policy import parse_policy
from specpress.runtime.tree import (DraftTree, Frontier, build_dynamic_tree, pack_mask, tree_for_policy,
                                    unpack_mask)

# parents[i] drawn uniformly from [0, i): every topologically ordered tree of up to 70 nodes
trees_st = st.integers(0, 69).flatmap(lambda n: st.lists(st.integers(0, 10**6), min_size=n, max_size=n)).map(
    lambda xs: DraftTree((-1,) + tuple(x % (i + 1) for i, x in enumerate(xs))))


@settings(max_examples=80, deadline=None)
@given(trees_st, st.integers(0, 40))
def test_views_agree(tree: DraftTree, past: int) -> None:
    n = tree.size
    m = tree.ancestor_mask()
    assert m.shape == (n, n) and m.dtype == torch.bool
    assert m.diagonal().all()
    mi = m.int()
    assert torch.equal((mi @ mi > 0), m)  # ancestor-closed: i->j and j->l imply i->l
    for i in range(n):
        assert set(torch.nonzero(m[i]).flatten().tolist()) == set(tree.path(i))
        assert tree.depths[i] == len(tree.path(i)) - 1
    assert torch.equal(tree.positions(past), torch.tensor(tree.depths) + past)
    # additive bias and the full verify mask
    bias = tree.attention_bias()
    assert torch.equal(bias == 0, m) and bool(torch.isneginf(bias[~m]).all())
    vm = tree.verify_mask(past)
    assert vm.shape == (n, past + n) and bool(vm[:, :past].all()) and torch.equal(vm[:, past:], m)
    # packed mask: [N, ceil(N/32)] int32 that unpacks to the bool mask
    packed = tree.packed_mask()
    assert packed.dtype == torch.int32 and packed.shape == (n, math.ceil(n / 32))
    assert torch.equal(unpack_mask(packed, n), m)
    for i in range(n):
        for j in range(n):
            assert bool((int(packed[i, j // 32]) >> (j % 32)) & 1) == bool(m[i, j])
    # retrieve indices: root-to-leaf paths, -1 padded, one per leaf
    ri = tree.retrieve_indices()
    assert ri.shape == (len(tree.leaves), tree.max_depth + 1)
    childless = {i for i in range(n) if i not in set(tree.parents[1:])}
    assert set(tree.leaves) == childless
    ends = []
    for row in ri.tolist():
        length = next((c for c, v in enumerate(row) if v < 0), len(row))
        assert all(v == -1 for v in row[length:])
        assert row[0] == 0
        for a, b in zip(row[: length - 1], row[1:length]):
            assert tree.parents[b] == a
        ends.append(row[length - 1])
    assert sorted(ends) == sorted(childless)


@settings(max_examples=60, deadline=None)
@given(trees_st, st.integers(0, 9))
def test_level_masks_are_the_ancestor_mask_over_fed_slots(tree: DraftTree, context: int) -> None:
    """Feeding a static tree level by level (as drafting.expand does): each level's drafter mask sees every
    committed slot and, among the fed nodes, exactly the ancestor_mask row of the node (root excluded)."""
    m, fed = tree.ancestor_mask(), {}
    for level in range(1, tree.max_depth + 1):
        nodes = [i for i in range(tree.size) if tree.depths[i] == level]
        mask = tree.level_mask(nodes, fed, context)
        slots = {**fed, **{node: len(fed) + row for row, node in enumerate(nodes)}}
        assert mask.shape == (len(nodes), context + len(slots)) and bool(mask[:, :context].all())
        for row, node in enumerate(nodes):
            want = torch.zeros(len(slots), dtype=torch.bool)
            for other, slot in slots.items():
                want[slot] = m[node, other]
            assert torch.equal(mask[row, context:], want)
        fed = slots


def test_packed_mask_matches_tensorrt_llm_chain_rows() -> None:
    # TensorRT-LLM: a chain's row j packs to (1 << (j+1)) - 1, LSB-first, words of 32 nodes.
    tree = DraftTree.chain(39)
    packed = tree.packed_mask()
    assert packed.shape == (40, 2)
    for j in range(31):
        assert int(packed[j, 0]) == (1 << (j + 1)) - 1 and int(packed[j, 1]) == 0
    assert int(packed[31, 0]) == -1  # all 32 bits set, as int32
    assert int(packed[35, 0]) == -1 and int(packed[35, 1]) == (1 << 4) - 1
    assert torch.equal(pack_mask(torch.tensor([[True, False, True]])), torch.tensor([[5]], dtype=torch.int32))


def test_from_choices() -> None:
    tree = DraftTree.from_choices([[1], [0], [0, 0], [1, 0], [0, 1], [0, 0, 0]])
    # sorted by (depth, path): [0] [1] [0,0] [0,1] [1,0] [0,0,0]
    assert tree.parents == (-1, 0, 0, 1, 1, 2, 3)
    assert tree.ranks == (-1, 0, 1, 0, 1, 0, 0)
    assert tree.depths == (0, 1, 1, 2, 2, 2, 3)
    assert tree.to_choices() == [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    assert tree.leaves == (4, 5, 6)
    assert tree.retrieve_indices().tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]
    with pytest.raises(RequestError, match="prefix-closed"):
        DraftTree.from_choices([[0, 0]])


def test_policies_to_trees() -> None:
    assert tree_for_policy(parse_policy("chain:3")) == DraftTree.chain(3)
    assert tree_for_policy(parse_policy("block:5")).size == 5
    assert tree_for_policy(parse_policy("mtp:2")).parents == (-1, 0, 1)
    assert tree_for_policy(parse_policy("tree:[[0],[1]]")).parents == (-1, 0, 0)
    assert tree_for_policy(parse_policy("dynamic:depth=2,topk=2,budget=4")) is None


def test_bad_trees() -> None:
    for parents in [(), (0,), (-1, 1), (-1, 0, 3), (-1, -1)]:
        with pytest.raises(RequestError):
            DraftTree(parents)
    with pytest.raises(RequestError, match="tokens has 2 entries"):
        DraftTree((-1, 0, 0), tokens=(1, 2))
    with pytest.raises(RequestError, match="no tokens"):
        DraftTree.chain(2).token_tensor()


def test_tree_verify_forward_matches_sequential_decoding() -> None:
    """The verify mask and positions make each node's target logits those of its own root path."""
    torch.manual_seed(0)
    cfg = TargetConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = TargetModel(cfg).eval()
    prompt = torch.randint(0, 50, (1, 7))
    tree = DraftTree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    tree = tree.with_tokens(torch.randint(0, 50, (tree.size,)))
    with torch.no_grad():
        cache = model.new_cache(32)
        model(prompt, cache=cache)
        past = cache.length
        out = model(tree.token_tensor()[None], cache=cache, positions=tree.positions(past),
                    mask=tree.verify_mask(past))
        for i in range(tree.size):
            seq = torch.cat([prompt[0], tree.token_tensor()[list(tree.path(i))]])[None]
            ref = model(seq).logits[0, -1]
            torch.testing.assert_close(out.logits[0, i], ref, atol=1e-4, rtol=1e-4)


# ---- EAGLE-2 dynamic tree -------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 10**6), st.integers(0, 2**31 - 1))
def test_dynamic_tree_keeps_the_best_connected_subtree(depth: int, topk: int, budget_seed: int, seed: int) -> None:
    vocab = 12
    budget = 1 + budget_seed % (topk + depth * topk * topk)
    gen = torch.Generator().manual_seed(seed)
    root_lp = torch.log_softmax(torch.randn(vocab, generator=gen) * 2, -1)
    slot_score: list[float] = []  # cumulative score of every fed node, by slot
    slot_lp: list[Tensor] = []    # the log-probs the drafter returned after each fed node
    candidates: list[float] = sorted(root_lp.topk(topk).values.tolist(), reverse=True)
    levels: list[int] = []
    parent_slot_of: list[int] = []  # fed slot -> its parent's fed slot (-1 = root)
    level_scores: list[list[float]] = [root_lp.topk(topk).values.tolist()]  # candidates per level

    def expand(f: Frontier) -> Tensor:
        k = f.tokens.numel()
        assert k == topk and f.mask.shape == (k, f.fed + k) and f.fed == len(slot_score)
        assert f.full_mask(5).shape == (k, 5 + f.fed + k)
        levels.append(f.level)
        scores = []
        for row in range(k):
            ps, tok = int(f.parent_slots[row]), int(f.tokens[row])
            parent_lp, parent_score = (root_lp, 0.0) if ps < 0 else (slot_lp[ps], slot_score[ps])
            assert tok in parent_lp.topk(topk).indices.tolist()
            scores.append(parent_score + float(parent_lp[tok]))
            # the mask row marks exactly the fed ancestors (via parent slots) and the node itself
            anc, s = set(), ps
            while s >= 0:
                anc.add(s)
                s = parent_slot_of[s]
            assert set(torch.nonzero(f.mask[row, : f.fed]).flatten().tolist()) == anc
            assert bool(f.mask[row, f.fed + row]) and int(f.mask[row, f.fed:].sum()) == 1
            parent_slot_of.append(ps)
        lp = torch.log_softmax(torch.randn(k, vocab, generator=gen) * 2, -1)
        # the frontier is the global top-k of the previous level's candidates
        level_cands = sorted(level_scores[-1], reverse=True)
        assert sorted(scores, reverse=True) == pytest.approx(level_cands[:k], abs=1e-5)
        slot_score.extend(scores)
        slot_lp.extend(lp)
        new = [s + v for s, row in zip(scores, lp) for v in row.topk(topk).values.tolist()]
        level_scores.append(new)
        candidates.extend(new)
        return lp

    draft = build_dynamic_tree(expand, root_lp, depth, topk, budget, root_token=3)
    tree = draft.tree
    assert levels == list(range(1, depth + 1))
    assert tree.size == budget + 1 and tree.tokens is not None and tree.tokens[0] == 3
    assert tree.max_depth <= depth + 1
    if budget == topk + depth * topk * topk:  # every candidate kept: the deepest level is there
        assert tree.max_depth == depth + 1
    sc = draft.scores.tolist()
    assert sc[0] == 0.0
    for i in range(1, tree.size):
        assert sc[i] <= sc[tree.parents[i]] + 1e-6
    # the kept scores are the best `budget` of all candidates
    assert sorted(sc[1:], reverse=True) == pytest.approx(sorted(candidates, reverse=True)[:budget], abs=1e-5)
    # fed nodes carry their slot; their scores are the ones the drafter saw
    for i, slot in enumerate(draft.fed_slots):
        if slot >= 0:
            assert sc[i] == pytest.approx(slot_score[slot], abs=1e-5)
    # siblings carry distinct tokens
    for kids in tree.children:
        toks = [tree.tokens[c] for c in kids]
        assert len(toks) == len(set(toks))


def test_dynamic_tree_token_map_and_errors() -> None:
    root_lp = torch.log_softmax(torch.tensor([3.0, 2.0, 1.0, 0.0]), -1)
    token_map = torch.tensor([100, 101, 102, 103])
    draft = build_dynamic_tree(lambda f: torch.log_softmax(torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 2), -1),
                               root_lp, 1, 2, 6, root_token=7, token_map=token_map)
    assert draft.tree.tokens == (7, 100, 101, 103, 102, 103, 102)
    assert draft.tree.parents == (-1, 0, 0, 1, 1, 2, 2)
    with pytest.raises(RequestError, match="exceeds the drafter's vocabulary"):
        build_dynamic_tree(lambda f: f, root_lp, 1, 5, 3, root_token=0)
    with pytest.raises(RequestError, match="NaN"):
        build_dynamic_tree(lambda f: torch.full((2, 4), float("nan")), root_lp, 1, 2, 3, root_token=0)
    with pytest.raises(RequestError, match="budget"):
        build_dynamic_tree(lambda f: f, root_lp, 1, 2, 7, root_token=0)

