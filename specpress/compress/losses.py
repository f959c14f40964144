"""One distillation loss per drafter family, each running the drafter's own inference forward.

Every loss is `loss_fn(ctx: LossContext) -> LossOut`: the student runs exactly the forward the runtime
runs at inference (same module call, same inputs, explicit positions and masks), batched over every
position of a window at once. Teacher signals come from the target (TeacherBatch) and, optionally, from
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
from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from specpress.errors import UsageError
from specpress.models.drafter import Drafter
from specpress.models.kv import KVCache

if TYPE_CHECKING:
    from specpress.compress.distill import DistillConfig


# ----------------------------------------------------------------------------------------------
# Inputs and outputs
# ----------------------------------------------------------------------------------------------


@dataclass
class TeacherBatch:
    """The target's signals on one batch of windows (computed under no_grad)."""

    ids: Tensor  # [B, T] token windows
    logits: Tensor  # [B, T, V] target logits (z_j predicts ids[:, j+1])
    hidden: Tensor  # [B, T, H] target final normed hidden
    taps: dict[int, Tensor]  # HF hidden_states index -> [B, T, H]


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
# Training-time test: an autograd-friendly cache and the chained-draft mask
# ----------------------------------------------------------------------------------------------


class TrainKV(KVCache):
    """A KVCache that grows by concatenation, so gradients flow through cached K/V of earlier steps.

    Same interface as KVCache for the drafter forwards (reserve / write / length); a layer that was
    not written during a call gets zero slots there (the unrolled mask never lets a query see them).
    """

    def __init__(self) -> None:  # noqa: D107 (no preallocation)
        self.length = 0
        self._k: dict[int, Tensor] = {}
        self._v: dict[int, Tensor] = {}

    @property
    def capacity(self) -> int:
        return 1 << 30

    def reserve(self, t: int) -> int:
        return self.length

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k/v [B, Hkv, T, D] appended at slots [length, length+T); returns slots [0, length+T)."""
        out = []
        for store, new in ((self._k, k), (self._v, v)):
            old = store.get(layer)
            have = 0 if old is None else old.shape[2]
            parts = [] if old is None else [old]
            if have < self.length:
                parts.append(new.new_zeros(*new.shape[:2], self.length - have, new.shape[3]))
            parts.append(new)
            store[layer] = torch.cat(parts, dim=2)
            out.append(store[layer])
        return out[0], out[1]

    def crop(self, length: int) -> None:
        raise NotImplementedError("TrainKV only grows (training-time test)")

    def compact(self, base: int, keep: Sequence[int]) -> None:
        raise NotImplementedError("TrainKV only grows (training-time test)")


def unrolled_mask(n: int, step: int, modules: Sequence[int], device: torch.device | str = "cpu") -> Tensor:
    """Bool [n, (step+1)·n]: what step `step` at index j sees among the slots of steps 0..step.

    modules[s] = the module (cache layer group) step s runs; a query sees only its own module's slots:
    the module's first step causally (j' <= j, the accepted context), its later steps on the diagonal
    (the query's own draft chain). One module for all steps = EAGLE-3's training-time test.
    """
    m = modules[step]
    first = modules.index(m)
    tril = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    eye = torch.eye(n, dtype=torch.bool, device=device)
    zero = torch.zeros(n, n, dtype=torch.bool, device=device)
    blocks = [zero if modules[s] != m else (tril if s == first else eye) for s in range(step + 1)]
    return torch.cat(blocks, dim=1)


def unroll(drafter: Drafter, first_in: Tensor, ids: Tensor, steps: int, n: int) -> list[tuple[Tensor, Tensor]]:
    """Run `steps` chained draft steps over indices 0..n-1 (see the module docstring for alignment).

    first_in [B, n, *]: step-0 hidden inputs; ids [B, T] with T >= n + steps + 1.
    Returns [(logits [B, n, V or Vd], g [B, n, H])] per step.
    """
    fam = drafter.family
    n_mod = drafter.config.num_nextn_predict_layers if fam == "mtp" else 1
    modules = [s % n_mod for s in range(steps)]
    cache = TrainKV()
    h, outs = first_in, []
    base = torch.arange(n, device=ids.device)
    for i in range(steps):
        kw = {"step": i} if fam == "mtp" else {}
        logits, g = drafter(h, ids[:, 1 + i:1 + i + n], cache=cache, positions=base + i,
                            mask=unrolled_mask(n, i, modules, ids.device), **kw)
        outs.append((logits, g))
        h = g
    return outs


# ----------------------------------------------------------------------------------------------
# Chained families: eagle (EAGLE-1), eagle3 (EAGLE-3 training-time test), mtp
# ----------------------------------------------------------------------------------------------


def chain_steps(ctx: LossContext) -> int:
    return ctx.config.resolved_ttt_steps(ctx.student)


def _chain_inputs(ctx: LossContext, drafter: Drafter, n: int, noise: bool) -> Tensor:
    b = ctx.batch
    if drafter.family == "eagle3":
        return drafter.fuse_taps(b.taps)[:, :n]
    h = b.hidden[:, :n]
    if noise and ctx.train and drafter.family == "eagle" and ctx.config.feature_noise > 0:
        a = ctx.config.feature_noise
        lo, hi, total = ctx.rows()
        u = torch.rand((total, *h.shape[1:]), generator=ctx.generator)[lo:hi].to(h.device, h.dtype)
        h = h + (2 * u - 1) * a  # U(-a, a)
    return h


def _draft_vocab(d: Drafter) -> Tensor:
    """eagle3: target ids of the draft vocabulary [Vd] (ascending)."""
    return d.to_target_ids(torch.arange(d.config.draft_vocab_size, device=d.d2t.device))  # type: ignore[attr-defined]


def chain_loss(ctx: LossContext) -> LossOut:
    """eagle, eagle3, mtp: K unrolled steps; per step a family loss; total = sum_i w_i · loss_i."""
    s, b, cfg = ctx.student, ctx.batch, ctx.config
    k = chain_steps(ctx)
    t = b.ids.shape[1]
    n = t - k - 1
    if n < 1:
        raise UsageError(f"seq_len {t} is too short for {k} unrolled draft steps; use --seq-len >= {k + 2}")
    outs = unroll(s, _chain_inputs(ctx, s, n, noise=True), b.ids, k, n)
    t_outs = None
    if ctx.teacher is not None:
        with torch.no_grad():
            t_outs = unroll(ctx.teacher, _chain_inputs(ctx, ctx.teacher, n, noise=False), b.ids, k, n)
    vocab = _draft_vocab(s) if s.family == "eagle3" else None
    total = b.logits.new_zeros(())
    hits, counts = torch.zeros(k), torch.zeros(k)
    parts: dict[str, float] = {}
    for i, (logits, g) in enumerate(outs):
        z = b.logits[:, 1 + i:1 + i + n].float()  # target distribution of the token this step drafts
        ref = top1(z)
        w = cfg.step_decay ** i if s.family != "mtp" else 1.0 / k
        if s.family == "eagle3":
            assert vocab is not None
            p = F.softmax(z[..., vocab], dim=-1)  # restricted to the draft vocab, renormalized
            inside = s.t2d[ref]  # type: ignore[index]
            step_loss = (soft_ce(logits, p) * inside).mean()
            pred = vocab[top1(logits)]
        elif s.family == "eagle":
            feat = F.smooth_l1_loss(g.float(), b.hidden[:, 1 + i:1 + i + n].float())
            ce = soft_ce(logits, F.softmax(z, dim=-1)).mean()
            step_loss = cfg.feature_weight * feat + cfg.ce_weight * ce
            parts[f"feature{i}"] = float(feat.detach())
            pred = top1(logits)
        else:  # mtp
            if cfg.labels == "data":
                step_loss = F.cross_entropy(logits.float().flatten(0, 1), b.ids[:, 2 + i:2 + i + n].flatten())
            else:
                step_loss = soft_ce(logits, F.softmax(z, dim=-1)).mean()
            pred = top1(logits)
        if t_outs is not None:
            tl = t_outs[i][0]
            if s.family == "eagle3":
                assert vocab is not None
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
        raise UsageError(f"seq_len {t} is too short for DFlash blocks of {block}; use --seq-len >= {block + 2}")
    n = min(n, hi)
    rows = [torch.randperm(hi, generator=generator)[:n].sort().values + 1 for _ in range(batch)]
    return torch.stack(rows)


def dflash_inputs(d: Drafter, ids: Tensor, anchors: Tensor, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """(block ids [B, N·Bk], positions [B, T + N·Bk], mask bool [B, N·Bk, T + N·Bk]) for `features`."""
    b, t = ids.shape
    n = anchors.shape[1]
    dev = ids.device
    blocks = d.make_block(ids.gather(1, anchors).flatten(), block).view(b, n * block)  # type: ignore[operator]
    offs = torch.arange(block, device=dev)
    bpos = (anchors[..., None] + offs).view(b, n * block)
    pos = torch.cat([torch.arange(t, device=dev).expand(b, t), bpos], dim=1)
    qa = anchors.repeat_interleave(block, dim=1)  # [B, N·Bk] anchor of each query
    ctx_ok = torch.arange(t, device=dev)[None, None, :] < qa[..., None]  # context strictly before the anchor
    qb = torch.arange(n, device=dev).repeat_interleave(block)
    own = (qb[:, None] == qb[None, :]).expand(b, -1, -1)  # bidirectional within its own block
    return blocks, pos, torch.cat([ctx_ok, own], dim=2)


def dflash_loss(ctx: LossContext) -> LossOut:
    s, b, cfg = ctx.student, ctx.batch, ctx.config
    bk = s.config.block_size
    bsz, t = b.ids.shape
    lo, hi, total = ctx.rows()
    anchors = dflash_anchors(total, t, bk, cfg.anchors, ctx.generator)[lo:hi].to(b.ids.device)
    blocks, pos, mask = dflash_inputs(s, b.ids, anchors, bk)
    feats = s.features(s.fuse_taps(b.taps), blocks, positions=pos, mask=mask).view(bsz, -1, bk, s.config.hidden_size)
    logits = s.head(feats[:, :, 1:])  # [B, N, Bk-1, V]: the anchor's slot drafts nothing
    # block position k (1..Bk-1) drafts token a+k, whose target distribution is z_{a+k-1}
    src = (anchors[..., None] + torch.arange(bk - 1, device=anchors.device))  # [B, N, Bk-1] = a+k-1
    # rows by indexing, not gather with a vocabulary-wide index: [8, 112] rows of 4096 here, 0.8 vs 2.1 ms on CPU
    rows = torch.arange(bsz, device=src.device)[:, None]
    z = b.logits[rows, src.flatten(1)].view(bsz, -1, bk - 1, b.logits.shape[-1]).float()
    # a Markov head sees the true token before each position (teacher forcing): ids[a+k-1]
    prev = b.ids.gather(1, src.flatten(1)).view_as(src)
    q = s.with_markov(logits, prev)
    p_target = F.softmax(z, dim=-1) if cfg.labels == "target" or cfg.tv_weight else None
    if cfg.labels == "data":
        lab = b.ids.gather(1, (src + 1).flatten(1)).view_as(src)
        per = F.cross_entropy(q.float().flatten(0, 2), lab.flatten(), reduction="none").view_as(src)
    else:
        per = soft_ce(q, p_target)
    if cfg.tv_weight:  # DSpark's loss: CE mixed with the L1 distance of the distributions (2 x total variation)
        tv = (F.softmax(q.float(), dim=-1) - p_target).abs().sum(-1)
        per = (1 - cfg.tv_weight) * per + cfg.tv_weight * tv
    gamma = cfg.gamma if cfg.gamma is not None else dflash_gamma(bk)
    w = torch.exp(-torch.arange(bk - 1, dtype=torch.float32, device=q.device) / gamma)  # k = 1.. -> e^{-(k-1)/g}
    loss = (per * w).sum(-1).mean() / w.sum()
    if ctx.teacher is not None:
        with torch.no_grad():
            tl = ctx.teacher(ctx.teacher.fuse_taps(b.taps), blocks, positions=pos, mask=mask)
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
    q = s(b.ids).logits  # [B, T, V]
    z = b.logits.float()
    loss = kl(z, q).mean()
    if ctx.teacher is not None:
        with torch.no_grad():
            tl = ctx.teacher(b.ids).logits
        loss = loss + cfg.teacher_weight * kl(tl, q).mean()
    ref = top1(z)
    return LossOut(loss, top1_hits(top1(q), ref)[None].cpu(), torch.tensor([float(ref.numel())]))


LOSSES: dict[str, Callable[[LossContext], LossOut]] = {
    "eagle": chain_loss,
    "eagle3": chain_loss,
    "mtp": chain_loss,
    "dflash": dflash_loss,
    "lm": lm_loss,
}


def get_loss(family: str) -> Callable[[LossContext], LossOut]:
    try:
        return LOSSES[family]
    except KeyError:
        raise UsageError(f"no distillation loss for drafter family {family!r}; known: {', '.join(LOSSES)}") from None


def positions_scored(config: "DistillConfig", drafter: Drafter) -> int:
    """How many draft positions the family loss reports agreement for (acc@1..K)."""
    if drafter.family == "dflash":
        return drafter.config.block_size - 1
    if drafter.family == "lm":
        return 1
    return config.resolved_ttt_steps(drafter)


__all__ = ["TeacherBatch", "LossContext", "LossOut", "TrainKV", "unrolled_mask", "unroll", "chain_loss",
           "dflash_loss", "lm_loss", "dflash_gamma", "dflash_anchors", "dflash_inputs", "get_loss", "LOSSES",
           "soft_ce", "kl", "positions_scored"]
