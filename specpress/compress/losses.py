"""The distillation losses, one per loss kind a family descriptor names ("chain", "block", "lm").

Every loss is `loss_fn(ctx: LossContext) -> LossOut`: the student runs its family's teacher-forced forward
(models/forced.py: exactly the forward the runtime runs at inference, same module call, same inputs, explicit
positions and masks), batched over every position of a window at once. Teacher signals come from the target (TeacherBatch) and, optionally, from
a larger drafter of the same family (`--from`), whose output distribution is matched by an extra KL term.

Alignment on a window x [B, T] (target: final normed hidden f [B, T, H], logits z [B, T, V] where z_j
predicts x_{j+1}, taps = HF hidden_states):

  eagle / eagle3 / mtp, unrolled for K steps over n = T - K - 1 positions j (training-time test):
    step 0 at index j:  hidden_in = f_j (eagle, mtp) | fuse_taps_j (eagle3), input id x_{j+1},
                        position j, predicts x_{j+2} ~ softmax(z_{j+1});
    step i at index j:  hidden_in = the drafter's own output g of step i-1 at j, input id x_{j+1+i},
                        position j + i, predicts x_{j+2+i} ~ softmax(z_{j+1+i}); eagle also regresses
                        g_i -> f_{j+1+i}.
    Attention (what a chained draft sees at inference, through its KV cache): step i at j sees the
    step-0 entries at j' <= j (the accepted context) and its own chain (steps 1..i at j). For MTP with
    several modules, step i uses module i % n_modules and sees only that module's entries: its first
    use causally, later uses on the diagonal (one module chained = the same rule as EAGLE-3).
    Step weights: eagle / eagle3 0.8^i (EAGLE-3); mtp 1/K (DeepSeek's mean over depths).
  dflash, one batched pass over [context ; N blocks]: anchors a in [1, T-B], block ids
    [x_a, MASK x (B-1)] at positions a..a+B-1; a block query sees context features f_{<a} (fused taps)
    and its own block (bidirectionally), nothing else; block position k >= 1 predicts x_{a+k}
    ~ softmax(z_{a+k-1}), weighted by exp(-(k-1)/gamma).
  lm: the student LM over x_{0..T-1}; position j predicts x_{j+1} ~ softmax(z_j) (forward KL).

Distribution losses are soft cross-entropies -sum p log q against the target's distribution (same
gradient as KL(p || q)); `labels="data"` (mtp, dflash) uses the data's next token instead. The lm loss
is reported as KL(p || q) itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from specpress.errors import RequestError
from specpress.models.drafter import Drafter, get_family
from specpress.models.forced import Forced, input_features

if TYPE_CHECKING:
    from specpress.compress.config import DistillConfig


# ----------------------------------------------------------------------------------------------
# Inputs and outputs
# ----------------------------------------------------------------------------------------------


@dataclass
class TeacherBatch:
    """The target's signals on one batch of windows (computed under no_grad). The logits are in the target's
    dtype (bf16 under the default --target-dtype): a loss converts what it reads to fp32. For a drafter with a
    reduced draft vocabulary they may hold only those columns (`vocab`: their target ids, ascending) with the
    full-vocabulary argmax beside them (`top1`): the [B, T, V] logits are then never made (teacher.py)."""

    ids: Tensor  # [B, T] token windows
    logits: Tensor  # [B, T, V] target logits (z_j predicts ids[:, j+1]); [B, T, len(vocab)] with `vocab`
    hidden: Tensor  # [B, T, H] target final normed hidden
    taps: dict[int, Tensor]  # HF hidden_states index -> [B, T, H]
    top1: Tensor | None = None  # [B, T] the target's argmax over its whole vocabulary (given with `vocab`)
    vocab: Tensor | None = None  # [Vk] ascending target ids of the columns `logits` holds (None: all of them)

    def ref_ids(self) -> Tensor:
        """[B, T] the target's argmax over its whole vocabulary."""
        return self.top1 if self.top1 is not None else top1(self.logits)

    def columns(self, ids: Tensor) -> Tensor:
        """[B, T, len(ids)] the logits of target ids `ids` (in the target's dtype); with a restricted batch,
        `ids` must be among its `vocab` (a pruned draft vocabulary is a subset of the one it was cut from)."""
        if self.vocab is None:
            return self.logits[..., ids]
        pos = torch.searchsorted(self.vocab, ids).clamp(max=self.vocab.numel() - 1)
        if not torch.equal(self.vocab[pos], ids):
            raise RequestError("the teacher's logits were kept for another draft vocabulary than this drafter's; "
                             "compute them for its vocabulary (target_signals(..., vocab=...))")
        return self.logits[..., pos]


@dataclass
class LossContext:
    student: Drafter
    batch: TeacherBatch
    config: "DistillConfig"
    generator: torch.Generator  # per-step randomness (EAGLE feature noise, DFlash anchors)
    teacher: Drafter | None = None  # a larger drafter of the same family (--from)
    train: bool = True  # False: no feature noise (evaluation)
    shard: tuple[int, int] | None = None  # (first row, global batch) when this process holds a slice (DDP)

    def rows(self) -> tuple[int, int, int]:
        """(first row, last row + 1, global batch): random draws are made for the global batch, then sliced,
        so a sharded run draws exactly what a single process would."""
        b = self.batch.ids.shape[0]
        start, total = self.shard or (0, b)
        return start, start + b, total


@dataclass
class LossOut:
    loss: Tensor  # scalar, differentiable w.r.t. the student
    hits: Tensor  # [K] top-1 agreements with the target's argmax per draft position (float counts)
    counts: Tensor  # [K] positions scored per draft position
    parts: dict[str, float] = field(default_factory=dict)


def soft_ce(logits: Tensor, probs: Tensor) -> Tensor:
    """-sum_v p log q per position: logits / probs [..., V] -> [...]."""
    return -(probs * F.log_softmax(logits.float(), dim=-1)).sum(-1)


class _SoftCE(torch.autograd.Function):
    """-sum_v softmax(target)_v log softmax(logits)_v per position, computed in fp32, keeping for backward
    only its two inputs (the student's logits in their dtype, and the teacher's, which the batch holds
    anyway); the gradient softmax(logits) - softmax(target) is recomputed there. Autograd through soft_ce
    keeps the fp32 softmax and log-softmax of every unrolled step instead: ~20 bytes a logit, 2.3 GB for an
    EAGLE-3 drafter's 3 steps over [8, 124, 32000] (plan's measured figure), against 2 here."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target_logits: Tensor) -> Tensor:
        ctx.save_for_backward(logits, target_logits)
        p = F.softmax(target_logits.float(), dim=-1)
        return -(p * F.log_softmax(logits.float(), dim=-1)).sum(-1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        logits, target_logits = ctx.saved_tensors
        d = F.softmax(logits.float(), dim=-1) - F.softmax(target_logits.float(), dim=-1)  # (sum_v p_v = 1)
        return (d * grad.float()[..., None]).to(logits.dtype), None


def soft_ce_logits(logits: Tensor, target_logits: Tensor) -> Tensor:
    """soft_ce(logits, softmax(target_logits)) with a fraction of its memory ([..., V] -> [...]): _SoftCE."""
    return _SoftCE.apply(logits, target_logits.detach())


def kl(teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
    """KL(p_teacher || q_student) per position, [..., V] -> [...]; -inf teacher logits have p = 0."""
    logp = F.log_softmax(teacher_logits.float(), dim=-1)
    logq = F.log_softmax(student_logits.float(), dim=-1)
    p = logp.exp()
    return (p * (logp.masked_fill(p == 0, 0.0) - logq)).sum(-1)


def top1(logits: Tensor) -> Tensor:
    """The argmax over the last dim (the first index among ties, as argmax returns). Read through `max`:
    on CPU, argmax over vocabulary-sized rows is slower (896 x 4096: 5.1 vs 3.9 ms in float32, 9.8 vs
    2.4 ms in bf16), and distill takes them on every step."""
    return logits.max(dim=-1).indices


def top1_hits(pred: Tensor, ref: Tensor) -> Tensor:
    """Count of equal ids, as a float scalar."""
    return (pred == ref).sum().float()


# ----------------------------------------------------------------------------------------------
# Chained families: eagle (EAGLE-1), eagle3 (EAGLE-3 training-time test), mtp
# ----------------------------------------------------------------------------------------------


def chain_steps(ctx: LossContext) -> int:
    return ctx.config.resolved_ttt_steps(ctx.student)


def _chain_inputs(ctx: LossContext, drafter: Drafter, n: int, noise: bool) -> Tensor:
    """Step-0 features [B, n, F]; with feature noise U(-a, a) on the target's hidden for drafters that
    regress it (EAGLE-1's recipe), when training."""
    b = ctx.batch
    h = input_features(drafter, b.hidden, b.taps)[:, :n]
    if noise and ctx.train and get_family(drafter.family).distill.feature_regression and ctx.config.feature_noise > 0:
        a = ctx.config.feature_noise
        lo, hi, total = ctx.rows()
        u = torch.rand((total, *h.shape[1:]), generator=ctx.generator)[lo:hi].to(h.device, h.dtype)
        h = h + (2 * u - 1) * a  # U(-a, a)
    return h


def _draft_vocab(d: Drafter) -> Tensor:
    """A reduced draft vocabulary's target ids [Vd] (ascending)."""
    return d.to_target_ids(torch.arange(d.config.draft_vocab_size, device=d.d2t.device))  # type: ignore[attr-defined]


def chain_loss(ctx: LossContext) -> LossOut:
    """eagle, eagle3, mtp: K unrolled steps; per step a family loss; total = sum_i w_i · loss_i."""
    s, b, cfg = ctx.student, ctx.batch, ctx.config
    fam = get_family(s.family)
    k = chain_steps(ctx)
    t = b.ids.shape[1]
    n = t - k - 1
    if n < 1:
        raise RequestError(f"seq_len {t} is too short for {k} unrolled draft steps; use --seq-len >= {k + 2}")
    outs = fam.teacher_forced(s, b.ids, _chain_inputs(ctx, s, n, noise=True), steps=k, span=n).steps
    t_outs = None
    if ctx.teacher is not None:
        with torch.no_grad():
            t_outs = fam.teacher_forced(ctx.teacher, b.ids, _chain_inputs(ctx, ctx.teacher, n, noise=False),
                                        steps=k, span=n).steps
    reduced = fam.draft_vocab == "reduced"
    vocab = _draft_vocab(s) if reduced else None
    draft_z = b.columns(vocab) if vocab is not None else None  # [B, T, Vd]: the draft vocabulary's columns only
    refs = b.ref_ids()  # [B, T] the target's argmax over its whole vocabulary
    feature_loss = fam.distill.feature_regression
    total = b.hidden.new_zeros((), dtype=torch.float32)
    hits, counts = torch.zeros(k), torch.zeros(k)
    parts: dict[str, float] = {}
    for i, (logits, g) in enumerate(outs):
        ref = refs[:, 1 + i:1 + i + n]  # the target's top-1 of the token this step drafts
        w = cfg.step_decay ** i if fam.distill.step_weights == "decay" else 1.0 / k
        if draft_z is not None:
            assert vocab is not None
            # the draft vocabulary's logits, taken before any softmax: restricted, renormalized, fp32
            inside = s.t2d[ref]  # type: ignore[index]
            step_loss = (soft_ce_logits(logits, draft_z[:, 1 + i:1 + i + n]) * inside).mean()
            pred = vocab[top1(logits)]
        elif feature_loss:
            assert g is not None
            feat = F.smooth_l1_loss(g.float(), b.hidden[:, 1 + i:1 + i + n].float())
            ce = soft_ce_logits(logits, b.logits[:, 1 + i:1 + i + n]).mean()  # the drafted token's distribution
            step_loss = cfg.feature_weight * feat + cfg.ce_weight * ce
            parts[f"feature{i}"] = float(feat.detach())
            pred = top1(logits)
        else:
            if cfg.labels == "data":
                step_loss = F.cross_entropy(logits.float().flatten(0, 1), b.ids[:, 2 + i:2 + i + n].flatten())
            else:
                step_loss = soft_ce_logits(logits, b.logits[:, 1 + i:1 + i + n]).mean()
            pred = top1(logits)
        if t_outs is not None:
            tl = t_outs[i][0]
            if vocab is not None:
                tl = ctx.teacher.full_vocab_logits(tl)[..., vocab]  # type: ignore[union-attr, operator]
            step_loss = step_loss + cfg.teacher_weight * kl(tl, logits).mean()
        total = total + w * step_loss
        parts[f"step{i}"] = float(step_loss.detach())
        hits[i] = float(top1_hits(pred, ref))
        counts[i] = float(ref.numel())
    return LossOut(total, hits, counts, parts)


# ----------------------------------------------------------------------------------------------
# DFlash: many anchors per window in one pass with a block-structured mask
# ----------------------------------------------------------------------------------------------

GAMMA_TABLE = ((8, 4.0), (10, 5.0), (16, 7.0))  # DFlash: block size -> loss decay gamma


def dflash_gamma(block_size: int) -> float:
    """gamma = 7 / 5 / 4 for B = 16 / 10 / 8, piecewise linear between, extended linearly (>= 1) outside."""
    pts = GAMMA_TABLE
    if block_size <= pts[0][0]:
        (b0, g0), (b1, g1) = pts[0], pts[1]
    elif block_size >= pts[-1][0]:
        (b0, g0), (b1, g1) = pts[-2], pts[-1]
    else:
        i = next(i for i in range(1, len(pts)) if block_size <= pts[i][0])
        (b0, g0), (b1, g1) = pts[i - 1], pts[i]
    return max(1.0, g0 + (g1 - g0) * (block_size - b0) / (b1 - b0))


def dflash_anchors(batch: int, t: int, block: int, n: int, generator: torch.Generator) -> Tensor:
    """[B, N] distinct sorted anchors per window in [1, T - block] (every label inside the window)."""
    hi = t - block
    if hi < 1:
        raise RequestError(f"seq_len {t} is too short for DFlash blocks of {block}; use --seq-len >= {block + 2}")
    n = min(n, hi)
    rows = [torch.randperm(hi, generator=generator)[:n].sort().values + 1 for _ in range(batch)]
    return torch.stack(rows)


def _forced(d: Drafter, b: TeacherBatch, anchors: Tensor | None = None) -> Forced:
    """The family's teacher-forced pass of `d` on the batch (block anchors when given)."""
    return get_family(d.family).teacher_forced(d, b.ids, input_features(d, b.hidden, b.taps), anchors=anchors)


def dflash_loss(ctx: LossContext) -> LossOut:
    s, b, cfg = ctx.student, ctx.batch, ctx.config
    bk = s.config.block_size
    bsz, t = b.ids.shape
    lo, hi, total = ctx.rows()
    anchors = dflash_anchors(total, t, bk, cfg.anchors, ctx.generator)[lo:hi].to(b.ids.device)
    forced = _forced(s, b, anchors)
    assert forced.features is not None
    logits = s.head(forced.features[:, :, 1:])  # [B, N, Bk-1, V]: the anchor's slot drafts nothing
    # block position k (1..Bk-1) drafts token a+k, whose target distribution is z_{a+k-1}
    src = (anchors[..., None] + torch.arange(bk - 1, device=anchors.device))  # [B, N, Bk-1] = a+k-1
    # rows by indexing, not gather with a vocabulary-wide index: [8, 112] rows of 4096 here, 0.8 vs 2.1 ms on CPU
    rows = torch.arange(bsz, device=src.device)[:, None]
    z = b.logits[rows, src.flatten(1)].view(bsz, -1, bk - 1, b.logits.shape[-1])  # in the target's dtype
    # a Markov head sees the true token before each position (teacher forcing): ids[a+k-1]
    prev = b.ids.gather(1, src.flatten(1)).view_as(src)
    q = s.with_markov(logits, prev)
    if cfg.labels == "data":
        lab = b.ids.gather(1, (src + 1).flatten(1)).view_as(src)
        per = F.cross_entropy(q.float().flatten(0, 2), lab.flatten(), reduction="none").view_as(src)
    else:
        per = soft_ce_logits(q, z)
    # the family's options (dflash's DFlashOptions); a family without them trains with CE only and DFlash's gamma
    tv_weight, gamma = getattr(cfg.options, "tv_weight", 0.0), getattr(cfg.options, "gamma", None)
    if tv_weight:  # DSpark's loss: CE mixed with the L1 distance of the distributions (2 x total variation)
        tv = (F.softmax(q.float(), dim=-1) - F.softmax(z.float(), dim=-1)).abs().sum(-1)
        per = (1 - tv_weight) * per + tv_weight * tv
    gamma = gamma if gamma is not None else dflash_gamma(bk)
    w = torch.exp(-torch.arange(bk - 1, dtype=torch.float32, device=q.device) / gamma)  # k = 1.. -> e^{-(k-1)/g}
    loss = (per * w).sum(-1).mean() / w.sum()
    if ctx.teacher is not None:
        _, blocks, pos, mask = forced.inputs  # the teacher drafts the student's blocks
        with torch.no_grad():
            tl = ctx.teacher(input_features(ctx.teacher, b.hidden, b.taps), blocks, positions=pos, mask=mask)
        tl = ctx.teacher.with_markov(tl.view(bsz, -1, bk, tl.shape[-1])[:, :, 1:], prev)
        loss = loss + cfg.teacher_weight * (kl(tl, q) * w).sum(-1).mean() / w.sum()
    ref = top1(z)
    hit = (top1(q) == ref).float().sum(dim=(0, 1)).cpu()
    cnt = torch.full((bk - 1,), float(ref.shape[0] * ref.shape[1]))
    return LossOut(loss, hit, cnt, {"gamma": gamma})


# ----------------------------------------------------------------------------------------------
# lm: an independent small LM, forward KL to the target
# ----------------------------------------------------------------------------------------------


def lm_loss(ctx: LossContext) -> LossOut:
    s, b, cfg = ctx.student, ctx.batch, ctx.config
    q = _forced(s, b).draft_logits(s)  # [B, T, V]
    z = b.logits.float()
    loss = kl(z, q).mean()
    if ctx.teacher is not None:
        with torch.no_grad():
            tl = _forced(ctx.teacher, b).draft_logits(ctx.teacher)
        loss = loss + cfg.teacher_weight * kl(tl, q).mean()
    ref = top1(z)
    return LossOut(loss, top1_hits(top1(q), ref)[None].cpu(), torch.tensor([float(ref.numel())]))


# The loss kinds a family descriptor names (models/family.py LOSSES), with their functions.
LOSSES: dict[str, Callable[[LossContext], LossOut]] = {"chain": chain_loss, "block": dflash_loss, "lm": lm_loss}


def get_loss(family: str) -> Callable[[LossContext], LossOut]:
    """The distillation loss of drafter family `family` (its descriptor's `loss`)."""
    return LOSSES[get_family(family).loss]


def positions_scored(config: "DistillConfig", drafter: Drafter) -> int:
    """How many draft positions the family loss reports agreement for (acc@1..K)."""
    kind = get_family(drafter.family).loss
    if kind == "block":
        return drafter.config.block_size - 1
    if kind == "lm":
        return 1
    return config.resolved_ttt_steps(drafter)


__all__ = ["TeacherBatch", "LossContext", "LossOut", "chain_loss", "dflash_loss", "lm_loss", "dflash_gamma",
           "soft_ce_logits",
           "dflash_anchors", "get_loss", "LOSSES", "soft_ce", "kl", "positions_scored"]
