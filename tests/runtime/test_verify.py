"""Verification: greedy by hand and by brute force; sampling is lossless (and the test bites a broken rule)."""

from __future__ import annotations

import bisect
import math
from statistics import NormalDist

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from specpress.errors import RequestError
from specpress.runtime.sampling import SamplingParams, process_logits, sample
from specpress.runtime.tree import DraftTree
from specpress.runtime.verify import VerifyResult, verify, verify_greedy, verify_sampling

V = 5


def one_hot_logits(argmaxes: list[int], vocab: int = 8) -> Tensor:
    """[N, vocab] logits whose row i peaks at argmaxes[i]."""
    out = torch.zeros(len(argmaxes), vocab)
    out[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 5.0
    return out


# ---- greedy ----------------------------------------------------------------------------------


def test_greedy_full_accept_with_bonus() -> None:
    tree = DraftTree.chain(3, tokens=[1, 2, 3, 4])
    res = verify_greedy(tree, one_hot_logits([2, 3, 4, 6]))
    assert res == VerifyResult(accepted=(0, 1, 2, 3), next_token=6, tokens=(2, 3, 4, 6), path=0)
    assert res.num_accepted == 3


def test_greedy_mismatch_at_depth_one_and_two() -> None:
    tree = DraftTree.chain(3, tokens=[1, 2, 3, 4])
    res = verify_greedy(tree, one_hot_logits([5, 3, 4, 6]))
    assert (res.accepted, res.next_token, res.tokens) == ((0,), 5, (5,))
    res = verify_greedy(tree, one_hot_logits([2, 7, 4, 6]))
    assert (res.accepted, res.next_token, res.tokens) == ((0, 1), 7, (2, 7))


def test_greedy_best_of_two_branches() -> None:
    # nodes: 0 root, 1=[0], 2=[1], 3=[0,0], 4=[1,0]
    tree = DraftTree.from_choices([[0], [1], [0, 0], [1, 0]]).with_tokens([9, 1, 2, 3, 4])
    res = verify_greedy(tree, one_hot_logits([2, 3, 4, 7, 6]))   # root wants 2 -> node 2, which wants 4
    assert (res.accepted, res.tokens) == ((0, 2, 4), (2, 4, 6))
    assert tree.retrieve_indices()[res.path].tolist() == [0, 2, 4]
    # two siblings with the same token: both paths accept 1, the first wins
    tree = DraftTree.from_choices([[0], [1], [0, 0], [1, 0]]).with_tokens([9, 2, 2, 3, 4])
    res = verify_greedy(tree, one_hot_logits([2, 5, 5, 0, 0]))
    assert (res.accepted, res.next_token, res.path) == ((0, 1), 5, 0)
    res = verify_greedy(tree, one_hot_logits([2, 5, 4, 0, 0]))    # only the second sibling goes deeper
    assert (res.accepted, res.next_token) == ((0, 2, 4), 0)


trees_st = st.lists(st.integers(0, 10**6), max_size=20).map(
    lambda xs: (-1,) + tuple(x % (i + 1) for i, x in enumerate(xs)))


@settings(max_examples=60, deadline=None)
@given(trees_st, st.integers(0, 2**31 - 1))
def test_greedy_is_the_longest_matching_path(parents: tuple[int, ...], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    n, vocab = len(parents), 3
    tree = DraftTree(parents, tokens=torch.randint(0, vocab, (n,), generator=gen))
    logits = torch.randn(n, vocab, generator=gen)
    pred = logits.argmax(-1).tolist()
    res = verify_greedy(tree, logits)
    assert tree.tokens is not None and res.accepted[0] == 0
    for a, b in zip(res.accepted, res.accepted[1:]):
        assert tree.parents[b] == a and tree.tokens[b] == pred[a]
    assert res.next_token == pred[res.accepted[-1]]
    assert res.tokens == tuple(tree.tokens[i] for i in res.accepted[1:]) + (res.next_token,)

    def matched(i: int) -> int:  # longest accepted depth below node i
        return max([1 + matched(c) for c in tree.children[i] if tree.tokens[c] == pred[i]], default=0)

    assert res.num_accepted == matched(0)
    assert verify(tree, logits, SamplingParams()) == res


def test_verify_checks_its_inputs() -> None:
    tree = DraftTree.chain(2, tokens=[0, 1, 2])
    with pytest.raises(RequestError, match=r"\[3, V\]"):
        verify_greedy(tree, torch.zeros(2, 4))
    with pytest.raises(RequestError, match="with tokens"):
        verify_greedy(DraftTree.chain(2), torch.zeros(3, 4))
    with pytest.raises(RequestError, match="Generator"):
        verify(tree, torch.zeros(3, 4), SamplingParams(temperature=1.0))
    with pytest.raises(RequestError, match="q\\(x\\) > 0"):
        verify_sampling(tree, torch.zeros(3, 4), SamplingParams(temperature=1.0), torch.Generator(),
                        draft_probs=torch.tensor([[0.0, 0.0, 1.0, 0.0]] * 3))


# ---- sampling processors ---------------------------------------------------------------------


def test_process_logits() -> None:
    logits = torch.log(torch.tensor([0.1, 0.4, 0.3, 0.2]))
    assert process_logits(logits, 0.0).tolist() == [0, 1, 0, 0]
    torch.testing.assert_close(process_logits(logits, 1.0), torch.tensor([0.1, 0.4, 0.3, 0.2]))
    torch.testing.assert_close(process_logits(logits, 1.0, top_k=2), torch.tensor([0, 4 / 7, 3 / 7, 0]))
    torch.testing.assert_close(process_logits(logits, 1.0, top_p=0.7), torch.tensor([0, 4 / 7, 3 / 7, 0]))
    torch.testing.assert_close(process_logits(logits, 1.0, top_p=0.71), torch.tensor([0, 4, 3, 2]) / 9)
    torch.testing.assert_close(process_logits(logits, 1.0, top_p=0.01), torch.tensor([0.0, 1, 0, 0]))
    hot = process_logits(logits, 0.5)
    torch.testing.assert_close(hot, torch.tensor([0.01, 0.16, 0.09, 0.04]) / 0.30)
    for bad in (dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_k=-1), dict(top_p=0.0)):
        with pytest.raises(RequestError):
            SamplingParams(**bad)  # type: ignore[arg-type]
    assert sample(torch.tensor([[0.0, 3.0, 1.0]]), SamplingParams()).tolist() == [1]
    with pytest.raises(RequestError, match="Generator"):
        sample(logits, SamplingParams(temperature=1.0))


def test_sampling_accepts_everything_when_draft_equals_target() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, generator=gen)
    params = SamplingParams(temperature=1.0)
    tree = DraftTree.chain(3, tokens=[0, 1, 2, 3])
    for _ in range(50):  # p/q = 1 at every node: always accepted
        res = verify_sampling(tree, logits, params, gen, draft_probs=params.probs(logits))
        assert res.accepted == (0, 1, 2, 3)
    peaked = torch.full((4, 6), -30.0)
    peaked[torch.arange(4), torch.tensor([1, 2, 3, 4])] = 30.0
    assert verify_sampling(tree, peaked, params, gen).tokens == (1, 2, 3, 4)  # q=1 rule, p(x)=1


# ---- lossless sampling: statistical test with a negative control ------------------------------
#
# The "target" is a fixed table: the distribution of the next token given the last two tokens,
# processed with the sampling settings; the "drafter" is a different table. Each trial runs one
# verify round from the context (C0, C1) and completes to 3 tokens by plain sampling; the empirical
# law of the 3 tokens must match the exactly enumerated target law (chi-square, alpha 1e-4). The same
# trials, with the correction token drawn from p instead of the residual (a classic bug), must fail.

C0, C1, TRIALS = 2, 4, 6000
PARAMS = SamplingParams(temperature=0.9, top_k=4, top_p=0.95)


def tables() -> tuple[Tensor, Tensor, Tensor]:
    """(target logits, target probs after PARAMS, draft probs), each [prev, last, V]."""
    gen = torch.Generator().manual_seed(1234)
    target_logits = torch.randn(V, V, V, generator=gen) * 1.5
    draft_logits = 0.6 * target_logits + torch.randn(V, V, V, generator=gen)
    return target_logits, PARAMS.probs(target_logits), torch.softmax(draft_logits, -1)


def exact_law(p: Tensor) -> Tensor:
    """[V, V, V] law of the first three tokens after (C0, C1)."""
    return p[C0, C1][:, None, None] * p[C1][:, :, None] * p  # p(x1|C0,C1) p(x2|C1,x1) p(x3|x1,x2)


def chi_square(counts: Tensor, law: Tensor) -> tuple[float, float]:
    """(statistic, critical value at alpha 1e-4); cells expected below 5 are pooled."""
    n = float(counts.sum())
    counts, expected = counts.flatten().double(), law.flatten().double() * n
    if float(counts[expected == 0].sum()) > 0:
        return math.inf, 0.0  # a token the target can never produce
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = obs.numel() - 1
    z = NormalDist().inv_cdf(1 - 1e-4)
    return stat, df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3  # Wilson-Hilferty


def node_logits(tree: DraftTree, target_logits: Tensor) -> Tensor:
    """[N, V]: node i's target logits given its last two tokens (the root follows C0)."""
    assert tree.tokens is not None
    prev = [C0] + [tree.tokens[tree.parents[i]] for i in range(1, tree.size)]
    return target_logits[torch.tensor(prev), torch.tensor(tree.tokens)]


def correction_from_p(tree: DraftTree, logits: Tensor, res: VerifyResult, gen: torch.Generator) -> tuple[int, ...]:
    """The bug: on a rejection, draw the correction from p instead of the residual."""
    last = res.accepted[-1]
    if not tree.children[last]:
        return res.tokens  # a bonus token is drawn from p anyway
    fresh = int(torch.multinomial(PARAMS.probs(logits[last]), 1, generator=gen))
    return res.tokens[:-1] + (fresh,)


def laws(rounds: list[tuple[DraftTree, Tensor, Tensor | None]], p: Tensor, seed: int) -> tuple[Tensor, Tensor]:
    """Counts [V, V, V] of the first 3 tokens over trials (tree, logits [N, V], draft_probs [N, V] | None):
    (with the real rule, with the bug); each round is completed to 3 tokens by plain sampling from p."""
    gen = torch.Generator().manual_seed(seed)
    cdf = p.double().cumsum(-1).tolist()
    good, bad = torch.zeros(V, V, V), torch.zeros(V, V, V)
    for tree, logits, q in rounds:
        res = verify_sampling(tree, logits, PARAMS, gen, draft_probs=q)
        for counts, out in ((good, res.tokens), (bad, correction_from_p(tree, logits, res, gen))):
            seq = [C0, C1, *out]
            for u in torch.rand(5 - len(seq), generator=gen).tolist():
                row = cdf[seq[-2]][seq[-1]]
                seq.append(bisect.bisect_right(row, u * row[-1]))
            counts[seq[2], seq[3], seq[4]] += 1
    return good, bad


def check(good: Tensor, bad: Tensor, law: Tensor, what: str) -> None:
    stat, crit = chi_square(good, law)
    assert stat < crit, f"{what}: chi2 {stat:.1f} >= {crit:.1f}, the output law is not the target's"
    stat, crit = chi_square(bad, law)
    assert stat > crit, f"{what}: the broken rule passed too (chi2 {stat:.1f} < {crit:.1f}); the test cannot bite"


def test_eagle_tree_rule_is_lossless_and_the_test_bites() -> None:
    """EAGLE-2/3: deterministic top-2 siblings at every node, q = 1, under temperature/top-k/top-p."""
    target_logits, p, q = tables()
    tree = DraftTree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]])
    assert tree.ranks is not None
    tokens = [C1]
    for i in range(1, tree.size):  # node i = the ranks[i]-th most likely draft token after its parent
        par = tree.parents[i]
        prev = C0 if par == 0 else tokens[tree.parents[par]]
        tokens.append(int(torch.argsort(q[prev, tokens[par]], descending=True)[tree.ranks[i]]))
    tree = tree.with_tokens(tokens)
    logits = node_logits(tree, target_logits)
    good, bad = laws([(tree, logits, None)] * TRIALS, p, seed=1)
    check(good, bad, exact_law(p), "EAGLE q=1 tree rule")


def sampled_trees(parents: tuple[int, ...], target_logits: Tensor, q: Tensor, n: int,
                  gen: torch.Generator) -> list[tuple[DraftTree, Tensor, Tensor]]:
    """n drafts into a fixed shape, each node's children drawn from q without replacement."""
    shape = DraftTree(parents)
    tokens = torch.empty(n, shape.size, dtype=torch.long)
    prev = torch.empty(n, shape.size, dtype=torch.long)
    tokens[:, 0], prev[:, 0] = C1, C0
    for node in range(shape.size):
        kids = list(shape.children[node])
        if kids:
            rows = q[prev[:, node], tokens[:, node]]                                   # [n, V]
            tokens[:, kids] = torch.multinomial(rows, len(kids), replacement=False, generator=gen)
            prev[:, kids] = tokens[:, node, None]
    logits = target_logits[prev, tokens]                                               # [n, N, V]
    draft = q[prev, tokens]                                                            # [n, N, V]
    return [(shape.with_tokens(tokens[i]), logits[i], draft[i]) for i in range(n)]


@pytest.mark.parametrize("parents", [(-1, 0, 1), (-1, 0, 0, 1, 2)], ids=["chain", "siblings"])
def test_specinfer_rule_is_lossless_and_the_test_bites(parents: tuple[int, ...]) -> None:
    """SpecInfer / EAGLE-1: drafts sampled from q, accepted with min(1, p/q), residual norm(max(p-q, 0))."""
    target_logits, p, q = tables()
    rounds = sampled_trees(parents, target_logits, q, TRIALS, torch.Generator().manual_seed(7))
    good, bad = laws(rounds, p, seed=3)
    check(good, bad, exact_law(p), f"SpecInfer rule ({len(parents) - 1} draft nodes)")


def with_replacement_rule(p: Tensor, q: Tensor, drafts: list[int], gen: torch.Generator) -> int:
    """The bug: siblings drawn without replacement but verified as if drawn with replacement (q kept whole)."""
    for x in drafts:
        if float(torch.rand((), generator=gen)) * float(q[x]) < float(p[x]):
            return x
        p = (p - q).clamp(min=0.0)
        p = p / p.sum()
    return int(torch.multinomial(p, 1, generator=gen))


def test_specinfer_siblings_need_q_without_the_tried_ones() -> None:
    """First-token law of a root with 2 siblings drawn without replacement from a q far from p."""
    params = SamplingParams(temperature=1.0)
    target_logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    p = params.probs(target_logits)
    q = torch.softmax(torch.tensor([0.0, 1.0, 2.0, 0.5, 1.5]), -1)
    gen = torch.Generator().manual_seed(11)
    n, shape = 8000, DraftTree((-1, 0, 0))
    draws = torch.multinomial(q.expand(n, V), 2, replacement=False, generator=gen).tolist()
    logits, rows = target_logits.expand(3, V), q.expand(3, V)
    good, bad = torch.zeros(V), torch.zeros(V)
    for drafts in draws:
        res = verify_sampling(shape.with_tokens([0, *drafts]), logits, params, gen, draft_probs=rows)
        good[res.tokens[0]] += 1
        bad[with_replacement_rule(p, q, drafts, gen)] += 1
    stat, crit = chi_square(good, p)
    assert stat < crit, f"SpecInfer siblings: chi2 {stat:.1f} >= {crit:.1f}"
    stat, crit = chi_square(bad, p)
    assert stat > crit, f"the with-replacement rule passed too (chi2 {stat:.1f} < {crit:.1f}); the test cannot bite"
