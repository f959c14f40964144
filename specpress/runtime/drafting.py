"""Draft sessions: a drafter's state across rounds, and how it turns a root token into a draft tree.

A session calls the drafter only through its runner protocol (runtime/backends/base.py: FeatureDrafter,
TokenDrafter, BlockDrafter), whatever backend runs it. It sees three events: `start` (after the target's
prefill), `propose` (draft a tree under the root, the last committed token) and `accept` (after
verification: keep the accepted path).

- FeatureSession (eagle, eagle3, mtp): drafter position j reads (feature of token j, token j+1) and
  predicts token j+2. The features of committed tokens come from the target; draft steps feed back the
  drafter's own output. After a round the draft slots are dropped from the drafter's cache and the
  accepted tokens are fed again with the target's features (as EAGLE does).
- LMSession (lm): an independent LM; its cache keeps the accepted draft slots (compacted in place).
- BlockSession (dflash): one pass over [root, MASK x (B-1)] with the committed context injected as K/V.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

import torch
from torch import Tensor

from specpress.device import wall_ms
from specpress.errors import RequestError
from specpress.models.drafter import get_family
from specpress.models.target import TargetOutput
from specpress.runtime.backends.base import AnyDrafter, BlockDrafter, DraftCache, FeatureDrafter, TokenDrafter
from specpress.runtime.policy import BlockPolicy, ChainPolicy, DynamicPolicy, MTPPolicy, Policy, TreePolicy
from specpress.runtime.sampling import SamplingParams, process_logits
from specpress.runtime.tree import DraftTree, DynamicTreeBuilder, tree_for_policy
from specpress.runtime.verify import VerifyResult

# step(tokens [k], parent_hidden [k, H] | None, level, mask [k, cache+k]) -> (logits [k, Vd], hidden [k, H]);
# level = the nodes' depth below the root (their position is the root's position + level).
StepFn = Callable[[Tensor, "Tensor | None", int, Tensor], tuple[Tensor, "Tensor | None"]]

# The family descriptor names the policy kinds a family runs (models/family.py); these are their classes.
POLICY_KINDS: dict[str, type] = {p.kind: p for p in (ChainPolicy, TreePolicy, DynamicPolicy, MTPPolicy, BlockPolicy)}


@dataclass
class Proposal:
    tree: DraftTree  # with tokens (target vocabulary), node 0 = root
    draft_probs: Tensor | None  # [N, V] rows = distribution node i's children were sampled from; None = top-k
    fed_slots: dict[int, int]  # node -> drafter cache slot (after the committed context) where it was fed


def check_policy(family: str, policy: Policy) -> None:
    allowed = tuple(POLICY_KINDS[k] for k in get_family(family).policies)
    if not isinstance(policy, allowed):
        names = {ChainPolicy: "chain:K", TreePolicy: "tree:[...]", DynamicPolicy: "dynamic:depth=D,topk=K,budget=N",
                 MTPPolicy: "mtp:K", BlockPolicy: "block:B"}
        raise RequestError(f"policy {policy} cannot run with a {family} drafter; use one of "
                           f"{', '.join(names[a] for a in allowed)}")


def draft_slots(policy: Policy) -> int:
    """Most drafter cache slots one round's drafting can use beyond the committed context."""
    if isinstance(policy, DynamicPolicy):
        return policy.depth * policy.topk
    return policy.num_draft_tokens + 1


def expand(policy: Policy, root: int, root_logits: Tensor, root_hidden: Tensor | None, step: StepFn,
           context: int, params: SamplingParams, generator: torch.Generator | None,
           token_map: Tensor | None, vocab: int) -> Proposal:
    """Grow a draft tree under `root` by calling `step` once per tree level.

    root_logits [Vd]: the drafter's logits for the root's children; root_hidden [H]: the drafter output
    at the root (parent hidden of level-1 nodes); context: drafter cache slots before the draft;
    token_map [Vd] (draft id -> target id) or None.
    """
    if isinstance(policy, DynamicPolicy):
        return _expand_dynamic(policy, root, root_logits, root_hidden, step, context, token_map)
    tree = tree_for_policy(policy)
    assert tree is not None and tree.ranks is not None
    sample_chain = (not params.greedy) and tree.max_depth == tree.size - 1
    n, dev = tree.size, root_logits.device
    tokens = [root] + [-1] * (n - 1)
    probs = torch.zeros(n, vocab, device=dev) if sample_chain else None
    hidden: dict[int, Tensor | None] = {0: root_hidden}
    fed: dict[int, int] = {}
    to_target = (lambda i: i) if token_map is None else (lambda i: int(token_map[i]))

    def fill_children(node: int, logits: Tensor) -> None:
        kids = tree.children[node]
        if not kids:
            return
        if sample_chain:
            q = process_logits(logits.float(), params.temperature, params.top_k, params.top_p)
            full = q if token_map is None else torch.zeros(vocab, device=dev).index_add_(0, token_map.to(dev), q)
            probs[node] = full  # type: ignore[index]
            tokens[kids[0]] = int(torch.multinomial(full, 1, generator=generator))
            return
        top = torch.topk(logits.float(), max(tree.ranks[k] for k in kids) + 1).indices.tolist()  # type: ignore[index]
        for k in kids:
            tokens[k] = to_target(top[tree.ranks[k]])  # type: ignore[index]

    fill_children(0, root_logits)
    for level in range(1, tree.max_depth):
        feed = [i for i in range(n) if tree.depths[i] == level and tree.children[i]]
        if not feed:
            break
        start = len(fed)
        mask = tree.level_mask(feed, fed, context, dev)
        parents = [hidden[tree.parents[i]] for i in feed]
        ph = None if parents[0] is None else torch.stack(parents)  # type: ignore[arg-type]
        logits, h = step(torch.tensor([tokens[i] for i in feed], device=dev), ph, level, mask)
        for row, node in enumerate(feed):
            fed[node] = start + row
            hidden[node] = None if h is None else h[row]
            fill_children(node, logits[row])
    return Proposal(tree.with_tokens(tokens), probs, fed)


def _expand_dynamic(policy: DynamicPolicy, root: int, root_logits: Tensor, root_hidden: Tensor | None,
                    step: StepFn, context: int, token_map: Tensor | None) -> Proposal:
    builder = DynamicTreeBuilder(root, torch.log_softmax(root_logits.float(), -1), depth=policy.depth,
                                 topk=policy.topk, budget=policy.budget, token_map=token_map)
    fed_hidden: list[Tensor] = []
    while (f := builder.next_frontier()) is not None:
        ph = None
        if root_hidden is not None:
            ph = torch.stack([root_hidden if s < 0 else fed_hidden[s] for s in f.parent_slots.tolist()])
        logits, h = step(f.tokens, ph, f.level, f.full_mask(context))
        if h is not None:
            fed_hidden.extend(h.unbind(0))
        builder.expand(torch.log_softmax(logits.float(), -1))
    draft = builder.finish()
    fed = {node: slot for node, slot in enumerate(draft.fed_slots) if slot >= 0}
    return Proposal(draft.tree, None, fed)


R = TypeVar("R", FeatureDrafter, TokenDrafter, BlockDrafter)


class DraftSession(ABC, Generic[R]):
    """A drafter's state across rounds. It calls the drafter only through `self.runner`, of its kind's protocol."""

    runner: R
    forward_ms: float = 0.0  # wall time spent inside drafter forwards so far (the rest of drafting is overhead)

    def __init__(self, runner: R, capacity: int) -> None:
        self.runner = runner
        self.family = runner.family
        self.taps = tuple(runner.taps)  # target taps the session needs from every target forward
        self.device = runner.device
        self.cache: DraftCache = runner.new_cache(capacity)

    def _timed(self, fn: Callable, *args, **kwargs):
        """Run one piece of drafter compute (a forward, the tap fusion), adding its wall time to `forward_ms`."""
        dev = self.device
        t0 = wall_ms(dev)
        out = fn(*args, **kwargs)
        self.forward_ms += wall_ms(dev) - t0
        return out

    @abstractmethod
    def start(self, prompt: Sequence[int], out: TargetOutput, first: int) -> None: ...

    @abstractmethod
    def propose(self, root: int, policy: Policy, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal: ...

    @abstractmethod
    def accept(self, proposal: Proposal, result: VerifyResult, out: TargetOutput) -> None: ...


def features(session: "FeatureSession | BlockSession", out: TargetOutput, rows: list[int] | None = None) -> Tensor:
    """[T, F]: the drafter's input features from a target forward, for all positions or `rows` only.
    Rows are picked before the taps are fused: fusing is row-wise, and after a verify forward only the
    accepted path's rows are needed."""
    if not session.taps:
        return out.hidden[0] if rows is None else out.hidden[0, rows]
    taps = out.taps if rows is None else {i: t[:, rows] for i, t in out.taps.items()}
    return session._timed(session.runner.fuse_taps, taps)[0]


class FeatureSession(DraftSession[FeatureDrafter]):
    """eagle / eagle3 / mtp: inputs are (feature of token j, token j+1) pairs."""

    def __init__(self, runner: FeatureDrafter, capacity: int) -> None:
        super().__init__(runner, capacity)
        self.pending_feats: Tensor | None = None  # [P, F]
        self.pending_ids: list[int] = []
        self.context = 0  # drafter cache slots holding committed pairs

    def _run(self, feats: Tensor, ids: Tensor, positions: Tensor | None, mask: Tensor | None,
             level: int) -> tuple[Tensor, Tensor]:
        logits, g = self._timed(self.runner.feature_step, feats[None], ids[None], self.cache, positions, mask, level)
        return logits[0], g[0]

    def start(self, prompt: Sequence[int], out: TargetOutput, first: int) -> None:
        self.pending_feats = features(self, out)
        self.pending_ids = list(prompt[1:]) + [first]

    def propose(self, root: int, policy: Policy, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        assert self.pending_feats is not None and self.pending_ids[-1] == root
        dev = self.pending_feats.device
        logits, g = self._run(self.pending_feats, torch.tensor(self.pending_ids, device=dev), None, None, 0)
        context = self.context = self.cache.length
        base = context - 1  # drafter position of the pair whose next token is the root

        def step(tokens: Tensor, parent: Tensor | None, level: int, mask: Tensor) -> tuple[Tensor, Tensor]:
            assert parent is not None
            return self._run(parent, tokens, torch.full(tokens.shape, base + level, device=dev), mask, level)

        return expand(policy, root, logits[-1], g[-1], step, context, params, generator, self.runner.token_map,
                      self.runner.vocab_size)

    def accept(self, proposal: Proposal, result: VerifyResult, out: TargetOutput) -> None:
        # Drop the draft slots; the accepted tokens are fed again with the target's own features.
        self.cache.crop(self.context)
        self.pending_feats = features(self, out, list(result.accepted))
        self.pending_ids = list(result.tokens)


class LMSession(DraftSession[TokenDrafter]):
    """An independent small LM (classic draft-model speculative decoding)."""

    def __init__(self, runner: TokenDrafter, capacity: int) -> None:
        super().__init__(runner, capacity)
        self.pending: list[int] = []
        self.context = 0

    def start(self, prompt: Sequence[int], out: TargetOutput, first: int) -> None:
        self.pending = list(prompt) + [first]

    def propose(self, root: int, policy: Policy, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        assert self.pending[-1] == root
        dev, lm_step = self.device, self.runner.lm_step
        logits = self._timed(lm_step, torch.tensor([self.pending], device=dev), self.cache, None, None, True)
        self.context = self.cache.length
        root_pos = self.context - 1

        def step(tokens: Tensor, parent: Tensor | None, level: int, mask: Tensor) -> tuple[Tensor, None]:
            positions = torch.full(tokens.shape, root_pos + level, device=dev)
            return self._timed(lm_step, tokens[None], self.cache, positions, mask)[0], None

        return expand(policy, root, logits[0, -1], None, step, self.context, params, generator, None,
                      self.runner.vocab_size)

    def accept(self, proposal: Proposal, result: VerifyResult, out: TargetOutput) -> None:
        path = list(result.accepted[1:])
        kept = [proposal.fed_slots[n] for n in path if n in proposal.fed_slots]
        # Fed nodes on the accepted path form a prefix of it (a fed node's ancestors were fed).
        self.cache.compact(self.context, kept)
        self.pending = list(result.tokens[len(kept):])


class BlockSession(DraftSession[BlockDrafter]):
    """DFlash: the committed context is injected as K/V; the block [root, MASK...] is drafted in one pass."""

    def __init__(self, runner: BlockDrafter, capacity: int) -> None:
        super().__init__(runner, capacity)
        self.pending_feats: Tensor | None = None

    def start(self, prompt: Sequence[int], out: TargetOutput, first: int) -> None:
        self.pending_feats = features(self, out)

    def propose(self, root: int, policy: Policy, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        assert isinstance(policy, BlockPolicy) and self.pending_feats is not None
        drafts = self._timed(self.runner.block_drafts, self.pending_feats[None], root, policy.block_size, self.cache)
        return Proposal(DraftTree.chain(len(drafts), [root] + drafts), None, {})

    def accept(self, proposal: Proposal, result: VerifyResult, out: TargetOutput) -> None:
        self.pending_feats = features(self, out, list(result.accepted))


SESSIONS: dict[str, type[DraftSession]] = {"feature": FeatureSession, "lm": LMSession, "block": BlockSession}


def make_session(runner: AnyDrafter, capacity: int) -> DraftSession:
    """The session of the drafter's kind (its family descriptor's `session`); the runner is of that kind's
    protocol (the backends build their runners by the same key)."""
    return SESSIONS[get_family(runner.family).session](runner, capacity)
