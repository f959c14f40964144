"""`prune`: structured pruning into a smaller DENSE drafter, in its family's public layout.

    pruned = prune(drafter, PruneConfig(ffn=256, kv_heads=1, importance="kl"), target=target, calib=stream)

Every stage says what stays (the pruned drafter's shape, as distill's student options do). Stages run in
this order, each scored (importance.py) on the model the previous stage left:

  layers  keep `layers` layers of the stack (dflash `layers.*`, lm `model.layers.*`, eagle with more than one
          layer, whose layer 0 always stays: it alone has no input norm).
  heads   keep `kv_heads` whole GQA groups (a KV head and its query heads: q/k/v rows, o_proj columns) in
          every attention; the group size and head_dim stay (head_dim explicit).
  ffn     keep `ffn` channels of every MLP: gate/up rows, down columns.
  vocab   eagle3: keep the `vocab` draft tokens most frequent on the calibration data, among those already in
          the draft vocab (FR-Spec's rule): vocab_source "target" counts the target's greedy next-token
          predictions (what must be drafted to be accepted at T=0), "data" the data's tokens, over
          `vocab_tokens` tokens of calibration windows (a ranking needs far more than scoring does); lm_head rows,
          d2t and t2d rebuilt. eagle / mtp / dflash draft through the target's own head (no reduced head
          without model changes); lm owns its vocabulary.
  head    (compress/head.py) `head_rank`: the drafter's own head (eagle3's, an lm drafter's untied one) as
          rank-R factors, by truncated SVD (`head_init` "svd") or SVD whitened by the head's input covariance
          on the calibration windows ("activation"); `share_head` (eagle3): no head, the target's lm_head rows
          of the draft vocabulary instead (shared bytes, not stored).

The result is a fresh module built from the smaller config (no masks) that save_drafter / load_drafter write
and read in the public layout; the input's weights are left unchanged. `recover_steps` then distills it
against the target from the pruned weights (compress.distill, bf16 autocast as its default). Every call
appends one step to the provenance: {"step": "prune", "config", "bytes_before/after", "params_before/after",
"shape_before/after", "importance" (what each stage removed), "calibration" (KL and top-1 agreement
before/after, when measured)}; recovery appends its own "distill" step (with its DistillConfig) after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from specpress.compress.data import WindowSampler
from specpress.compress.head import HEAD_INITS, check_head_request, factorise_head, head_input_covariance, share_head
from specpress.compress.importance import (METHODS, calibration_signals, calibration_windows, ffn_scores, fit,
                                           head_scores, layer_scores, layer_stack, lowest, make_probes,
                                           vocab_count_stream)
from specpress.compress.slicing import drop_layers, shrink_vocab, slice_ffn, slice_heads
from specpress.config import config_kwargs
from specpress.errors import ConfigError, RequestError, UsageError
from specpress.models.drafter import Drafter, families_phrase, get_family
from specpress.models.target import TargetModel

VOCAB_SOURCES = ("target", "data")
SHAPE_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "draft_vocab_size", "head_rank", "shared_head")


VOCAB_TOKENS = 262144  # tokens the vocab stage counts by default (256 forwards of 8 x 128 windows)


@dataclass(frozen=True)
class PruneConfig:
    """What one pruning run keeps and how it decides. Frozen, validated, strict from_dict (version 1).

    ffn / kv_heads / layers / vocab: how many FFN channels (per MLP) / KV groups (per attention) / layers /
    draft tokens to KEEP. Deprecated for one release, still read: ffn as a fraction 0 < R < 1 and heads
    (0 < R < 1), the share of FFN channels / KV groups to REMOVE (`legacy()` names them).
    importance: magnitude | activation | kl. kl_group: FFN channels scored together by
    kl. Calibration: calib_batches windows batches of [batch, seq_len] drawn with `seed` from the data;
    vocab_tokens: how many tokens of such windows the vocab stage counts (all of them when given windows);
    draft_steps: chained steps it runs (eagle, eagle3, mtp; default 1, every module for mtp).
    head_rank: the rank of a low-rank draft head, initialised by head_init (svd | activation); share_head: the
    target's head rows instead of the drafter's own (eagle3).
    recover_steps / recover_lr: distillation after pruning (0 = none), on [batch, seq_len] windows.
    """

    version: ClassVar[int] = 1
    ffn: int | float | None = None
    heads: float | None = None  # deprecated: the share of KV groups to remove (kv_heads says what stays)
    layers: int | None = None
    vocab: int | None = None
    head_rank: int | None = None
    share_head: bool = False
    head_init: str = "svd"
    importance: str = "magnitude"
    vocab_source: str = "target"
    vocab_tokens: int = VOCAB_TOKENS
    kl_group: int = 8
    batch: int = 8
    seq_len: int = 128
    calib_batches: int = 2
    draft_steps: int | None = None
    seed: int = 0
    recover_steps: int = 0
    recover_lr: float = 1e-4
    kv_heads: int | None = None

    def __post_init__(self) -> None:
        f = self.ffn
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float))
                              or (isinstance(f, float) and not 0 < f < 1) or (isinstance(f, int) and f < 1)):
            raise ConfigError(f"--ffn must be the FFN channels each layer keeps, an integer >= 1; found {f!r}")
        h = self.heads
        if h is not None and (isinstance(h, bool) or not isinstance(h, float) or not 0 < h < 1):
            raise ConfigError(f"--heads (deprecated: the share of KV groups to remove) must be in the open range "
                              f"(0, 1); found {h!r}; give the KV groups to keep with --kv-heads N")
        if h is not None and self.kv_heads is not None:
            raise ConfigError("--heads is the deprecated spelling of --kv-heads (what stays): give --kv-heads only")
        for name, lo in (("kv_heads", 1), ("layers", 1), ("vocab", 1), ("head_rank", 1), ("kl_group", 1),
                         ("batch", 1), ("seq_len", 2), ("calib_batches", 1), ("vocab_tokens", 1), ("draft_steps", 1),
                         ("recover_steps", 0)):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
                raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= {lo}, found {v!r}")
        if self.importance not in METHODS:
            raise ConfigError(f"--importance {self.importance!r} is not known; choose one of {', '.join(METHODS)}")
        if self.vocab_source not in VOCAB_SOURCES:
            raise ConfigError(f"--vocab-source {self.vocab_source!r} is not known; choose {' or '.join(VOCAB_SOURCES)}")
        if not (isinstance(self.recover_lr, (int, float)) and self.recover_lr > 0):
            raise ConfigError(f"--recover-lr must be a positive number, found {self.recover_lr!r}")
        if not isinstance(self.share_head, bool):
            raise ConfigError(f"share_head must be true or false, found {self.share_head!r}")
        if self.head_init not in HEAD_INITS:
            raise ConfigError(f"--head-init {self.head_init!r} is not known; choose {' or '.join(HEAD_INITS)}")
        if all(getattr(self, f) is None for f in ("ffn", "kv_heads", "heads", "layers", "vocab", "head_rank")) \
                and not self.share_head:
            raise ConfigError("nothing to prune: give at least one of --ffn N, --kv-heads N, --layers N, --vocab N "
                              "(what stays), --head-rank R, --share-head")

    @property
    def structural(self) -> bool:
        return any(getattr(self, f) is not None for f in ("ffn", "kv_heads", "heads", "layers"))

    def legacy(self) -> list[tuple[str, str]]:
        """(old spelling, what to write instead) for each deprecated field this config uses."""
        out = []
        if isinstance(self.ffn, float):
            out.append((f"ffn {self.ffn:g} (the share of FFN channels to remove)",
                        "give the channels each layer keeps: ffn N (--ffn N)"))
        if self.heads is not None:
            out.append((f"heads {self.heads:g} (the share of KV groups to remove)",
                        "give the KV groups each attention keeps: kv_heads N (--kv-heads N)"))
        return out

    def needs_target(self) -> bool:
        """Whether the run must see the target (calibration signals or recovery)."""
        return (self.structural and self.importance != "magnitude") or self.recover_steps > 0 or (
            self.vocab is not None and self.vocab_source == "target") or (
            self.head_rank is not None and self.head_init == "activation")

    def needs_data(self) -> bool:
        return self.needs_target() or self.vocab is not None

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PruneConfig":
        return cls(**config_kwargs(cls, d, "prune config"))


def prune(drafter: Drafter, config: PruneConfig, *, target: TargetModel | None = None,
          calib: np.ndarray | Tensor | None = None, provenance_extra: Mapping[str, Any] | None = None,
          progress: bool = False) -> Drafter:
    """A smaller dense drafter: `drafter` with the units `config` names removed (see the module docstring).

    target: needed by activation / kl importance, vocab_source "target" and recovery (the drafter is
    attached to it). calib: calibration tokens, a 1-D stream (windows are drawn from it) or windows [N, T].
    provenance_extra: merged into the step's "calibration" record (e.g. the data's path). progress: a bar on
    stderr while the vocab stage runs the target over `vocab_tokens` tokens (minutes on a 30M target, on CPU).
    """
    counts = check_request(drafter, config, has_target=target is not None, has_calib=calib is not None)
    if target is not None:
        drafter.attach_target(target)
    windows, stream = calibration_windows(calib, config.batch, config.seq_len, config.seed, config.calib_batches) \
        if calib is not None else ([], None)
    signals = calibration_signals(target, windows, drafter.taps) if target is not None and windows else []
    probes = make_probes(drafter, signals, config.draft_steps) if signals else None
    was = drafter.training
    drafter.eval()
    try:
        model, record, method = drafter, {"method": config.importance}, config.importance
        if "layers" in counts:
            model, record["layers"] = _stage_layers(model, counts["layers"], method, probes)
        if "heads" in counts:
            model, record["heads"] = _stage_heads(model, counts["heads"], method, probes)
        if "ffn" in counts:
            model, record["ffn"] = _stage_ffn(model, counts["ffn"], method, probes, config.kl_group)
        if "vocab" in counts:
            assert calib is not None
            toks = vocab_count_stream(config.vocab_source, target, calib, config.batch, config.seq_len,
                                      config.seed, config.vocab_tokens, progress=progress)
            model, record["vocab"] = _stage_vocab(model, counts["vocab"], toks, config.vocab_source)
        if config.head_rank is not None:
            cov = head_input_covariance(model, probes) if config.head_init == "activation" and probes else None
            model, record["head"] = factorise_head(model, config.head_rank, cov)
        elif config.share_head:
            model, record["head"] = share_head(model)
        calibration: dict[str, Any] = dict(provenance_extra or {})
        if probes:
            after = fit(model, make_probes(model, signals, config.draft_steps))
            calibration.update({"tokens": sum(int(s.ids.numel()) for s in signals),
                                **{f"{k}_before": v for k, v in fit(drafter, probes).items()},
                                **{f"{k}_after": v for k, v in after.items()}})
    finally:
        drafter.train(was)
    (p0, b0), (p1, b1) = size_of(drafter), size_of(model)
    model.provenance = tuple(drafter.provenance) + ({
        "step": "prune", "config": config.to_dict(), "bytes_before": b0, "bytes_after": b1, "params_before": p0,
        "params_after": p1, "shape_before": shape_of(drafter), "shape_after": shape_of(model), "importance": record,
        "calibration": calibration},)
    if config.recover_steps:
        assert target is not None and stream is not None
        model = _recover(model, target, config, stream)
    return model


def _recover(model: Drafter, target: TargetModel, config: PruneConfig, stream: np.ndarray) -> Drafter:
    """A short distillation against the target from the pruned weights (compress.distill)."""
    from specpress.compress.config import DistillConfig
    from specpress.compress.distill import distill

    dtype = model.compute_param().dtype
    dc = DistillConfig(family=model.family, steps=config.recover_steps, lr=config.recover_lr, optimizer="adamw",
                       batch=config.batch, seq_len=config.seq_len, seed=config.seed)  # recovery as measured: AdamW
    report = distill(target, dc, WindowSampler(stream, config.seq_len, config.batch, config.seed), None, init=model)
    return report.drafter.to(dtype).eval()


FLAGS = {"heads": "--kv-heads", "ffn": "--ffn", "layers": "--layers", "vocab": "--vocab"}  # stage -> its option


def kept_count(keep: int, n: int, flag: str, what: str) -> int:
    """`keep` units of `n` stay; RequestError unless 1 <= keep <= n - 1."""
    if n < 2:
        raise RequestError(f"{flag}: the drafter has a single {what}; pruning below one {what} is not possible")
    if not 1 <= keep <= n - 1:
        raise RequestError(f"{flag} {keep} must be less than the drafter's {n} {what}s (valid range 1..{n - 1}; "
                           f"it is the number of {what}s to KEEP)")
    return keep


def removed_count(ratio: float, n: int, flag: str, what: str) -> int:
    """round(ratio * n) units to remove; RequestError unless 1 <= that <= n - 1."""
    k, lo, hi = int(math.floor(ratio * n + 0.5)), 0.5 / n, (n - 0.5) / n
    if n < 2:
        raise RequestError(f"{flag}: the drafter has a single {what}; pruning below one {what} is not possible")
    if not 1 <= k <= n - 1:
        what_k = f"removes no {what} of {n}" if k < 1 else \
            f"would remove all {n} {what}s, and pruning below one {what} is not possible"
        raise RequestError(f"{flag} {ratio} {what_k}; valid range [{lo:.4g}, {hi:.4g})")
    return k


def check_request(d: Drafter, config: PruneConfig, *, has_target: bool, has_calib: bool) -> dict[str, int]:
    """Every impossible request as a RequestError, before any work (a meta-device drafter works too).
    Returns the counts: layers / vocab to keep, heads / ffn units to remove per module."""
    c, out = d.config, {}
    quant = [s for s in d.provenance if isinstance(s, Mapping) and s.get("step") == "quantize"]
    if any(getattr(m, "is_quantized", False) for m in d.modules()) or (quant and not quant[-1].get("dequantized")):
        raise RequestError("this drafter is quantized (its provenance ends in an active quantize step); prune comes "
                           "before quantize: prune the unquantized drafter, then quantize the result")
    fam = get_family(d.family)
    asked = {"heads": config.kv_heads is not None or config.heads is not None, "ffn": config.ffn is not None}
    for stage in [s for s in ("heads", "ffn") if asked[s] and s not in fam.prunable]:
        raise RequestError(f"{FLAGS[stage]}: {d.family} drafters support {', '.join(FLAGS[s] for s in fam.prunable)}")
    if config.layers is not None:
        n = len(layer_stack(d)[1])
        if n < 2:
            raise RequestError(f"--layers: this {d.family} drafter has a single layer; layer pruning applies to "
                               f"multi-layer drafters: {families_phrase(lambda f: f.layer_stack is not None)} "
                               f"(with more than one layer)")
        if not config.layers < n:
            raise RequestError(f"--layers {config.layers} must be less than the drafter's {n} layers "
                               f"(valid range 1..{n - 1}; it is the number of layers to KEEP)")
        out["layers"] = config.layers
    if config.kv_heads is not None:
        out["heads"] = c.num_key_value_heads - kept_count(config.kv_heads, c.num_key_value_heads, "--kv-heads",
                                                          "KV group")
    elif config.heads is not None:
        out["heads"] = removed_count(config.heads, c.num_key_value_heads, "--heads", "KV group")
    if isinstance(config.ffn, int):
        out["ffn"] = c.intermediate_size - kept_count(config.ffn, c.intermediate_size, "--ffn", "FFN channel")
    elif config.ffn is not None:
        out["ffn"] = removed_count(config.ffn, c.intermediate_size, "--ffn", "FFN channel")
    if config.vocab is not None:
        vocab = get_family(d.family).draft_vocab
        if vocab != "reduced":
            how = "own their vocabulary" if vocab == "own" else "draft through the target's head"
            who = families_phrase(lambda f: f.draft_vocab == "reduced")
            raise RequestError(f"--vocab: {d.family} drafters {how}; draft-vocabulary pruning is supported for "
                               f"{who} drafters (their own lm_head, d2t, t2d)")
        if not config.vocab <= c.draft_vocab_size:
            raise RequestError(f"--vocab {config.vocab} is larger than the drafter's draft vocabulary "
                               f"({c.draft_vocab_size}; the target's vocabulary is {c.vocab_size}); valid range "
                               f"1..{c.draft_vocab_size}")
        out["vocab"] = config.vocab
    if config.head_rank is not None or config.share_head:
        check_head_request(d, config.head_rank, config.share_head)
    why = (f"--importance {config.importance}" if config.structural and config.importance != "magnitude" else
           "--recover-steps" if config.recover_steps else "--head-init activation" if config.head_rank and
           config.head_init == "activation" else f"--vocab (with --vocab-source {config.vocab_source})")
    if config.needs_target() and not has_target:
        raise UsageError(f"{why} needs calibration by the target: give --target DIR and --data PATH")
    if config.needs_data() and not has_calib:
        raise UsageError(f"{why} needs calibration data: give --data PATH (tokenized by --target DIR)")
    return out


def size_of(d: Drafter) -> tuple[int, int]:
    """(parameters, bytes of the tensors the drafter stores itself): what `inspect` reports."""
    params = sum(p.numel() for p in d.parameters())
    return params, sum(t.numel() * t.element_size() for t in d.public_state_dict().values())


def shape_of(d: Drafter) -> dict[str, int]:
    """The shape fields the drafter's config sets (a flag such as shared_head only when on)."""
    return {f: getattr(d.config, f) for f in SHAPE_FIELDS if getattr(d.config, f, None) not in (None, False)}


# ----------------------------------------------------------------------------------------------
# Stages: score, choose, slice
# ----------------------------------------------------------------------------------------------


def _r(x: Any) -> float:
    return round(float(x), 6)


def _complement(removed: Sequence[int], n: int) -> Tensor:
    gone = set(removed)
    return torch.tensor([i for i in range(n) if i not in gone], dtype=torch.long)


def _stage_layers(d: Drafter, keep_n: int, method: str, probes: Any) -> tuple[Drafter, dict[str, Any]]:
    scores = layer_scores(d, method, probes)
    for i in get_family(d.family).pinned_layers:
        scores[i] = float("inf")  # e.g. eagle's layer 0 reads fc's output without a norm: it stays
    removed = lowest(scores, len(scores) - keep_n, layer_scores(d, "magnitude"))
    keep = _complement(removed, len(scores)).tolist()
    return drop_layers(d, keep), {"removed": removed, "scores": [_r(s) for s in scores]}


def _stage_heads(d: Drafter, k: int, method: str, probes: Any) -> tuple[Drafter, dict[str, Any]]:
    scores, mags = head_scores(d, method, probes), head_scores(d, "magnitude")
    removed = {p: lowest(scores[p], k, mags[p]) for p in scores}
    keep = {p: _complement(r, d.config.num_key_value_heads) for p, r in removed.items()}
    return slice_heads(d, keep), {"removed_kv_groups": removed}


def _stage_ffn(d: Drafter, k: int, method: str, probes: Any, group: int) -> tuple[Drafter, dict[str, Any]]:
    scores, mags = ffn_scores(d, method, probes, group), ffn_scores(d, "magnitude")
    removed = {p: lowest(scores[p], k, mags[p]) for p in scores}
    gone = torch.cat([scores[p][r] for p, r in removed.items()])
    keep = {p: _complement(r, d.config.intermediate_size) for p, r in removed.items()}
    return slice_ffn(d, keep), {"removed_per_mlp": k, "mlps": len(keep), "score_removed_mean": _r(gone.mean()),
                                "score_kept_mean": _r(torch.cat([scores[p][keep[p]] for p in scores]).mean())}


def _stage_vocab(d: Drafter, n: int, tokens: np.ndarray, source: str) -> tuple[Drafter, dict[str, Any]]:
    from specpress.compress.students import draft_vocab_by_frequency

    ids = draft_vocab_by_frequency(tokens, d.config.vocab_size, n, allowed=d.t2d)
    t, new = torch.from_numpy(np.asarray(tokens, dtype=np.int64)), shrink_vocab(d, ids)
    return new, {"source": source, "counted_tokens": int(t.numel()), **{  # share of the counted tokens drafted
        f"coverage_{when}": _r(m.t2d.cpu()[t].float().mean()) for when, m in (("before", d), ("after", new))}}


__all__ = ["PruneConfig", "prune", "check_request", "slice_ffn", "slice_heads", "drop_layers", "shrink_vocab",
           "removed_count", "size_of", "shape_of"]
