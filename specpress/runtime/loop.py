"""The speculative loop: prefill, then rounds of draft -> one target verify forward -> accept.

    prefill(target, prompt)                    # the first token comes from the prefill logits
    while budget and no EOS:
        proposal = session.propose(root)       # a draft tree under the last committed token
        out = verify_forward(target, tree)     # one target forward over every tree node
        result = verify(tree, out.logits)      # lossless accept rule (greedy or rejection sampling)
        target_cache.compact(past, accepted)   # keep exactly the accepted path
        session.accept(proposal, result, out)  # the drafter keeps its side consistent

Every round emits len(accepted) tokens: the accepted drafts plus the target's own next token.
The loop sees a `TargetRunner` and a drafter runner (runtime/backends/base.py), nothing of torch modules
and no backend: wrap modules with `runtime.backends.torch.runner` (`TorchTarget`, `drafter_runner`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from specpress.device import wall_ms
from specpress.runtime.backends.base import AnyDrafter, TargetRunner
from specpress.runtime.drafting import DraftSession, check_policy, draft_slots, make_session
from specpress.runtime.plain import check_fits
from specpress.runtime.policy import Policy
from specpress.runtime.sampling import SamplingParams, sample
from specpress.runtime.verify import verify


@dataclass
class RoundStats:
    accepted: int  # accepted draft tokens (bonus/correction token excluded)
    drafted: int  # draft tokens in the tree (root excluded)
    draft_ms: float  # proposing the tree: drafter forwards plus tree building
    verify_ms: float  # the target's verify forward
    other_ms: float  # accept rule, cache compaction, the drafter's bookkeeping
    draft_forward_ms: float = 0.0  # the drafter's own compute within the round (forwards, tap fusion)

    @property
    def overhead_ms(self) -> float:
        """The loop's own time: everything outside the drafter's and the target's forwards."""
        return self.draft_ms + self.other_ms - self.draft_forward_ms


@dataclass
class SpecGeneration:
    tokens: list[int]
    prefill_ms: float = 0.0
    rounds: list[RoundStats] = field(default_factory=list)
    total_ms: float = 0.0


def target_capacity(target: TargetRunner, prompt_len: int, max_new_tokens: int, policy: Policy,
                    label: str = "prompt") -> int:
    """Target cache slots a speculative decode of `prompt_len` + `max_new_tokens` needs: the last round may
    verify a whole tree (num_draft_tokens + the root) past the budget. A clear error when it does not fit."""
    return check_fits(target, prompt_len, max_new_tokens, label, slack=policy.num_draft_tokens + 2)


@torch.inference_mode()
def speculative_generate(target: TargetRunner, drafter: AnyDrafter, prompt: Sequence[int], max_new_tokens: int,
                         policy: Policy, params: SamplingParams = SamplingParams(),
                         generator: torch.Generator | None = None, eos_ids: Sequence[int] | None = None) -> SpecGeneration:
    """Decode with `drafter` proposing and `target` verifying; the output distribution is the target's."""
    check_policy(drafter.family, policy)
    eos = set(target.config.eos_ids if eos_ids is None else eos_ids)
    capacity = target_capacity(target, len(prompt), max_new_tokens, policy)
    cache = target.new_cache(capacity)
    session: DraftSession = make_session(drafter, capacity + draft_slots(policy))
    dev = target.device
    t_start = wall_ms(dev)
    out = target.forward(torch.tensor([list(prompt)], device=dev), cache=cache, taps=session.taps)
    tok = int(sample(out.logits[0, -1], params, generator))
    session.start(prompt, out, tok)
    gen = SpecGeneration([tok], prefill_ms=wall_ms(dev) - t_start)
    while len(gen.tokens) < max_new_tokens and gen.tokens[-1] not in eos:
        t0, f0 = wall_ms(dev), session.forward_ms
        proposal = session.propose(gen.tokens[-1], policy, params, generator)
        tree = proposal.tree
        t1 = wall_ms(dev)
        past = cache.length
        vout = target.forward(tree.token_tensor(dev)[None], cache=cache, positions=tree.positions(past, dev),
                              mask=tree.verify_mask(past, dev), taps=session.taps)
        t2 = wall_ms(dev)
        result = verify(tree, vout.logits[0], params, generator, proposal.draft_probs)
        cache.compact(past, result.accepted)
        session.accept(proposal, result, vout)
        for t in result.tokens:
            gen.tokens.append(t)
            if t in eos or len(gen.tokens) >= max_new_tokens:
                break
        t3 = wall_ms(dev)
        gen.rounds.append(RoundStats(result.num_accepted, tree.size - 1, t1 - t0, t2 - t1, t3 - t2,
                                     session.forward_ms - f0))
    gen.total_ms = wall_ms(dev) - t_start
    return gen
