"""The draft-head stages of `prune` (compress/prune.py runs them last, after the vocabulary stage):

  head_rank R   factorise the drafter's own head into rank-R factors (models/heads.py): `head_init` "svd"
                (truncated SVD of the weight, no data) or "activation" (SVD whitened by the covariance of the
                head's inputs on the calibration windows: the factors that best reproduce the logits the head
                actually produces). eagle3's draft head and an lm drafter's untied lm_head.
  share_head    eagle3: drop the head; the target's lm_head rows of the draft vocabulary replace it (not
                stored: the runtime reads them from the target it attaches to). The drafter's final norm
                stays its own and is what recovery then trains the drafter towards, against the frozen rows.

Each returns the new drafter and its record for the prune step's provenance ("importance"["head"]).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from specpress.compress.importance import Probe, _mean_stat
from specpress.compress.slicing import _rebuild, _state
from specpress.errors import RequestError, UsageError
from specpress.models.drafter import Drafter, families_phrase, get_family
from specpress.models.heads import dense_weight, factorise

HEAD_INITS = ("svd", "activation")


def head_of(d: Drafter) -> Any:
    """The drafter's own head module (dense Linear or LowRankHead); RequestError when it has none."""
    head = getattr(d, "lm_head", None)
    if get_family(d.family).draft_vocab == "target" or head is None:
        why = "borrows the target's head" if head is None and getattr(d.config, "shared_head", False) else \
            "drafts through the target's head"
        raise RequestError(f"this {d.family} drafter {why}: it has no head of its own to factorise; drafters with "
                         f"their own head: {families_phrase(lambda f: f.draft_vocab != 'target')}")
    return head


def check_head_request(d: Drafter, rank: int | None, share: bool) -> None:
    """Every impossible head request as a RequestError (a UsageError for two options that exclude each other),
    before any work (a meta-device drafter works too)."""
    fam, c = get_family(d.family), d.config
    if share and "share_head" not in fam.prunable:
        who = families_phrase(lambda f: "share_head" in f.prunable)
        how = "own their vocabulary: an independent LM whose hidden states are not the target's" \
            if fam.draft_vocab == "own" else "draft through the target's head already"
        raise RequestError(f"--share-head: {d.family} drafters {how}; sharing the target's head rows is for {who}")
    if share and rank is not None:
        raise UsageError("--share-head and --head-rank exclude each other: a shared head stores nothing to factorise")
    if rank is not None and "head_rank" not in fam.prunable:
        raise RequestError(f"--head-rank: {d.family} drafters draft through the target's head and own none; a "
                         f"low-rank head is for {families_phrase(lambda f: 'head_rank' in f.prunable)}")
    if getattr(c, "shared_head", False):
        raise RequestError("this drafter already shares the target's head rows: it has no head of its own to "
                         + ("factorise" if rank is not None else "share again"))
    if getattr(c, "tie_word_embeddings", False) and rank is not None:
        raise RequestError("--head-rank: this lm drafter's lm_head is tied to its embeddings, where it costs no bytes "
                         "of its own; factorising it would add bytes")
    if rank is None:
        return
    if getattr(c, "head_rank", None) is not None:
        raise RequestError(f"this drafter's head is already low rank ({c.head_rank}); prune the dense drafter it came "
                         f"from to another rank")
    h, v = c.hidden_size, getattr(c, "draft_vocab_size", c.vocab_size)
    if not 1 <= rank < h * v / (h + v):
        raise RequestError(f"--head-rank {rank}: a rank-R head stores R x (hidden {h} + vocabulary {v}) parameters, "
                         f"the dense one {h} x {v} = {h * v:,}; it saves bytes for R in 1..{-(-h * v // (h + v)) - 1}")


@torch.no_grad()
def head_input_covariance(d: Drafter, probes: Sequence[Probe]) -> Tensor:
    """E[x xᵀ] [H, H] of the head's inputs over the calibration probes (every chained draft step)."""
    def second_moment(x: Tensor, y: Tensor) -> Tensor:
        flat = x.detach().flatten(0, -2).double()
        return flat.T @ flat

    return _mean_stat(d, probes, {"head": (head_of(d), second_moment)})["head"]


@torch.no_grad()
def factorise_head(d: Drafter, rank: int, cov: Tensor | None = None) -> tuple[Drafter, dict[str, Any]]:
    """`d` with its head replaced by rank-`rank` factors (plain SVD, or whitened by the inputs' `cov`)."""
    w = dense_weight(head_of(d))
    down, up = factorise(w, rank, cov)
    sd = {k: v for k, v in _state(d).items() if k != "lm_head.weight"}
    dev, dt = d.compute_param().device, d.compute_param().dtype
    sd["lm_head.down.weight"], sd["lm_head.up.weight"] = down.to(dev, dt), up.to(dev, dt)
    new = _rebuild(d, dataclasses.replace(d.config, head_rank=rank), sd)
    diff = w - up @ down
    record: dict[str, Any] = {"rank": rank, "init": "svd" if cov is None else "activation",
                              "params_before": w.numel(), "params_after": down.numel() + up.numel(),
                              "weight_rel_error": _r(diff.norm() / w.norm())}
    if cov is not None:  # relative error on the logits the head produced: sqrt(tr(D C Dᵀ) / tr(W C Wᵀ))
        c = cov.float()
        record["output_rel_error"] = _r(((diff @ c) * diff).sum().sqrt() / ((w @ c) * w).sum().sqrt())
    return new, record


@torch.no_grad()
def share_head(d: Drafter) -> tuple[Drafter, dict[str, Any]]:
    """eagle3 `d` without a head: the target's lm_head rows of its draft vocabulary are its logits."""
    w = dense_weight(head_of(d))
    sd = {k: v for k, v in _state(d).items() if not k.startswith("lm_head.")}
    new = _rebuild(d, dataclasses.replace(d.config, shared_head=True), sd)
    record: dict[str, Any] = {"shared": True, "rows": d.config.draft_vocab_size, "params_before": w.numel(),
                              "params_after": 0}
    if d._shared is not None:  # how far the drafter's head was from the target's rows it now reads
        rows = d.shared.lm_head.weight.index_select(0, d.to_target_ids(  # type: ignore[operator]
            torch.arange(d.config.draft_vocab_size, device=d.d2t.device))).float()
        record["weight_rel_diff"] = _r((w.to(rows.device) - rows).norm() / w.norm())
    return new, record


def _r(x: Any) -> float:
    return round(float(x), 6)


__all__ = ["HEAD_INITS", "head_of", "check_head_request", "head_input_covariance", "factorise_head", "share_head"]
