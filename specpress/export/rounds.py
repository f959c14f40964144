"""Validation on real drafting rounds: the exported drafter inside the speculative loop, against torch.

    validate_rounds(ref, target, export_dir) -> RoundsReport;  report.check(tolerance) raises

Prompts (`round_prompts`): the target's own greedy continuation of a few seed tokens spread over its
vocabulary. That is text this target writes, so a trained drafter accepts drafts and the rounds reach
what random inputs never do - cache crops and compaction after acceptance, features fed back level
after level, positions past the prompt - while it stays deterministic and needs no data or tokenizer.

They are decoded at temperature 0 under the family's default policy by two draft sessions in lockstep
over one torch target: one on the torch drafter, one on the onnxruntime runner of the export (loaded
exactly as `--backend onnxruntime` loads it). Per round:

- draft tokens: both sessions propose under the same root; the torch tree is verified and both sessions
  accept that result. Trees that differ are a near tie when some logits row the round computed has two
  of the ranks the policy reads closer than the export's error could flip (`near_tie`); otherwise a
  disagreement. Sessions whose trees differ cannot share a verification, so that prompt stops there.
- numbers: every graph call of the onnxruntime runner is recorded with its inputs, and the torch
  drafter's outputs for the same inputs (validate.reference) give max_abs / max_rel per output, the
  worst per graph kept - the random-input measure, on the inputs real rounds feed each graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from specpress.errors import RequestError
from specpress.export.families import graph_role
from specpress.export.validate import ExportValidationError, check, errors_of, reference, worst
from specpress.models.drafter import get_family
from specpress.runtime.backends.base import AnyDrafter, TargetRunner
from specpress.runtime.backends.onnxruntime.runner import load_runner
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.drafting import draft_slots, make_session
from specpress.runtime.loop import target_capacity
from specpress.runtime.policy import DynamicPolicy, Policy, TreePolicy, parse_policy
from specpress.runtime.sampling import SamplingParams
from specpress.runtime.tree import tree_for_policy
from specpress.runtime.verify import verify

PROMPTS, PROMPT_LEN, NEW_TOKENS, ROUNDS = 3, 8, 32, 4  # ROUNDS per prompt: 12 rounds, a second or so on tiny models
NEAR_TIE_REL = 1e-4  # a gap under this share of the row's largest |logit| is a tie whatever the error
MAX_DISAGREE = 0.01  # share of rounds whose drafts may differ without a near tie (the backend's >= 99 %)


@dataclass
class RoundsReport:
    policy: str
    prompts: int
    rounds: int  # rounds both sessions proposed
    agree: int  # ... with the same draft tree
    near_ties: int  # ... with different trees where a near tie explains it
    errors: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # graph -> output -> errors

    @property
    def disagree(self) -> int:
        return self.rounds - self.agree - self.near_ties

    def summary(self) -> dict[str, Any]:
        return {"policy": self.policy, "prompts": self.prompts, "rounds": self.rounds, "agree": self.agree,
                "near_ties": self.near_ties, "errors": self.errors}

    def check(self, tolerance: float) -> None:
        """ExportValidationError when an output is over `tolerance` or too many rounds draft differently."""
        stage = f"real drafting rounds ({self.rounds} rounds of {self.policy})"
        check(self.errors, tolerance, stage)
        if self.rounds == 0 or self.disagree > MAX_DISAGREE * self.rounds:
            raise ExportValidationError(
                f"onnxruntime drafts other tokens than the torch drafter on {stage}: {self.disagree} round(s) "
                f"differ without a near tie ({self.agree} agree, {self.near_ties} near ties; at most "
                f"{MAX_DISAGREE:.0%} may differ); nothing was written. This is a bug in the exporter for this "
                f"drafter: please report it with the drafter's config.json")


class _Log:
    def __init__(self) -> None:
        self.errors: dict[str, dict[str, dict[str, float]]] = {}
        self.logits: list[tuple[Tensor, float]] = []  # this round's torch logits, with their max_abs error
        self.last_fuse: tuple[Tensor, Tensor] | None = None  # (taps, features) of the latest fuse call


class _Recorded:
    """One graph call of the onnxruntime runner, followed by the torch reference on the same inputs."""

    def __init__(self, name: str, call: Any, ref: Any, log: _Log) -> None:
        self.name, self.call, self.ref, self.log = name, call, ref, log
        self.serves = graph_role(ref, name).call

    def __call__(self, feeds: Mapping[str, Tensor]) -> dict[str, Tensor]:
        inputs = {n: t.detach().cpu().clone() for n, t in feeds.items()}  # past K/V are views of a live cache
        out = self.call(feeds)
        taps = None
        if self.serves == "fuse":
            self.log.last_fuse = (inputs["taps"], out["features"].cpu())
        elif self.serves == "block" and inputs["features"].shape[1]:
            assert self.log.last_fuse is not None and torch.equal(self.log.last_fuse[1], inputs["features"]), \
                "the block pass reads the features of the latest fuse call"
            taps = self.log.last_fuse[0]
        want = reference(self.ref, self.name, inputs, taps=taps)
        errs = errors_of(out, want)
        worst(self.log.errors.setdefault(self.name, {}), errs)
        if "logits" in want:
            self.log.logits.append((want["logits"], errs["logits"]["max_abs"]))
        return out


def round_prompts(target: Any, n: int = PROMPTS, length: int = PROMPT_LEN) -> list[list[int]]:
    """n prompts of `length` tokens: seed ids spread over the vocabulary, continued greedily by the target
    (a TargetModel)."""
    from specpress.runtime.plain import decode_plain

    v = target.config.vocab_size
    seeds = [1 + (v - 2) * (i + 1) // (n + 1) for i in range(n)]
    runner = TorchTarget(target)
    return [[s] + decode_plain(runner, [s], length - 1, eos_ids=()).tokens[:length - 1] for s in seeds]


def ranks_read(policy: Policy) -> int:
    """How many of a logits row's top ranks the policy's draft choice depends on."""
    if isinstance(policy, DynamicPolicy):
        return policy.topk + 1
    if isinstance(policy, TreePolicy):
        tree = tree_for_policy(policy)
        assert tree is not None and tree.ranks is not None
        return max(tree.ranks) + 2
    return 2


def near_tie(logits: Sequence[tuple[Tensor, float]], policy: Policy) -> bool:
    """Whether a row of `logits` ([..., V] torch outputs with the max_abs error of their export) has two of
    its top ranks_read(policy) values within max(NEAR_TIE_REL x the row's largest |logit|, 2 x max_abs):
    an order that error can flip. Conservative where a choice is not one row's ranking: a dynamic tree's
    budget cut across rows by path score, and DFlash's Markov head (block logits + bias), count a flip
    without a near tie inside a row as a disagreement."""
    k = ranks_read(policy)
    for lg, max_abs in logits:
        rows = lg.detach().float().reshape(-1, lg.shape[-1])
        top = rows.topk(min(k, rows.shape[-1]), dim=-1).values
        tie = (NEAR_TIE_REL * rows.abs().amax(-1, keepdim=True)).clamp(min=2 * max_abs)
        if bool(((top[:, :-1] - top[:, 1:]) <= tie).any()):
            return True
    return False


def _same(a: Any, b: Any) -> bool:
    return a.tokens == b.tokens and a.parents == b.parents


@torch.inference_mode()
def lockstep(tgt: TargetRunner, first: AnyDrafter, second: AnyDrafter, prompt: Sequence[int], new_tokens: int,
             policy: Policy, judge: Callable[[bool], None], follow: bool = False,
             max_rounds: int | None = None) -> list[int]:
    """Decode `prompt` at temperature 0 with one draft session per drafter runner in lockstep: each
    round both propose under the same root, `judge(same_tree)` is told whether they drafted the same tree,
    the first tree is verified and both sessions accept its result. Trees that differ end the prompt, or
    with `follow` (feature and block sessions only: their accept re-feeds the committed tokens and keeps
    nothing of their own proposal) the second session follows the first's committed path. Stops after
    `new_tokens` tokens or `max_rounds` rounds. Returns the emitted tokens."""
    kind = get_family(first.family).session
    if follow and kind not in ("feature", "block"):
        raise RequestError(f"{kind} sessions keep their own fed draft slots after accept; they cannot follow "
                           f"another session's tree (follow=False)")
    params, dev = SamplingParams(), tgt.device
    capacity = target_capacity(tgt, len(prompt), new_tokens, policy)
    cache = tgt.new_cache(capacity)
    sessions = [make_session(r, capacity + draft_slots(policy)) for r in (first, second)]
    out = tgt.forward(torch.tensor([list(prompt)], device=dev), cache=cache, taps=sessions[0].taps)
    assert out.logits is not None
    tokens = [int(out.logits[0, -1].argmax())]
    for s in sessions:
        s.start(prompt, out, tokens[0])
    rounds = 0
    while len(tokens) < new_tokens and (max_rounds is None or rounds < max_rounds):
        rounds += 1
        ours, theirs = (s.propose(tokens[-1], policy, params, None) for s in sessions)
        same = _same(ours.tree, theirs.tree)
        judge(same)
        if not same and not follow:
            break
        tree, past = ours.tree, cache.length
        vout = tgt.forward(tree.token_tensor(dev)[None], cache=cache, positions=tree.positions(past, dev),
                           mask=tree.verify_mask(past, dev), taps=sessions[0].taps)
        assert vout.logits is not None
        result = verify(tree, vout.logits[0], params, None, ours.draft_probs)
        cache.compact(past, result.accepted)
        sessions[0].accept(ours, result, vout)
        sessions[1].accept(ours if not same else theirs, result, vout)
        tokens.extend(result.tokens)
    return tokens


def validate_rounds(ref: Any, target: Any, export_dir: str | Path, *, policy: str | Policy | None = None,
                    prompts: Sequence[Sequence[int]] | None = None, new_tokens: int = NEW_TOKENS,
                    rounds: int = ROUNDS) -> RoundsReport:
    """Real drafting rounds of the export at `export_dir` against `ref` (the torch drafter in the export's
    float type, attached to `target`): up to `rounds` rounds of `new_tokens` per prompt; see the module
    docstring. Errors are reported, not raised."""
    name = str(policy or get_family(ref.family).default_policy)
    pol = parse_policy(policy or name)
    runner = load_runner(export_dir, target, "cpu", warn=lambda s: None)
    log = _Log()
    runner.calls = {n: _Recorded(n, c, ref, log) for n, c in runner.calls.items()}
    prompts = round_prompts(target) if prompts is None else prompts
    counts = {"rounds": 0, "agree": 0, "ties": 0}

    def judge(same: bool) -> None:
        counts["rounds"] += 1
        if same:
            counts["agree"] += 1
        elif near_tie(log.logits, pol):
            counts["ties"] += 1
        log.logits.clear()

    for prompt in prompts:
        log.logits.clear()
        lockstep(TorchTarget(target), drafter_runner(ref), runner, prompt, new_tokens, pol, judge, max_rounds=rounds)
    return RoundsReport(name, len(prompts), counts["rounds"], counts["agree"], counts["ties"], log.errors)
