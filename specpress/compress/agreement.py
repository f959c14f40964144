"""The family loss on one batch, and per-position agreement of a drafter with the target.

`agreement` is the low-noise signal reported beside tau: acc[k-1] = the fraction of draft positions k
(chained step k, DFlash block position k, the lm's next token) whose top-1 equals the target's argmax,
teacher-forced on the data's windows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpress.compress.config import DistillConfig
from specpress.compress.data import WindowSampler
from specpress.compress.losses import LossContext, LossOut, get_loss
from specpress.compress.teacher import draft_vocab, needed_taps, target_signals
from specpress.compress.training import step_generator
from specpress.models.drafter import Drafter
from specpress.models.target import TargetModel


# Windows scored at once by `agreement`: the teacher signals and the loss's draft logits of a slice of the batch
# are what it holds (about 135 MB a window at a 32k draft vocabulary and 128 tokens), whatever the batch.
AGREEMENT_ROW_BYTES = 128 * 2 ** 20


def batch_loss(target: TargetModel, drafter: Drafter, ids: Tensor, config: DistillConfig, *, step: int = 0,
               teacher: Drafter | None = None, train: bool = False,
               shard: tuple[int, int] | None = None) -> LossOut:
    """The family loss on windows ids [B, T] (random draws from (config.seed, step)); grads not cleared.
    shard: (first row, global batch) when `ids` are rows of a larger batch (its draws are sliced, not redrawn)."""
    batch = target_signals(target, ids.to(target.lm_head.weight.device), needed_taps(drafter, teacher),
                           draft_vocab(drafter))
    ctx = LossContext(drafter, batch, config, step_generator(config.seed, step), teacher, train, shard)
    return get_loss(drafter.family)(ctx)


def agreement_rows(drafter: Drafter, seq_len: int) -> int:
    """Windows `agreement` scores at once: as many as keep what one window costs it (about 32 bytes per
    draft-vocabulary entry and position, measured at the Llama-3.2-1B shape) under AGREEMENT_ROW_BYTES."""
    vocab = getattr(drafter.config, "draft_vocab_size", None) or drafter.config.vocab_size
    return max(1, AGREEMENT_ROW_BYTES // (32 * vocab * seq_len))


def eval_config(drafter: Drafter, sampler: WindowSampler, ttt_steps: int | None = None) -> DistillConfig:
    """A DistillConfig that scores `drafter` as it drafts: its own block size, `ttt_steps` chained steps."""
    bk = getattr(drafter.config, "block_size", 8)
    return DistillConfig(family=drafter.family, steps=1, batch=sampler.batch, seq_len=sampler.seq_len,
                         seed=sampler.seed, ttt_steps=ttt_steps, block_size=max(2, bk))


@torch.no_grad()
def agreement(target: TargetModel, drafter: Drafter, sampler: WindowSampler, batches: int = 4, *,
              ttt_steps: int | None = None, config: DistillConfig | None = None, first_step: int = 0) -> list[float]:
    """Per-position top-1 agreement with the target's argmax on `batches` windows of `sampler`.

    acc[k-1] = fraction of positions where the drafter's k-th draft (chained step k, DFlash block
    position k, the lm's next token) equals the target's argmax, teacher-forced on the data.
    """
    cfg = config or eval_config(drafter, sampler, ttt_steps)
    was = drafter.training
    drafter.eval()
    hits = counts = None
    try:
        for i in range(batches):
            ids = sampler.batch_at(first_step + i)
            rows = agreement_rows(drafter, ids.shape[1])
            for lo in range(0, ids.shape[0], rows):  # slices of one batch: the same draws, sums of the same counts
                out = batch_loss(target, drafter, ids[lo:lo + rows], cfg, step=first_step + i,
                                 shard=(lo, ids.shape[0]))
                hits = out.hits if hits is None else hits + out.hits
                counts = out.counts if counts is None else counts + out.counts
    finally:
        drafter.train(was)
    assert hits is not None and counts is not None
    return [float(h / max(c, 1.0)) for h, c in zip(hits, counts)]

