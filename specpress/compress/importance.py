"""How much each prunable unit of a drafter matters: from its weights, or measured on calibration data.

Units: the channels of every MLP (FFN), the KV groups of every attention (a KV head with the query heads
that read it), and the layers of a layer stack. Scores are per module; higher = more important = kept.

  magnitude   weights only. FFN channel c: ||down[:, c]|| * (||gate[c]|| + ||up[c]||); KV group g:
              ||o_proj[:, cols(g)]|| * (||q rows(g)|| + ||k rows(g)|| + ||v rows(g)||); layer: ||o_proj|| +
              ||down_proj|| (the size of what it writes into the residual stream).
  activation  hooks on the drafter's forward over calibration data. FFN c: mean |a_c| * ||down[:, c]|| (a =
              the input of down_proj); KV group: sum over its query heads of mean ||head output|| *
              ||o_proj[:, cols(head)]||; layer: mean ||layer(x) - x|| / ||x|| over tokens.
  kl          acceptance-aware: how much KL(target || drafter) on the calibration data rises when the unit
              is removed (FFN channels in groups of `kl_group` of similar magnitude). Every removal is
              evaluated exactly, many at once: the calibration batch is stacked as copies along the batch
              dimension, each copy with its own unit mask (o_proj / down_proj inputs zeroed, a layer skipped).

Calibration runs the drafter through its family's teacher-forced forward (models/forced.py) on windows of
the data: eagle / eagle3 / mtp chain `draft_steps` steps from the target's features (every MTP module runs);
dflash drafts blocks [anchor, MASK...] at non-overlapping anchors with the context injected; lm predicts
every next token. The reference is the target's distribution of each drafted token (a reduced draft
vocabulary, EAGLE-3's: restricted to it and renormalized, as it is trained).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specpress.compress.data import WindowSampler
from specpress.compress.losses import TeacherBatch
from specpress.compress.teacher import draft_vocab, head_signals, target_signals
from specpress.errors import RequestError, UsageError
from specpress.models.drafter import Drafter, families_phrase, get_family
from specpress.models.forced import input_features, spaced_anchors
from specpress.models.layers import MLP
from specpress.models.target import TargetAttention, TargetModel
from specpress.ticker import count_bar

METHODS = ("magnitude", "activation", "kl")
MAX_ELEMENTS = 1 << 25  # logits elements per batched KL forward (copies x batch x positions x vocab): 128 MB fp32


# ----------------------------------------------------------------------------------------------
# Units
# ----------------------------------------------------------------------------------------------


def mlps(d: nn.Module) -> dict[str, MLP]:
    """Module path -> every SwiGLU MLP of the drafter."""
    return {n: m for n, m in d.named_modules() if isinstance(m, MLP)}


def attentions(d: nn.Module) -> dict[str, TargetAttention]:
    """Module path -> every attention of the drafter (EAGLE-3's 2H-input one and DFlash's injected one too)."""
    return {n: m for n, m in d.named_modules() if isinstance(m, TargetAttention)}


def layer_stack(d: Drafter) -> tuple[str, nn.ModuleList]:
    """(path, modules) of the drafter's layer stack; RequestError for families with a single layer."""
    fam = get_family(d.family)
    if fam.layer_stack is None:
        why = f" ({fam.note})" if fam.note else ""
        raise RequestError(f"--layers: {d.family} drafters have a single layer{why}; layer pruning applies to "
                           f"multi-layer drafters: {families_phrase(lambda f: f.layer_stack is not None)}")
    return fam.layer_stack, d.get_submodule(fam.layer_stack)  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------
# Calibration: target signals once, drafter forwards as the runtime drafts
# ----------------------------------------------------------------------------------------------


@dataclass
class Probe:
    """One calibration batch as the family's teacher-forced forward takes it, and the reference it is scored
    against."""

    ids: Tensor  # [B, T] windows
    feats: Tensor | None  # [B, n | T, F] the drafter's input features (chain: the first n positions)
    ref_logp: Tensor  # [B, *, V'] target log-probs of each drafted token over the drafter's output vocab
    ref_ids: Tensor  # [B, *] the target's argmax (target ids)
    steps: int = 1  # chained draft steps (eagle, eagle3, mtp)
    span: int | None = None  # chained start positions n
    anchors: Tensor | None = None  # [B, N] block anchors (dflash)

    @property
    def batch(self) -> int:
        return self.ids.shape[0]

    def repeated(self, copies: int) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(ids, feats, anchors) stacked `copies` times along the batch (copy-major)."""
        def rep(x: Tensor | None) -> Tensor | None:
            return x if copies == 1 or x is None else x.repeat(copies, *([1] * (x.dim() - 1)))

        return rep(self.ids), rep(self.feats), rep(self.anchors)  # type: ignore[return-value]


def calibration_windows(calib: np.ndarray | Tensor, batch: int, seq_len: int, seed: int, batches: int
                        ) -> tuple[list[Tensor], np.ndarray]:
    """(window batches [b, T], the token stream) of calibration tokens: a 1-D stream, from which `batches`
    batches of [batch, seq_len] windows are drawn (WindowSampler, `seed`), or windows [N, T] as given."""
    if isinstance(calib, Tensor) and calib.dim() == 2:
        w = calib.long().cpu()
        return list(w.split(batch)), w.flatten().numpy()
    stream = np.asarray(calib.cpu().numpy() if isinstance(calib, Tensor) else calib).astype(np.int64).ravel()
    sampler = WindowSampler(stream, seq_len, batch, seed)
    return [sampler.batch_at(i) for i in range(batches)], stream


def calibration_signals(target: TargetModel, windows: Sequence[Tensor], taps: Sequence[int],
                        drafter: Drafter | None = None) -> list[TeacherBatch]:
    """The target's logits / hidden / taps on each window batch [B, T] (computed once, reused by every pass);
    for a drafter with a reduced draft vocabulary, only its columns (and the full-vocabulary argmax)."""
    dev = target.lm_head.weight.device
    vocab = draft_vocab(drafter)
    return [target_signals(target, w.to(dev), tuple(taps), vocab) for w in windows]


def draft_steps(d: Drafter, steps: int | None) -> int:
    """Chained draft steps calibration runs: default 1 (every MTP module: num_nextn_predict_layers)."""
    n_mod = d.draft_modules()
    if steps is not None and steps < n_mod:
        raise RequestError(f"draft_steps {steps} would leave MTP modules unscored; use >= {n_mod} "
                           f"(num_nextn_predict_layers)")
    return steps or n_mod


def draft_vocab_ids(d: Drafter) -> Tensor:
    """A reduced draft vocabulary's target ids [Vd], in draft-id order (eagle3)."""
    return d.to_target_ids(torch.arange(d.config.draft_vocab_size, device=d.d2t.device))  # type: ignore[operator]


def make_probes(d: Drafter, signals: Sequence[TeacherBatch], steps: int | None = None) -> list[Probe]:
    """Calibration probes of drafter `d` on the target's signals."""
    chained = get_family(d.family).session == "feature"
    k = draft_steps(d, steps) if chained else 1
    return [_probe(d, s, k) for s in signals]


def _probe(d: Drafter, s: TeacherBatch, k: int) -> Probe:
    ids = s.ids
    b, t = ids.shape
    kind = get_family(d.family).loss
    reduced = get_family(d.family).draft_vocab == "reduced"
    z = s.columns(draft_vocab_ids(d)) if reduced else s.logits  # the columns the loss reads, in the target's dtype
    if kind == "lm":
        return Probe(ids, None, F.log_softmax(z.float(), -1), z.argmax(-1))
    if kind == "block":
        bk = d.config.block_size
        if t - bk < 1:
            raise RequestError(f"calibration windows of {t} tokens are too short for dflash blocks of {bk}; "
                               f"use --seq-len >= {bk + 2}")
        anchors = spaced_anchors(b, t, bk, ids.device)
        src = anchors[0, :, None] + torch.arange(bk - 1, device=ids.device)  # slot k drafts a+k ~ z_{a+k-1}
        ref = z[:, src]  # [B, N, Bk-1, V]
        return Probe(ids, d.fuse_taps(s.taps), F.log_softmax(ref.float(), -1), ref.argmax(-1), anchors=anchors)
    n = t - k - 1
    if n < 1:
        raise RequestError(f"calibration windows of {t} tokens are too short for {k} draft steps; "
                           f"use --seq-len >= {k + 2}")
    first = input_features(d, s.hidden, s.taps)
    ref = torch.stack([z[:, 1 + i:1 + i + n] for i in range(k)], dim=2)  # [B, n, K, V]: step i drafts x_{j+2+i}
    top = s.ref_ids()  # the target's argmax over its whole vocabulary
    ref_ids = torch.stack([top[:, 1 + i:1 + i + n] for i in range(k)], dim=2)
    return Probe(ids, first[:, :n], F.log_softmax(ref.float(), -1), ref_ids, k, span=n)


def drafter_logits(d: Drafter, probe: Probe, copies: int = 1) -> Tensor:
    """The drafter's logits on the probe, shaped like probe.ref_logp with the batch x copies."""
    ids, feats, anchors = probe.repeated(copies)
    forced = get_family(d.family).teacher_forced(d, ids, feats, steps=probe.steps, span=probe.span,
                                                  anchors=anchors)
    return forced.draft_logits(d)


def _kl_per_copy(ref_logp: Tensor, logits: Tensor, copies: int) -> Tensor:
    """Mean KL(ref || logits) over the positions of each copy -> [copies]."""
    logq = F.log_softmax(logits.float(), -1).view(copies, *ref_logp.shape)
    p = ref_logp.exp()
    per = (p * (ref_logp.masked_fill(p == 0, 0.0) - logq)).sum(-1)
    return per.flatten(1).mean(1)


@torch.no_grad()
def fit(d: Drafter, probes: Sequence[Probe]) -> dict[str, float]:
    """KL(target || drafter) and top-1 agreement (drafter argmax == target argmax, in target ids)."""
    kl = agree = 0.0
    for p in probes:
        logits = drafter_logits(d, p)
        kl += float(_kl_per_copy(p.ref_logp, logits, 1)[0])
        top = logits.argmax(-1)
        if get_family(d.family).draft_vocab == "reduced":
            top = d.to_target_ids(top)  # type: ignore[operator]
        agree += float((top == p.ref_ids).float().mean())
    return {"kl": kl / len(probes), "agreement": agree / len(probes)}


# ----------------------------------------------------------------------------------------------
# Measured statistics: hooks
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def _mean_stat(d: Drafter, probes: Sequence[Probe],
               modules: Mapping[str, tuple[nn.Module, Callable[[Tensor, Tensor], Tensor]]]) -> dict[str, Tensor]:
    """name -> (module, stat): the mean over calibration tokens of stat(module input [.., X], output), where
    stat returns [U] summed over the tokens it saw."""
    sums: dict[str, Tensor] = {}
    counts: dict[str, int] = {}

    def hook(name: str, stat: Callable[[Tensor, Tensor], Tensor]) -> Callable:
        def fn(mod: nn.Module, args: tuple, out: Tensor) -> None:
            x = args[0]
            sums[name] = sums.get(name, 0) + stat(x, out).float().cpu()  # type: ignore[assignment]
            counts[name] = counts.get(name, 0) + x.numel() // x.shape[-1]
        return fn

    handles = [m.register_forward_hook(hook(n, stat)) for n, (m, stat) in modules.items()]
    try:
        for p in probes:
            drafter_logits(d, p)
    finally:
        for h in handles:
            h.remove()
    return {n: sums[n] / max(counts[n], 1) for n in modules}


@torch.no_grad()
def masked_kl(d: Drafter, probes: Sequence[Probe], module: nn.Module, masks: Tensor,
              expand: Callable[[Tensor], Tensor] = lambda m: m, skip: bool = False) -> Tensor:
    """Mean KL(target || drafter) with each row of `masks` [M, U] applied to `module` -> [M].

    skip=False: the module's input features are multiplied by expand(mask) (zeroed = removed units);
    skip=True: the module (a residual layer) is skipped where the mask [M, 1] is 0.
    """
    total = torch.zeros(masks.shape[0])
    for p in probes:
        step = max(1, MAX_ELEMENTS // max(1, p.ref_logp.numel()))
        for lo in range(0, masks.shape[0], step):
            m = expand(masks[lo:lo + step]).to(p.ref_logp.device)
            g = m.shape[0]
            rows = m.repeat_interleave(p.batch, 0)  # [g * B, X], copy-major like Probe.repeated
            if skip:
                def post(mod: nn.Module, args: tuple, out: Tensor, rows: Tensor = rows) -> Tensor:
                    r = rows.view(-1, *([1] * (out.dim() - 1))).to(out.dtype)
                    return args[0] + r * (out - args[0])
                h = module.register_forward_hook(post)
            else:
                def pre(mod: nn.Module, args: tuple, rows: Tensor = rows) -> tuple:
                    x = args[0]
                    return (x * rows.view(rows.shape[0], *([1] * (x.dim() - 2)), -1).to(x.dtype),) + args[1:]
                h = module.register_forward_pre_hook(pre)
            try:
                logits = drafter_logits(d, p, g)
            finally:
                h.remove()
            total[lo:lo + g] += _kl_per_copy(p.ref_logp, logits, g).cpu()
    return total / len(probes)


# ----------------------------------------------------------------------------------------------
# Scores
# ----------------------------------------------------------------------------------------------


def _need(probes: Sequence[Probe] | None, method: str) -> Sequence[Probe]:
    if not probes:
        raise UsageError(f"--importance {method} needs calibration data: give --target DIR and --data PATH")
    return probes


@torch.no_grad()
def ffn_scores(d: Drafter, method: str, probes: Sequence[Probe] | None = None, kl_group: int = 8) -> dict[str, Tensor]:
    """MLP path -> [F] channel importance."""
    units = mlps(d)
    mags = {n: (m.down_proj.weight.float().norm(dim=0) * (m.gate_proj.weight.float().norm(dim=1)
                                                          + m.up_proj.weight.float().norm(dim=1))).cpu()
            for n, m in units.items()}
    if method == "magnitude":
        return mags
    probes = _need(probes, method)
    if method == "activation":
        acts = _mean_stat(d, probes, {n: (m.down_proj, _abs_sum) for n, m in units.items()})
        return {n: acts[n] * m.down_proj.weight.float().norm(dim=0).cpu() for n, m in units.items()}
    out = {}
    for n, m in units.items():
        groups = mags[n].argsort().split(kl_group)  # channels of similar magnitude are scored together
        masks = torch.ones(len(groups) + 1, mags[n].numel())
        for i, g in enumerate(groups):
            masks[i + 1, g] = 0.0
        kls = masked_kl(d, probes, m.down_proj, masks)
        score = torch.empty(mags[n].numel())
        for i, g in enumerate(groups):
            score[g] = kls[i + 1] - kls[0]
        out[n] = score
    return out


@torch.no_grad()
def head_scores(d: Drafter, method: str, probes: Sequence[Probe] | None = None) -> dict[str, Tensor]:
    """Attention path -> [KV] importance of each KV group (a KV head and its query heads)."""
    out = {}
    units = attentions(d)
    if method == "activation":
        acts = _mean_stat(d, _need(probes, method), {n: (a.o_proj, _head_norms(a.d)) for n, a in units.items()})
    for n, a in units.items():
        rep, dim = a.nq // a.nkv, a.d
        o_cols = a.o_proj.weight.float().view(-1, a.nq, dim).norm(dim=(0, 2)).cpu()  # [Hq] per query head
        if method == "magnitude":
            qn = a.q_proj.weight.float().view(a.nkv, rep * dim, -1).norm(dim=(1, 2))
            kn = a.k_proj.weight.float().view(a.nkv, dim, -1).norm(dim=(1, 2))
            vn = a.v_proj.weight.float().view(a.nkv, dim, -1).norm(dim=(1, 2))
            out[n] = o_cols.view(a.nkv, rep).pow(2).sum(1).sqrt() * (qn + kn + vn).cpu()
        elif method == "activation":
            out[n] = (acts[n] * o_cols).view(a.nkv, rep).sum(1)
        else:
            masks = torch.cat([torch.ones(1, a.nkv), 1.0 - torch.eye(a.nkv)])
            kls = masked_kl(d, _need(probes, method), a.o_proj, masks,
                            expand=lambda m, k=rep * dim: m.repeat_interleave(k, dim=1))
            out[n] = kls[1:] - kls[0]
    return out


def _abs_sum(x: Tensor, y: Tensor) -> Tensor:
    """down_proj input [.., F] -> [F]: summed |activation| of each channel."""
    return x.abs().flatten(0, -2).sum(0)


def _head_norms(head_dim: int) -> Callable[[Tensor, Tensor], Tensor]:
    """stat(o_proj input [.., Hq*D], out) -> [Hq]: summed norm of each query head's output."""
    return lambda x, y: x.unflatten(-1, (-1, head_dim)).norm(dim=-1).flatten(0, -2).sum(0)


def _relative_update(x: Tensor, y: Tensor) -> Tensor:
    """layer input x, output y [.., H] -> [1]: summed ||y - x|| / ||x|| over tokens."""
    return ((y - x).float().norm(dim=-1) / x.float().norm(dim=-1).clamp_min(1e-6)).sum()[None]


@torch.no_grad()
def layer_scores(d: Drafter, method: str, probes: Sequence[Probe] | None = None) -> Tensor:
    """[L] importance of each layer of the drafter's layer stack."""
    _, stack = layer_stack(d)
    if method == "magnitude":
        return torch.tensor([float(layer.self_attn.o_proj.weight.float().norm()
                                   + layer.mlp.down_proj.weight.float().norm()) for layer in stack])
    probes = _need(probes, method)
    if method == "activation":
        rel = _mean_stat(d, probes, {str(i): (layer, _relative_update) for i, layer in enumerate(stack)})
        return torch.cat([rel[str(i)] for i in range(len(stack))])
    kls = [masked_kl(d, probes, layer, torch.tensor([[1.0], [0.0]]), skip=True) for layer in stack]  # kept, skipped
    return torch.stack([k[1] - k[0] for k in kls])


def lowest(score: Tensor, k: int, tiebreak: Tensor | None = None) -> list[int]:
    """Indices of the k least important units: ascending score, ties by ascending tiebreak, then index."""
    order = torch.arange(score.numel())
    if tiebreak is not None:
        order = order[torch.argsort(tiebreak.float()[order], stable=True)]
    order = order[torch.argsort(score.float()[order], stable=True)]
    return sorted(int(i) for i in order[:k])


# ----------------------------------------------------------------------------------------------
# Vocabulary
# ----------------------------------------------------------------------------------------------


def vocab_count_stream(source: str, target: TargetModel | None, calib: np.ndarray | Tensor, batch: int,
                       seq_len: int, seed: int, n_tokens: int, *, progress: bool = False,
                       minutes: float | None = None) -> np.ndarray:
    """The tokens whose frequency picks a draft vocabulary: "target" = the target's greedy next-token
    predictions (what a drafter must propose to be accepted at T=0), "data" = the data's own tokens.

    They are counted over about `n_tokens` tokens of calibration windows (WindowSampler with `seed`, so the
    first windows are those the other stages calibrate on), or over every window when `calib` is windows
    [N, T]. A frequency ranking needs far more tokens than importance scoring: a 4096-token vocabulary cut to
    1024 covered 92.6 % of the zoo target's held-out greedy output when counted on 2k predictions, 97.9 %
    on 131k (recorded in BENCHMARKS.md at b5bd58d). On CPU an fp32 target predicts under bf16 autocast (a
    near-tie may rank differently; the counts barely move). progress: a transient bar on stderr over the
    target's forwards. minutes: a time budget for the target's forwards: counting stops after the first
    forward that ends past it (at least one runs), so the count is what the time allowed.
    """
    if isinstance(calib, Tensor) and calib.dim() == 2:
        windows = list(calib.long().cpu().split(batch))
    else:
        stream = np.asarray(calib.cpu().numpy() if isinstance(calib, Tensor) else calib).astype(np.int64).ravel()
        sampler = WindowSampler(stream, seq_len, batch, seed)
        windows = [sampler.batch_at(i) for i in range(max(1, -(-n_tokens // (batch * seq_len))))]
    if source != "target":
        return torch.cat([w.flatten() for w in windows]).numpy()
    if target is None:
        raise RequestError("counting the target's predictions for the draft vocabulary needs the target")
    dev = target.lm_head.weight.device
    cpu_fp32 = dev.type == "cpu" and target.lm_head.weight.dtype == torch.float32
    parts: list[Tensor] = []
    t0 = time.monotonic()
    with count_bar(progress, "draft vocabulary: target predictions", len(windows)) as advance, torch.inference_mode(), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=cpu_fp32):
        for w in windows:  # the argmax a block of positions at a time: the [B, T, V] logits are never made
            parts.append(head_signals(target.lm_head, target(w.to(dev), logits="none").hidden, None)[1].flatten().cpu())
            advance()
            if minutes is not None and time.monotonic() - t0 > 60 * minutes:
                break
    return torch.cat(parts).numpy()

