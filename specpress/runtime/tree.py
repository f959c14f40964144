"""The draft tree: one object that gives every view of it the runtime and the exporters need.

Node 0 is the root: the last accepted token, which the target has not processed yet. Nodes are in
topological order (every parent before its children). For a verify forward over the tree with
`past` tokens already in the target's KV cache, node i sits at position past + depth(i) and attends
to the whole cache plus its own ancestors and itself.

Views: `parents`, `depths`, `children`, `leaves`, `positions(past)`, `ancestor_mask()` (bool [N, N]),
`attention_bias()` (0 / -inf), `packed_mask()` (TensorRT-LLM's `spec_decoding_packed_mask`: int32
[N, ceil(N/32)], LSB-first, bit j%32 of word j//32 set when node i attends to node j), `verify_mask(past)`
(bool [N, past+N]), `level_mask(nodes, fed, context)` (the drafter's mask for one level of a static tree)
and `retrieve_indices()` (root-to-leaf node paths, -1 padded). The dynamic tree's per-call masks are
`Frontier.mask` / `Frontier.full_mask(context)`. Every mask the runtime builds comes from this module.

Builders: `DraftTree.from_choices` (static trees), `DraftTree.chain`, and `build_dynamic_tree` /
`DynamicTreeBuilder` (EAGLE-2: the runtime calls the drafter once per level with an explicit mask).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Mapping, Sequence

import torch
from torch import Tensor

from specpress.errors import RequestError
from specpress.runtime.policy import (BlockPolicy, ChainPolicy, DynamicPolicy, MTPPolicy, Policy, TreePolicy,
                                      validate_choices)

Device = torch.device | str | None


@dataclass(frozen=True)
class DraftTree:
    """parents[i] < i (parents[0] == -1); tokens[i] = node i's token id (None until a round fills them);
    ranks[i] = node i's sibling rank in its parent's top-k (static trees; -1 for the root)."""

    parents: tuple[int, ...]
    tokens: tuple[int, ...] | None = None
    ranks: tuple[int, ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        put = object.__setattr__
        parents = tuple(int(p) for p in self.parents)
        put(self, "parents", parents)
        if not parents or parents[0] != -1:
            raise RequestError(f"a draft tree needs a root with parent -1 at index 0, found parents {list(parents)}")
        for i, p in enumerate(parents[1:], start=1):
            if not 0 <= p < i:
                raise RequestError(f"node {i} has parent {p}; parents must come before children (0 <= parent < i)")
        for name in ("tokens", "ranks"):
            value = getattr(self, name)
            if value is not None:
                value = tuple(int(t) for t in (value.tolist() if isinstance(value, Tensor) else value))
                if len(value) != len(parents):
                    raise RequestError(f"{name} has {len(value)} entries for a tree of {len(parents)} nodes")
                put(self, name, value)

    # ---- constructors -------------------------------------------------------------------------

    @classmethod
    def from_choices(cls, choices: Sequence[Sequence[int]]) -> "DraftTree":
        """A static tree from `eagle_choices` paths (e.g. [[0],[1],[0,0]]); nodes sorted by (depth, path)."""
        paths = validate_choices(choices)
        index = {(): 0} | {p: i + 1 for i, p in enumerate(paths)}
        parents = (-1,) + tuple(index[p[:-1]] for p in paths)
        return cls(parents, ranks=(-1,) + tuple(p[-1] for p in paths))

    @classmethod
    def chain(cls, k: int, tokens: Sequence[int] | None = None) -> "DraftTree":
        """Root plus k draft tokens in a line (k >= 0)."""
        return cls((-1,) + tuple(range(k)), tokens=tokens, ranks=(-1,) + (0,) * k)

    def with_tokens(self, tokens: Sequence[int] | Tensor) -> "DraftTree":
        """The same structure with this round's tokens [N] (node 0 = the root token).

        The structural views already computed (masks, paths) are shared, not recomputed.
        """
        out = DraftTree(self.parents, tuple(tokens.tolist() if isinstance(tokens, Tensor) else tokens), self.ranks)
        for name in _STRUCTURE:
            if name in self.__dict__:
                out.__dict__[name] = self.__dict__[name]
        return out

    def to_choices(self) -> list[list[int]]:
        """The `eagle_choices` paths of nodes 1..N-1 (needs ranks)."""
        if self.ranks is None:
            raise RequestError("this tree has no sibling ranks (built from parents alone); it has no choices form")
        return [[self.ranks[j] for j in self.path(i)[1:]] for i in range(1, self.size)]

    # ---- structure ----------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return len(self.parents)

    def __len__(self) -> int:
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        d = [0] * self.size
        for i in range(1, self.size):
            d[i] = d[self.parents[i]] + 1
        return tuple(d)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for i in range(1, self.size):
            kids[self.parents[i]].append(i)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def leaves(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.children) if not k)

    def path(self, node: int) -> tuple[int, ...]:
        """Node indices from the root to `node`, both included."""
        out = [node]
        while out[-1] != 0:
            out.append(self.parents[out[-1]])
        return tuple(reversed(out))

    # ---- tensors ------------------------------------------------------------------------------

    def token_tensor(self, device: Device = None) -> Tensor:
        """tokens [N] long."""
        if self.tokens is None:
            raise RequestError("this draft tree has no tokens yet; fill them with with_tokens(...)")
        return torch.tensor(self.tokens, dtype=torch.long, device=device)

    def positions(self, past: int, device: Device = None) -> Tensor:
        """[N] long: past + depth (the root sits right after the `past` cached tokens)."""
        return torch.tensor(self.depths, dtype=torch.long, device=device) + past

    @cached_property
    def _mask(self) -> Tensor:
        m = torch.eye(self.size, dtype=torch.bool)
        for i in range(1, self.size):
            m[i] |= m[self.parents[i]]
        return m

    def ancestor_mask(self, device: Device = None) -> Tensor:
        """bool [N, N]: row i is True at i's ancestors and at i itself."""
        return self._mask.to(device) if device is not None else self._mask.clone()

    def attention_bias(self, dtype: torch.dtype = torch.float32, device: Device = None) -> Tensor:
        """[N, N] additive bias: 0 where attending, -inf elsewhere."""
        zero = torch.zeros((), dtype=dtype)
        return torch.where(self._mask, zero, torch.tensor(float("-inf"), dtype=dtype)).to(device)

    def packed_mask(self, device: Device = None) -> Tensor:
        """int32 [N, ceil(N/32)]: bit j%32 of word j//32 of row i set when node i attends to node j."""
        return pack_mask(self._mask).to(device)

    def level_mask(self, nodes: Sequence[int], fed: Mapping[int, int], context: int, device: Device = None) -> Tensor:
        """bool [k, context + len(fed) + k]: the drafter's mask when it is fed `nodes` (k nodes of one level)
        after the `fed` nodes of earlier levels (node -> slot after the drafter's `context` committed slots).
        Row r sees every committed slot, its fed ancestors and itself (slot len(fed) + r); the root is
        part of the committed context."""
        k, start = len(nodes), len(fed)
        mask = torch.zeros(k, context + start + k, dtype=torch.bool, device=device)
        mask[:, :context] = True
        for row, node in enumerate(nodes):
            mask[row, context + start + row] = True
            for anc in self.path(node)[1:-1]:
                mask[row, context + fed[anc]] = True
        return mask

    def verify_mask(self, past: int, device: Device = None) -> Tensor:
        """bool [N, past+N] for the target's verify forward: every cached slot, then the tree mask."""
        full = torch.ones(self.size, past, dtype=torch.bool)
        return torch.cat([full, self._mask], dim=1).to(device)

    @cached_property
    def leaf_paths(self) -> tuple[tuple[int, ...], ...]:
        """Root-to-leaf node paths, one per leaf (in `leaves` order), unpadded."""
        return tuple(self.path(leaf) for leaf in self.leaves)

    @cached_property
    def _retrieve(self) -> Tensor:
        width = self.max_depth + 1
        rows = [list(p) + [-1] * (width - len(p)) for p in self.leaf_paths]
        return torch.tensor(rows, dtype=torch.long)

    def retrieve_indices(self, device: Device = None) -> Tensor:
        """long [num_leaves, max_depth+1]: row r = node path root -> leaves[r], padded with -1."""
        return self._retrieve.to(device) if device is not None else self._retrieve.clone()


_STRUCTURE = ("depths", "children", "leaves", "leaf_paths", "_mask", "_retrieve")


def pack_mask(mask: Tensor) -> Tensor:
    """bool [..., N] -> int32 [..., ceil(N/32)], LSB-first (TensorRT-LLM's packed spec-decoding mask)."""
    n = mask.shape[-1]
    words = (n + 31) // 32
    padded = torch.zeros(*mask.shape[:-1], words * 32, dtype=torch.int64, device=mask.device)
    padded[..., :n] = mask.to(torch.int64)
    weights = torch.tensor([1 << b for b in range(32)], dtype=torch.int64, device=mask.device)
    packed = (padded.view(*mask.shape[:-1], words, 32) * weights).sum(-1)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def unpack_mask(packed: Tensor, n: int) -> Tensor:
    """int32 [..., W] -> bool [..., n] (inverse of `pack_mask`)."""
    bits = (packed.to(torch.int64)[..., None] >> torch.arange(32, device=packed.device)) & 1
    return bits.flatten(-2)[..., :n].bool()


def tree_for_policy(policy: Policy) -> DraftTree | None:
    """The fixed node structure a policy drafts into; None for `dynamic` (built per round)."""
    if isinstance(policy, TreePolicy):
        return DraftTree.from_choices(policy.choices)
    if isinstance(policy, (ChainPolicy, MTPPolicy, BlockPolicy)):
        return DraftTree.chain(policy.num_draft_tokens)
    assert isinstance(policy, DynamicPolicy)
    return None


# ----------------------------------------------------------------------------------------------
# EAGLE-2 dynamic tree
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frontier:
    """One drafter call of the dynamic expansion: run these k nodes, return log-probs [k, V].

    tokens [k] long: the nodes' token ids (target vocabulary), to embed.
    parent_slots [k] long: the fed slot of each node's parent (-1 = the root), e.g. to pick the
        parent's hidden state as EAGLE's input feature.
    level: the nodes' depth in the tree (1 = children of the root); position = root position + level.
    mask bool [k, fed + k]: over [the `fed` nodes of earlier calls, in feeding order ; these k nodes];
        True at the node's fed ancestors and itself. The drafter's committed context (the accepted
        tokens through the root) is visible to all; `full_mask(context)` prepends it.
    """

    tokens: Tensor
    parent_slots: Tensor
    level: int
    mask: Tensor

    @property
    def fed(self) -> int:
        """Nodes fed by earlier calls (the drafter's KV holds them after its committed context)."""
        return self.mask.shape[1] - self.mask.shape[0]

    def full_mask(self, context: int) -> Tensor:
        """bool [k, context + fed + k]."""
        k, width = self.mask.shape
        full = torch.ones(k, context + width, dtype=torch.bool, device=self.mask.device)
        full[:, context:] = self.mask
        return full


@dataclass(frozen=True)
class DynamicDraft:
    """The reranked EAGLE-2 tree.

    scores [N] float: cumulative draft log-prob of each node (root 0).
    fed_slots[i]: the drafter slot (feeding order) where node i was fed, -1 if never fed (root, leaves
        of the last level and candidates outside the frontier).
    """

    tree: DraftTree
    scores: Tensor
    fed_slots: tuple[int, ...]


class DynamicTreeBuilder:
    """EAGLE-2 stepwise: top-k of the root, then `depth` expansions of the global top-k frontier by
    cumulative log-prob, then rerank all candidates and keep the best `budget` (a connected subtree).

        b = DynamicTreeBuilder(root_token, root_logprobs, depth=5, topk=8, budget=48)
        while (f := b.next_frontier()) is not None:
            b.expand(drafter(f))            # log-probs [k, V]
        draft = b.finish()

    token_map [V_draft] long (optional): draft-vocab index -> target token id (EAGLE-3's d2t applied).
    """

    def __init__(self, root_token: int, root_logprobs: Tensor, *, depth: int, topk: int, budget: int,
                 token_map: Tensor | None = None) -> None:
        policy = DynamicPolicy(depth, topk, budget)  # validates the ranges
        self.depth, self.topk, self.budget = policy.depth, policy.topk, policy.budget
        self.root_token = int(root_token)
        self.token_map = None if token_map is None else token_map.to(root_logprobs.device)
        self.device = root_logprobs.device
        # Every candidate, by id, as Python lists: after the drafter's top-k the tree is a few dozen
        # numbers, and list arithmetic costs less per round than tensor ops on [k, k] (measured).
        self._tok: list[int] = []         # target token id
        self._score: list[float] = []     # cumulative log-prob
        self._par: list[int] = []         # parent candidate id (-1 = the root)
        self._fed_cands: list[int] = []   # candidate id of each fed slot, in feeding order
        self._slot: dict[int, int] = {}   # fed candidate -> its slot
        self._chain: dict[int, list[int]] = {-1: []}  # fed candidate -> slots of it and its fed ancestors
        self._expansions = 0
        tok, lp = self._topk(root_logprobs.reshape(1, -1))
        self._frontier = self._add(tok[0], lp[0], [-1] * topk)
        self._frontier_scores = lp[0]

    def _topk(self, logprobs: Tensor) -> tuple[list[list[int]], list[list[float]]]:
        """[r, V] -> (target token ids [r][k], log-probs [r][k] clamped to <= 0)."""
        if logprobs.shape[-1] < self.topk:
            raise RequestError(f"topk={self.topk} exceeds the drafter's vocabulary of {logprobs.shape[-1]}")
        top = torch.topk(logprobs.float(), self.topk, dim=-1)
        ids = top.indices if self.token_map is None else self.token_map[top.indices]
        values = top.values.tolist()
        # topk ranks NaN above every number, so a NaN anywhere in a row shows up in its first value.
        if any(math.isnan(row[0]) for row in values):
            raise RequestError("the drafter returned NaN log-probabilities")
        return ids.tolist(), [[min(v, 0.0) for v in row] for row in values]

    def _add(self, tokens: list[int], scores: list[float], parents: list[int]) -> list[int]:
        first = len(self._tok)
        self._tok.extend(tokens)
        self._score.extend(scores)
        self._par.extend(parents)
        return list(range(first, len(self._tok)))

    def next_frontier(self) -> Frontier | None:
        """The next drafter call, or None once `depth` expansions are done."""
        if self._expansions >= self.depth:
            return None
        fed, k = len(self._fed_cands), self.topk
        rows, parent_slots = [], []
        for row, cand in enumerate(self._frontier):
            p = self._par[cand]
            parent_slots.append(self._slot[p] if p >= 0 else -1)
            line = [False] * (fed + k)
            for slot in self._chain[p]:  # fed slots of the parent and its ancestors
                line[slot] = True
            line[fed + row] = True
            rows.append(line)
        return Frontier(tokens=torch.tensor([self._tok[c] for c in self._frontier], device=self.device),
                        parent_slots=torch.tensor(parent_slots, device=self.device),
                        level=self._expansions + 1, mask=torch.tensor(rows, dtype=torch.bool, device=self.device))

    def expand(self, logprobs: Tensor) -> None:
        """Take the drafter's log-probs [k, V] for the frontier just returned by next_frontier()."""
        if self._expansions >= self.depth:
            raise RequestError(f"expand() called after all {self.depth} expansions")
        k = self.topk
        if logprobs.shape[0] != k:
            raise RequestError(f"expected log-probs for the {k} frontier nodes, found shape {tuple(logprobs.shape)}")
        for cand in self._frontier:
            slot = self._slot[cand] = len(self._fed_cands)
            self._fed_cands.append(cand)
            self._chain[cand] = self._chain[self._par[cand]] + [slot]
        tok, lp = self._topk(logprobs)
        cu = [base + v for base, row in zip(self._frontier_scores, lp) for v in row]  # [k * k], row-major
        ids = self._add([t for row in tok for t in row], cu, [c for c in self._frontier for _ in range(k)])
        best = sorted(range(k * k), key=cu.__getitem__, reverse=True)[:k]  # stable: ties keep the earlier
        self._frontier, self._frontier_scores = [ids[b] for b in best], [cu[b] for b in best]
        self._expansions += 1

    def finish(self) -> DynamicDraft:
        """Rerank all candidates; keep the `budget` best, parents before children."""
        score, par = self._score, self._par
        keep_n = min(self.budget, len(score))
        # Stable sort: on equal scores the earlier candidate (a parent precedes its children) wins.
        keep = sorted(sorted(range(len(score)), key=score.__getitem__, reverse=True)[:keep_n])
        node_of = {-1: 0} | {c: i + 1 for i, c in enumerate(keep)}
        missing = [c for c in keep if par[c] not in node_of]
        assert not missing, f"dynamic tree not connected: candidates {missing} lost their parents"
        tree = DraftTree((-1,) + tuple(node_of[par[c]] for c in keep),
                         tokens=(self.root_token,) + tuple(self._tok[c] for c in keep))
        node_scores = torch.tensor([0.0] + [score[c] for c in keep], device=self.device)
        return DynamicDraft(tree, node_scores, (-1,) + tuple(self._slot.get(c, -1) for c in keep))


def build_dynamic_tree(expand_fn: Callable[[Frontier], Tensor], root_logprobs: Tensor, depth: int, topk: int,
                       budget: int, *, root_token: int, token_map: Tensor | None = None) -> DynamicDraft:
    """EAGLE-2 in one call: `expand_fn(frontier) -> log-probs [k, V]` is called `depth` times, in order.

    root_logprobs [V]: the drafter's log-probs after the root.
    """
    builder = DynamicTreeBuilder(root_token, root_logprobs, depth=depth, topk=topk, budget=budget,
                                 token_map=token_map)
    while (frontier := builder.next_frontier()) is not None:
        builder.expand(expand_fn(frontier))
    return builder.finish()
