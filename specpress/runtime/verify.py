"""Lossless verification of a draft tree against the target's logits (pure functions, CPU reference).

Inputs: a `DraftTree` with tokens, and the target's logits at every node, logits [N, V] (row i = the
target's prediction for the token after node i). Output: the accepted root-to-node path and the one
token the target adds after it (the correction on a rejection, the bonus when a leaf is reached), so
every round emits len(accepted) tokens: accepted draft tokens + next_token.

- greedy: per root-to-leaf path, the longest prefix whose tokens equal the argmax of their parent's
  logits; the longest path wins (ties: the first); next token = argmax at the last accepted node.
- sampling, q = 1 (EAGLE-2/3, deterministic top-k drafts): at the current node with target distribution
  p, try the children in order, accepting child x with probability p(x); on rejection p(x) <- 0 and p
  is renormalized; when every child fails the next token is drawn from the residual p; at a leaf the
  bonus is drawn from p. Given the drafted tokens, the output law is p whatever chose them, so this rule
  is also valid (if less efficient) for sampled drafts and DFlash/MTP chains.
- sampling with draft probabilities q (SpecInfer / EAGLE-1 v1, drafts sampled from q): child x_k is
  accepted with min(1, p_k(x_k) / q_k(x_k)); on rejection p_{k+1} = norm(max(p_k - q_k, 0)) and
  q_{k+1} = q_k with x_k removed, renormalized. This is exact when sibling k was drawn from q_k, i.e.
  siblings are drawn *without replacement* from the node's draft distribution (e.g.
  `torch.multinomial(q, n, replacement=False)`); for a chain it is the standard min(1, p/q) rule with
  residual norm(max(p - q, 0)).

p is always `process_logits(logits[node], temperature, top_k, top_p)`, exactly what plain sampling uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specpress.errors import RequestError
from specpress.runtime.sampling import SamplingParams, process_logits
from specpress.runtime.tree import DraftTree


@dataclass(frozen=True)
class VerifyResult:
    """accepted: node indices root-first (root included); next_token: the target's token after them;
    tokens: what the round emits (accepted draft tokens, then next_token); path: the row of
    `tree.retrieve_indices()` whose prefix is `accepted`. KV compaction keeps `accepted`."""

    accepted: tuple[int, ...]
    next_token: int
    tokens: tuple[int, ...]
    path: int

    @property
    def num_accepted(self) -> int:
        """Accepted draft tokens (the root and the next token excluded)."""
        return len(self.accepted) - 1


def _check(tree: DraftTree, logits: Tensor) -> tuple[int, ...]:
    if tree.tokens is None:
        raise RequestError("verification needs a draft tree with tokens (DraftTree.with_tokens)")
    if logits.dim() != 2 or logits.shape[0] != tree.size:
        raise RequestError(f"target logits must be [N, V] = [{tree.size}, V] for the tree's nodes, "
                           f"found {tuple(logits.shape)}")
    return tree.tokens


def _result(tree: DraftTree, accepted: list[int], next_token: int) -> VerifyResult:
    assert tree.tokens is not None
    last, depth = accepted[-1], len(accepted) - 1
    path = next(r for r, p in enumerate(tree.leaf_paths) if len(p) > depth and p[depth] == last)
    return VerifyResult(tuple(accepted), int(next_token),
                        tuple(tree.tokens[i] for i in accepted[1:]) + (int(next_token),), path)


def verify_greedy(tree: DraftTree, logits: Tensor) -> VerifyResult:
    """Greedy verification. tree with tokens [N]; logits [N, V]."""
    tokens = _check(tree, logits)
    ri = tree.retrieve_indices(device=logits.device)                      # [L, D+1], -1 padded
    tok = torch.tensor(tokens + (-1,), dtype=torch.long, device=logits.device)
    pred = torch.cat([logits.argmax(-1), torch.tensor([-2], device=logits.device)])  # [N+1]
    cand, want = tok[ri], pred[ri]                                        # [L, D+1]
    match = (cand[:, 1:] == want[:, :-1]).long()                          # child token == parent argmax
    acc = match.cumprod(dim=1).sum(dim=1)                                 # [L]
    best = int(torch.nonzero(acc == acc.max())[0, 0])                     # first of the longest
    n = int(acc[best])
    accepted = ri[best, : n + 1].tolist()
    return VerifyResult(tuple(accepted), int(pred[accepted[-1]]),
                        tuple(tokens[i] for i in accepted[1:]) + (int(pred[accepted[-1]]),), best)


def _uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator))


def _draw(p: Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(p, 1, generator=generator))


def verify_sampling(tree: DraftTree, logits: Tensor, params: SamplingParams, generator: torch.Generator,
                    draft_probs: Tensor | None = None) -> VerifyResult:
    """Recursive rejection sampling over siblings, lossless at any temperature > 0.

    tree with tokens [N]; logits [N, V] (target); draft_probs [N, V] or None: row i = the draft
    distribution node i's children were drawn from, without replacement (SpecInfer rule); None = the
    children are deterministic top-k picks (EAGLE-2/3 rule, q = 1).
    """
    tokens = _check(tree, logits)
    if params.greedy:
        raise RequestError("verify_sampling needs temperature > 0; use verify_greedy (or verify) at temperature 0")
    if draft_probs is not None and draft_probs.shape != logits.shape:
        raise RequestError(f"draft_probs must match the target logits' shape {tuple(logits.shape)}, "
                           f"found {tuple(draft_probs.shape)}")
    node, accepted = 0, [0]
    while True:
        p = process_logits(logits[node], params.temperature, params.top_k, params.top_p)  # [V]
        kids = tree.children[node]
        if not kids:
            return _result(tree, accepted, _draw(p, generator))  # bonus
        moved = _try_children(p, kids, tokens, None if draft_probs is None else draft_probs[node].float(),
                              generator)
        if isinstance(moved, Tensor):
            return _result(tree, accepted, _draw(moved, generator))  # correction from the residual
        node = moved
        accepted.append(node)


def _try_children(p: Tensor, kids: tuple[int, ...], tokens: tuple[int, ...], q: Tensor | None,
                  generator: torch.Generator) -> int | Tensor:
    """Try the children in order; return the accepted child, or the residual distribution [V]."""
    p = p.clone()
    tried: set[int] = set()
    for child in kids:
        x = tokens[child]
        if q is None:
            if _uniform(generator) < float(p[x]):
                return child
            p[x] = 0.0
            p = p / p.sum()
            continue
        if x in tried:  # a duplicate sibling cannot have been drawn without replacement: skip it
            continue
        tried.add(x)
        px, qx = float(p[x]), float(q[x])
        if qx <= 0.0:
            raise RequestError(f"draft token {x} has draft probability {qx}; a drafted token needs q(x) > 0 "
                               f"(draft_probs row = the distribution the children were sampled from)")
        if _uniform(generator) * qx < px:
            return child
        residual = (p - q).clamp(min=0.0)
        mass = float(residual.sum())
        # Rejection implies p(x) < q(x), hence mass > 0; only float round-off can make it vanish.
        p = residual / mass if mass > 0.0 else p
        q = q.clone()
        q[x] = 0.0
        q = q / q.sum() if float(q.sum()) > 0.0 else q
    return p


def verify(tree: DraftTree, logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None,
           draft_probs: Tensor | None = None) -> VerifyResult:
    """Greedy at temperature 0, otherwise rejection sampling (needs `generator`)."""
    if params.greedy:
        return verify_greedy(tree, logits)
    if generator is None:
        raise RequestError("sampling verification needs an explicit torch.Generator (pass generator=)")
    return verify_sampling(tree, logits, params, generator, draft_probs)
