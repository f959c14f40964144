"""`distill`: train a drafter of any family against a target, or shrink a large drafter into a small one.

    report = distill(target, DistillConfig(family="eagle3", steps=2000), sampler, out)

The target runs on every batch under no_grad (teacher signals stream, or come memory-mapped from a
disk cache: teacher.py); the student runs the family's inference forward (losses.py documents each
family's alignment). AdamW (0.9, 0.95), or with optimizer "muon" (eagle3's default) Muon on the
layers' matrices and AdamW on the rest; linear warmup then cosine decay, gradient clipping (0.5 for the
EAGLE-style families, 1.0 for DFlash and lm). The target's embeddings / head stay frozen and are never
stored with the drafter.

With `--minutes` the clock starts before a warm-up step (where `compile=True` compiles the teacher's
forward, teacher.py), so the budget covers everything the run spends training.

Checkpoints (student, optimizer, step, clock, RNG) land in `<out>.partial/state.pt` every
`checkpoint_minutes`, on Ctrl-C and at the end; `resume=True` continues from one, refusing one that
was written for a different config, target, data, init or teacher (the error names the field). Batches
and all random draws are functions of (seed, step), so a run is deterministic for its seed and a
resumed run equals an uninterrupted one. The final artifact is written atomically with save_drafter
and the provenance step {"step": "distill", config, data, steps, final_loss, agreement}.

Data parallel: under `torchrun --nproc_per_node N -m specpress.cli distill ...` (WORLD_SIZE > 1) rank r
takes rows r·B/N..(r+1)·B/N of each global batch of B windows (B must be divisible by N), gradients
are averaged over ranks with all_reduce after each backward (what DistributedDataParallel does; done
by hand because the losses call several drafter methods, not only forward), and only rank 0 writes
checkpoints and the artifact. A sharded run equals the single-process run up to float summation order.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import Tensor, nn

from specpress.compress.agreement import agreement, batch_loss
from specpress.compress.config import DistillConfig
from specpress.compress.data import WindowSampler
from specpress.compress.losses import LossContext, LossOut, get_loss, positions_scored
from specpress.compress.progress import TrainProgress
from specpress.compress.students import init_student, student_config
from specpress.compress.teacher import Teacher, needed_taps
from specpress.compress.training import (STATE_FILE, all_reduce_mean, data_fingerprint, from_rank0, load_state,
                                         lr_at, lr_at_progress, module_fingerprint, partial_dir, save_state,
                                         step_generator, world_info)
from specpress.artifacts import check_new
from specpress.errors import DataError, UsageError
from specpress.models.drafter import Drafter, target_fingerprint
from specpress.models.drafter_io import save_drafter
from specpress.models.target import TargetModel
from specpress.optim import build_optimizer
from specpress.runtime.compile import compile_errors

FRESH_WINDOWS = 10_000_019  # first sampler step of the final agreement when there is no held-out data
HELDOUT_FRACTION = 0.05  # of the token stream, when it holds at least 20 windows


@dataclass
class DistillReport:
    out: Path | None
    drafter: Drafter
    steps: int  # optimizer steps done in total (resumed ones included)
    planned_steps: int  # length of the lr schedule
    final_loss: float  # mean training loss of the last <= 20 steps
    train_agreement: list[float]  # acc@k over the last <= 20 training batches
    agreement: list[float]  # acc@k on held-out windows (or fresh training windows, see heldout)
    heldout: bool
    seconds: float
    stopped_by: str  # "steps" | "minutes"
    resumed_from: int
    data: dict[str, Any] = field(default_factory=dict)


def distill(target: TargetModel, config: DistillConfig, data: WindowSampler, out: str | Path | None, *,
            init: Drafter | None = None, teacher_drafter: Drafter | None = None, resume: bool = False,
            progress: bool = False, force: bool = False, heldout: WindowSampler | None = None,
            cache_dir: str | Path | None = None, on_step: Callable[[int, float, list[float]], None] | None = None,
            provenance_extra: Mapping[str, Any] | None = None) -> DistillReport:
    """Train a `config.family` drafter against `target` on windows of `data`; write it to `out`.

    init: start from this drafter (its shape; a copy is trained); teacher_drafter: a (larger) drafter
    of the same family whose output distribution the student also matches (KL, teacher_weight).
    heldout: windows for the final agreement (default: fresh windows of `data`). on_step(step, loss,
    acc): called after every optimizer step. cache_dir: cache the target's signals there (teacher.py).
    out=None trains without writing anything (no checkpoints).
    """

    t0_total = time.monotonic()
    out = Path(out).expanduser() if out is not None else None
    if out is not None:
        check_new(out, force)
    if (data.seq_len, data.batch, data.seed) != (config.seq_len, config.batch, config.seed):
        raise UsageError(f"the sampler draws [{data.batch}, {data.seq_len}] windows with seed {data.seed}, but the "
                         f"config asks for batch {config.batch}, seq_len {config.seq_len}, seed {config.seed}; build "
                         f"it with WindowSampler(stream, config.seq_len, config.batch, config.seed)")
    rank, world = world_info()
    if config.batch % world:
        raise UsageError(f"batch {config.batch} is not divisible by the {world} data-parallel ranks")
    for d, what in ((init, "init drafter"), (teacher_drafter, "--from drafter")):
        if d is not None and d.family != config.family:
            raise UsageError(f"the {what} is a {d.family!r} drafter but --family is {config.family!r}; "
                             f"distillation between families is not supported")
        if d is not None:
            d.attach_target(target)  # dims / vocab checked against the target (CheckpointError)
    dev = target.lm_head.weight.device
    student = init_student(config, target, data.stream, init=init, teacher=teacher_drafter).to(dev)
    if teacher_drafter is not None:
        teacher_drafter.to(dev).eval().requires_grad_(False)
    dfp = data_fingerprint(data.stream)
    key = {"config": config.resume_key(), "student": student.config.to_dict(),
           "target": target_fingerprint(target.config, target), "data": dfp,
           "init": module_fingerprint(init) if init is not None else None,
           "teacher_drafter": module_fingerprint(teacher_drafter) if teacher_drafter is not None else None,
           "world_size": world}

    params = [p for p in student.parameters() if p.requires_grad]
    opt = build_optimizer(student.named_parameters(), config.optimizer, config.lr, config.weight_decay, (0.9, 0.95),
                          fused=True)
    loss_fn = get_loss(config.family)
    n_pos = positions_scored(config, student)
    state_path = partial_dir(out) / STATE_FILE if out is not None else None
    step, seconds, planned = 0, 0.0, config.steps
    recent: list[tuple[float, Tensor, Tensor]] = []
    if resume and state_path is not None and state_path.is_file():
        state = load_state(state_path, key)
        student.load_state_dict(state["student"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        step, seconds, planned = int(state["step"]), float(state["seconds"]), int(state["planned"])
        recent = [(float(l), h, c) for l, h, c in state["recent"]]
    resumed_from = step
    frozen = [p for p in target.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    target.eval()
    rows = config.batch // world
    lo = rank * rows
    teacher = Teacher(target, needed_taps(student, teacher_drafter), cache_dir,
                      {"target": key["target"], "data": dfp, "seed": config.seed, "batch": config.batch,
                       "seq_len": config.seq_len, "bf16": config.bf16, "compile": config.compile},
                      compile=config.compile)

    def one_step(s: int, *, update: bool) -> LossOut:
        ids = data.batch_at(s)[lo:lo + rows].to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=config.bf16):
            with compile_errors(config.compile, "the teacher (the target's forward)"):
                batch = teacher.signals(s, ids, (lo, lo + rows))
            ctx = LossContext(student, batch, config, step_generator(config.seed, s), teacher_drafter, True,
                              (lo, config.batch))
            res = loss_fn(ctx)
        res.loss.backward()
        if update:
            all_reduce_mean([p.grad for p in params if p.grad is not None], world)
            if config.resolved_grad_clip() > 0:
                nn.utils.clip_grad_norm_(params, config.resolved_grad_clip())
            opt.step()
        opt.zero_grad(set_to_none=True)
        return res

    def checkpoint() -> None:
        if state_path is None or rank != 0:
            return
        save_state(state_path, {"student": student.state_dict(), "optimizer": opt.state_dict(), "step": step,
                                "seconds": seconds, "planned": planned, "rng": torch.get_rng_state(),
                                "recent": [[l, h, c] for l, h, c in recent], "key": key})

    student.train()
    stopped_by = "steps"
    consistent = True  # False while an optimizer step is half-booked (weights updated, step not yet)
    try:
        budget_s = config.minutes * 60 if config.minutes is not None else None
        timed = config.steps is None  # --minutes alone: the lr follows the share of the budget used
        if planned is None:  # the progress bar's first estimate: the median of 3 timed passes (no update)
            t_warm = time.monotonic()
            one_step(0, update=False)  # warm-up (and, with compile, the compilation)
            times = []
            for s in (1, 2, 3):
                t1 = time.monotonic()
                one_step(s, update=False)
                times.append(time.monotonic() - t1)
            assert budget_s is not None
            seconds += time.monotonic() - t_warm  # the warm-up and a compile count against the budget
            planned = max(2, int((budget_s - seconds) / max(sorted(times)[1], 1e-6)))
        durations: deque[float] = deque(maxlen=50)  # the last steps' wall times
        with TrainProgress(progress and rank == 0, planned, f"distill {config.family}", n_pos) as bar:
            bar.update(step, recent)
            last_ckpt = time.monotonic()
            while timed or step < planned:
                if budget_s is not None and from_rank0(int(seconds >= budget_s), world, dev):
                    stopped_by = "minutes"
                    break
                t0 = time.monotonic()
                if timed:
                    assert budget_s is not None  # every rank uses rank 0's clock, in millionths of the budget
                    lr = lr_at_progress(from_rank0(int(1e6 * seconds / budget_s), world, dev) / 1e6, config)
                else:
                    lr = lr_at(step, planned, config)
                for g in opt.param_groups:
                    g["lr"] = lr
                consistent = False
                res = one_step(step, update=True)
                stats = torch.cat([res.loss.detach().float().reshape(1).cpu(), res.hits, res.counts]).to(dev)
                all_reduce_mean([stats], world)  # on the device: NCCL reduces only CUDA tensors
                stats = stats.cpu()
                k = res.hits.numel()
                recent = (recent + [(float(stats[0]), stats[1:1 + k], stats[1 + k:])])[-20:]
                step += 1
                consistent = True
                dt = time.monotonic() - t0
                seconds += dt
                durations.append(dt)
                if timed and step % 25 == 0:  # re-estimate the bar's total from the recent steps
                    assert budget_s is not None
                    per_step = max(statistics.median(durations), 1e-6)
                    planned = step + max(0, int((budget_s - seconds) / per_step))
                    bar.set_total(planned)
                bar.update(step, recent)
                if on_step is not None:
                    on_step(step, recent[-1][0], [float(h / max(c, 1)) for h, c in zip(recent[-1][1], recent[-1][2])])
                if config.checkpoint_minutes == 0 or time.monotonic() - last_ckpt >= config.checkpoint_minutes * 60:
                    checkpoint()
                    last_ckpt = time.monotonic()
    except KeyboardInterrupt:
        if consistent:
            checkpoint()  # Ctrl-C loses nothing: the next --resume starts at this step
        raise
    finally:
        for p in frozen:
            p.requires_grad_(True)
    checkpoint()
    if timed:
        planned = step  # the schedule ran to the end of the budget
    student.eval()
    final_loss = sum(r[0] for r in recent) / len(recent) if recent else float("nan")
    h = sum((r[1] for r in recent), torch.zeros(n_pos))
    c = sum((r[2] for r in recent), torch.zeros(n_pos))
    train_acc = [float(a / max(b, 1.0)) for a, b in zip(h, c)]
    acc = agreement(target, student, heldout or data, config.eval_batches, config=_eval_cfg(config, heldout or data),
                    first_step=0 if heldout is not None else FRESH_WINDOWS)
    student.provenance = tuple(student.provenance) + ({
        "step": "distill", "config": config.to_dict(), "data": {**dfp, **dict(provenance_extra or {})},
        "steps": step, "final_loss": final_loss, "agreement": acc, "heldout": heldout is not None,
        "teacher_drafter": key["teacher_drafter"], "init": key["init"]},)
    if out is not None and rank == 0:
        save_drafter(student, out, force=force)
        shutil.rmtree(partial_dir(out), ignore_errors=True)
    return DistillReport(out, student, step, int(planned), final_loss, train_acc, acc, heldout is not None,
                         time.monotonic() - t0_total, stopped_by, resumed_from, dfp)


def _eval_cfg(config: DistillConfig, sampler: WindowSampler) -> DistillConfig:
    """The training config, on the evaluation sampler's windows (no teacher term: teacher=None there)."""
    d = config.to_dict()
    d.pop("version")
    d.update(batch=sampler.batch, seq_len=sampler.seq_len, seed=sampler.seed)
    return DistillConfig(**d)



def split_stream(stream: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(training tokens, held-out tokens): the last 5% are held out when the stream has >= 20 windows."""
    if len(stream) < 20 * (seq_len + 1):
        return stream, None
    n = max(seq_len + 1, int(len(stream) * HELDOUT_FRACTION))
    return stream[:-n], stream[-n:]


def distill_from_dirs(target_dir: str | Path, config: DistillConfig, data_path: str | Path, out: str | Path, *,
                      from_dir: str | Path | None = None, init_dir: str | Path | None = None,
                      resume: bool = False, force: bool = False,
                      cache_dir: str | Path | None = None, progress: bool = False) -> DistillReport:
    """The CLI's path: load the target and its tokenizer, tokenize the data (documents joined by the
    target's EOS; the last 5% held out for the final agreement), load --from / --init drafters, distill."""
    from specpress.compress.data import data_stream
    from specpress.models.drafter_io import load_drafter
    from specpress.models.target import load_target
    from specpress.models.tokenizer import load_tokenizer

    check_new(out, force)  # before any loading or tokenizing
    target = load_target(target_dir)
    stream = data_stream(data_path, load_tokenizer(target_dir), target.config.eos_ids, target.config.vocab_size,
                         target_dir)
    if len(stream) < config.seq_len + 1:
        raise DataError(f"{data_path} holds {len(stream)} tokens, fewer than one window of {config.seq_len + 1}; "
                        f"give more data or a smaller --seq-len")
    train, held = split_stream(stream, config.seq_len)
    sampler = WindowSampler(train, config.seq_len, config.batch, config.seed)
    heldout = WindowSampler(held, config.seq_len, config.batch, config.seed + 1) if held is not None else None
    teacher = load_drafter(from_dir, target) if from_dir is not None else None
    init = load_drafter(init_dir, target) if init_dir is not None else None
    return distill(target, config, sampler, out, init=init, teacher_drafter=teacher, resume=resume, force=force,
                   heldout=heldout, cache_dir=cache_dir, progress=progress,
                   provenance_extra={"source": str(data_path), "heldout_tokens": 0 if held is None else len(held),
                                     "target": str(target_dir), "from": None if from_dir is None else str(from_dir),
                                     "init": None if init_dir is None else str(init_dir)})


__all__ = ["DistillConfig", "DistillReport", "distill", "distill_from_dirs", "agreement", "batch_loss",
           "student_config", "split_stream", "LossContext", "LossOut"]
