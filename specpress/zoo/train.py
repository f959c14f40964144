"""Deterministic, resumable next-token training of the zoo target on a token stream.

The batch of step s is a pure function of (seed, s): every epoch shifts the stream by a seeded offset
and visits its non-overlapping windows in a seeded order, so a resumed run sees the same data as an
uninterrupted one. A checkpoint (model, optimizer, step, clock, RNG) lands in `state_dir` every
`checkpoint_every_s` seconds and at the end, written atomically.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specpress.checkpoint import Periodic, read_state, warmup_cosine
from specpress.checkpoint import save_state as atomic_save
from specpress.errors import CheckpointError, DataError, UsageError
from specpress.interrupts import held_interrupts
from specpress.optim import OPTIMIZERS, Optimizer, build_optimizer

STATE_FILE = "train_state.pt"


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer, schedule and batching of one training run. `max_seconds` caps wall-clock training."""

    steps: int
    batch_size: int
    seq_len: int
    seed: int = 0
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    optimizer: str = "adamw"  # "adamw", or "muon": Muon on the blocks' matrices, AdamW on the rest
    bf16: bool = True
    compile: bool = False
    checkpoint_every_s: float = 120.0
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len"):
            if int(getattr(self, name)) < 1:
                raise UsageError(f"training {name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise UsageError(f"need lr > 0 and 0 <= min_lr_ratio <= 1, got lr={self.lr}, "
                             f"min_lr_ratio={self.min_lr_ratio}")
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"unknown optimizer {self.optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise UsageError(f"max_seconds must be positive, got {self.max_seconds}")

    def resume_key(self) -> dict[str, Any]:
        """Fields that must match for a checkpoint to be resumed (the wall-clock cap may change)."""
        d = asdict(self)
        for k in ("max_seconds", "checkpoint_every_s"):
            d.pop(k)
        return d


@dataclass(frozen=True)
class TrainResult:
    steps: int  # optimizer steps done in total (resumed ones included)
    tokens_seen: int
    train_seconds: float  # wall-clock training time, summed over resumed sessions
    final_loss: float  # mean training loss of the last <= 20 steps
    stopped_by: str  # "steps" | "minutes"
    resumed_from: int  # step the run resumed from (0 = fresh)
    compiled: bool


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to `lr`, then cosine decay to `lr * min_lr_ratio` at `steps`."""
    return warmup_cosine(step, cfg.warmup_steps, cfg.steps, cfg.lr, cfg.min_lr_ratio)


class TokenBatches:
    """Deterministic batches of windows from one token stream.

    batch(step) -> LongTensor [B, T+1] (inputs are [:, :-1], labels [:, 1:]).
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int) -> None:
        self.tokens, self.t, self.b, self.seed = tokens, seq_len, batch_size, seed
        self.n = (len(tokens) - 1 - seq_len) // seq_len  # windows per epoch, for any offset < T
        if self.n < 1:
            raise DataError(f"the training stream has {len(tokens)} tokens; need at least {2 * seq_len + 1} "
                            f"for windows of {seq_len}; use more files or a shorter seq_len")
        self._epoch: tuple[int, int, np.ndarray] | None = None

    def _order(self, epoch: int) -> tuple[int, np.ndarray]:
        if self._epoch is None or self._epoch[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            offset = int(rng.integers(0, self.t))
            self._epoch = (epoch, offset, rng.permutation(self.n))
        return self._epoch[1], self._epoch[2]

    def batch(self, step: int) -> Tensor:
        rows = []
        for g in range(step * self.b, (step + 1) * self.b):
            offset, order = self._order(g // self.n)
            start = offset + int(order[g % self.n]) * self.t
            rows.append(self.tokens[start:start + self.t + 1].astype(np.int64))
        return torch.from_numpy(np.stack(rows))


def init_weights(model: nn.Module, num_layers: int, std: float = 0.02) -> None:
    """Normal(0, std) for linears and embeddings; residual outputs (o_proj, down_proj) scaled by 1/sqrt(2L)."""
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            scale = 1 / math.sqrt(2 * num_layers) if name.endswith(("o_proj", "down_proj")) else 1.0
            nn.init.normal_(module.weight, mean=0.0, std=std * scale)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> Optimizer:
    """AdamW (matrices decay, norms do not), or Muon on the blocks' matrices with AdamW for the rest."""
    return build_optimizer(model.named_parameters(), cfg.optimizer, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))


def lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean next-token cross entropy; logits [B, T, V], labels [B, T]."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def save_state(path: Path, model: nn.Module, opt: Optimizer, *, step: int, tokens_seen: int,
               seconds: float, key: Mapping[str, Any]) -> None:
    """Atomic checkpoint (checkpoint.save_state: temp file, then rename)."""
    atomic_save(path, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                       "tokens_seen": tokens_seen, "seconds": seconds, "rng": torch.get_rng_state(),
                       "key": dict(key)})


ZOO_STATE_FIELDS: dict[str, tuple[type, ...]] = {"model": (dict,), "optimizer": (dict,), "step": (int,),
                                                 "tokens_seen": (int,), "seconds": (int, float), "rng": (Tensor,),
                                                 "key": (dict,)}


def load_state(path: Path) -> dict[str, Any]:
    """The zoo build's checkpoint, readable without running code and holding what a checkpoint holds."""
    return read_state(path, ZOO_STATE_FIELDS, "build again with --no-resume to start over", "training checkpoint")


def train(model: nn.Module, batches: TokenBatches, cfg: TrainConfig, *, state_dir: Path | None = None,
          key: Mapping[str, Any] | None = None,
          on_step: Callable[[int, float, float], None] | None = None) -> TrainResult:
    """Train `model` in place for `cfg.steps` steps (or until `cfg.max_seconds`).

    `state_dir`: where checkpoints go and where a matching one (same `key`, same config) is resumed
    from. `on_step(step, loss, tokens_per_s)` reports progress after every optimizer step.
    """
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    # Compiled CPU kernels accumulate some gradients (the tied embedding's scatter-add) with parallel
    # atomics unless deterministic algorithms are on: two compiled builds then end 0.1 nats apart
    # (measured). warn_only: platforms lacking a deterministic kernel for an op warn instead of failing.
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        return _train(model, batches, cfg, state_dir=state_dir, key=key, on_step=on_step)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def _train(model: nn.Module, batches: TokenBatches, cfg: TrainConfig, *, state_dir: Path | None,
           key: Mapping[str, Any] | None, on_step: Callable[[int, float, float], None] | None) -> TrainResult:
    key = {"train": cfg.resume_key(), **(key or {})}
    opt = make_optimizer(model, cfg)
    step, tokens_seen, seconds = 0, 0, 0.0
    state_path = state_dir / STATE_FILE if state_dir is not None else None
    if state_path is not None and state_path.is_file():
        state = load_state(state_path)
        if state["key"] != key:
            raise CheckpointError(f"{state_path} was written by a different build (config, seed or corpus); "
                                  "build again with --no-resume to start over")
        try:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["rng"])
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
            raise CheckpointError(f"{state_path} does not fit this build's model ({str(exc).splitlines()[0][:160]}); "
                                  "build again with --no-resume to start over") from None
        step, tokens_seen, seconds = int(state["step"]), int(state["tokens_seen"]), float(state["seconds"])
    resumed_from = step
    model.train()
    forward: Callable[[Tensor], Any] = torch.compile(model) if cfg.compile else model
    compiled = cfg.compile
    recent: list[float] = []
    every = Periodic(cfg.checkpoint_every_s)
    stopped_by = "steps"
    consistent = True  # the model and optimizer hold whole steps: a checkpoint now is a true one
    try:
        while step < cfg.steps:
            if cfg.max_seconds is not None and seconds >= cfg.max_seconds:
                stopped_by = "minutes"
                break
            t0 = time.monotonic()
            with held_interrupts():  # Ctrl-C mid-step waits for the step to be booked
                consistent = False
                for group in opt.param_groups:
                    group["lr"] = lr_at(step, cfg)
                batch = batches.batch(step)
                try:
                    loss = _forward_backward(forward, batch, cfg.bf16)
                except Exception as exc:  # torch.compile raises many types; only the first compiled step falls back
                    if not (compiled and step == resumed_from):
                        raise
                    warnings.warn(f"torch.compile failed ({type(exc).__name__}: {exc}); training eagerly instead",
                                  RuntimeWarning, stacklevel=2)
                    opt.zero_grad(set_to_none=True)
                    forward, compiled = model, False
                    loss = _forward_backward(forward, batch, cfg.bf16)
                if cfg.grad_clip > 0:
                    nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                n_tok = batch.shape[0] * (batch.shape[1] - 1)
                tokens_seen += n_tok
                dt = time.monotonic() - t0
                seconds += dt
                consistent = True
            recent = (recent + [loss])[-20:]
            if state_path is not None and every.due():
                save_state(state_path, model, opt, step=step, tokens_seen=tokens_seen, seconds=seconds, key=key)
            if on_step is not None:
                on_step(step, loss, n_tok / max(dt, 1e-9))
    except KeyboardInterrupt:
        if state_path is not None and consistent and step > resumed_from:
            save_state(state_path, model, opt, step=step, tokens_seen=tokens_seen, seconds=seconds, key=key)
        raise  # the next build resumes at this step (zoo/build.py says so)
    if state_path is not None and step > resumed_from:
        save_state(state_path, model, opt, step=step, tokens_seen=tokens_seen, seconds=seconds, key=key)
    model.eval()
    final = sum(recent) / len(recent) if recent else float("nan")
    return TrainResult(steps=step, tokens_seen=tokens_seen, train_seconds=seconds, final_loss=final,
                       stopped_by=stopped_by, resumed_from=resumed_from, compiled=compiled)


def _forward_backward(forward: Callable[[Tensor], Any], batch: Tensor, bf16: bool) -> float:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = forward(batch[:, :-1]).logits
    loss = lm_loss(logits, batch[:, 1:])
    loss.backward()
    return float(loss.detach())


@torch.inference_mode()
def evaluate(model: nn.Module, tokens: np.ndarray, seq_len: int, batch_size: int = 8) -> tuple[float, int]:
    """(mean next-token CE in nats, tokens scored) over non-overlapping windows of `seq_len`, in fp32.

    Every token but the first is predicted exactly once, from the up-to-`seq_len` tokens before it
    within its window; perplexity = exp(mean CE).
    """
    if len(tokens) < 2:
        raise DataError(f"the validation stream has {len(tokens)} tokens; need at least 2")
    model.eval()
    starts = list(range(0, len(tokens) - 1, seq_len))
    total, count = 0.0, 0
    for i in range(0, len(starts), batch_size):
        group = starts[i:i + batch_size]
        windows = [torch.from_numpy(tokens[s:s + seq_len + 1].astype(np.int64)) for s in group]
        full = [w for w in windows if len(w) == seq_len + 1]
        parts = [torch.stack(full)] if full else []
        parts += [w[None] for w in windows if len(w) != seq_len + 1]
        for x in parts:
            logits = model(x[:, :-1]).logits
            total += float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                           reduction="sum"))
            count += x.shape[0] * (x.shape[1] - 1)
    return total / count, count
