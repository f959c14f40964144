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

import dataclasses
import shutil
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import Tensor, nn

from specpress.compress.agreement import agreement, batch_loss
from specpress.compress.calibration import FRESH_WINDOWS
from specpress.compress.config import DistillConfig
from specpress.compress.data import WindowSampler
from specpress.compress.losses import LossContext, LossOut, get_loss, positions_scored
from specpress.compress.progress import TrainProgress
from specpress.compress.students import init_student, student_config
from specpress.compress.teacher import Teacher, draft_vocab, needed_taps
from specpress.compress.training import (START_OVER, STATE_FILE, all_reduce_mean, data_fingerprint, from_rank0,
                                         load_state, lr_at, lr_at_progress, module_fingerprint, partial_dir,
                                         step_generator, world_info)
from specpress.artifacts import check_new
from specpress.checkpoint import Periodic, save_state
from specpress.errors import CheckpointError, RequestError
from specpress.interrupts import held_interrupts
from specpress.models.drafter import Drafter, target_fingerprint
from specpress.models.drafter_io import save_drafter
from specpress.models.target import TargetModel
from specpress.optim import build_optimizer
from specpress.runtime.compile import compile_errors


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
            provenance_extra: Mapping[str, Any] | None = None,
            checkpoint_dir: str | Path | None = None) -> DistillReport:
    """Train a `config.family` drafter against `target` on windows of `data`; write it to `out`.

    init: start from this drafter (its shape; a copy is trained); teacher_drafter: a (larger) drafter
    of the same family whose output distribution the student also matches (KL, teacher_weight).
    heldout: windows for the final agreement (default: fresh windows of `data`). on_step(step, loss,
    acc): called after every optimizer step. cache_dir: cache the target's signals there (teacher.py).
    out=None trains without writing anything: no checkpoints either, unless `checkpoint_dir` names where they
    go (a caller that writes the artifact itself, such as quantize --recover-steps, and removes them after).
    """

    return _Trainer(target, config, data, out, init=init, teacher_drafter=teacher_drafter, resume=resume,
                    force=force, cache_dir=cache_dir, checkpoint_dir=checkpoint_dir).run(progress, heldout, on_step,
                                                                                        provenance_extra)


class _Trainer:
    """One distill run, in the order it runs: `setup` (checks, student, optimizer, resumed state, teacher),
    `warm_up` (the --minutes-alone estimate), `step` (one optimizer step, gradients averaged over ranks),
    `checkpoint` (the `.partial` state), `finish` (agreement, provenance, atomic write). `run` drives them."""

    def __init__(self, target: TargetModel, config: DistillConfig, data: WindowSampler, out: str | Path | None, *,
                 init: Drafter | None, teacher_drafter: Drafter | None, resume: bool, force: bool,
                 cache_dir: str | Path | None, checkpoint_dir: str | Path | None = None) -> None:
        self.t0_total = time.monotonic()
        self.target, self.config, self.data, self.init, self.teacher_drafter = target, config, data, init, teacher_drafter
        self.force = force
        self.out = Path(out).expanduser() if out is not None else None
        if self.out is not None:
            check_new(self.out, force, writes="drafter")
        self.checkpoint_dir = partial_dir(self.out) if self.out is not None else \
            None if checkpoint_dir is None else Path(checkpoint_dir).expanduser()
        self.setup(resume, cache_dir)

    def setup(self, resume: bool, cache_dir: str | Path | None) -> None:
        """Validate, build the student and its optimizer, load a matching checkpoint, freeze the target."""
        config, data, target, init, teacher_drafter = self.config, self.data, self.target, self.init, self.teacher_drafter
        if (data.seq_len, data.batch, data.seed) != (config.seq_len, config.batch, config.seed):
            raise RequestError(f"the sampler draws [{data.batch}, {data.seq_len}] windows with seed {data.seed}, but "
                               f"the config asks for batch {config.batch}, seq_len {config.seq_len}, seed "
                               f"{config.seed}; "
                               f"build it with WindowSampler(stream, config.seq_len, config.batch, config.seed)")
        self.rank, self.world = world_info()
        if config.batch % self.world:
            raise RequestError(f"batch {config.batch} is not divisible by the {self.world} data-parallel ranks")
        for d, what in ((init, "init drafter"), (teacher_drafter, "--from drafter")):
            if d is not None and d.family != config.family:
                raise RequestError(f"the {what} is a {d.family!r} drafter but --family is {config.family!r}; "
                                   f"distillation between families is not supported")
            if d is not None:
                d.attach_target(target)  # dims / vocab checked against the target (CheckpointError)
        self.dev = dev = target.lm_head.weight.device
        self.student = student = init_student(config, target, data.stream, init=init, teacher=teacher_drafter).to(dev)
        if teacher_drafter is not None:
            teacher_drafter.to(dev).eval().requires_grad_(False)
        self.dfp = data_fingerprint(data.stream)
        tq = getattr(target, "target_quant", None)  # a compressed target (compress/quantize/target.py)
        self.key = {"config": config.resume_key(), "student": student.config.to_dict(),
                    "target": target_fingerprint(target.config, target), "data": self.dfp,
                    "target_dtype": str(target.lm_head.weight.dtype).removeprefix("torch."),
                    **({"target_quant": tq.text} if tq is not None else {}),
                    "init": module_fingerprint(init) if init is not None else None,
                    "teacher_drafter": module_fingerprint(teacher_drafter) if teacher_drafter is not None else None,
                    "world_size": self.world}
        self.params = [p for p in student.parameters() if p.requires_grad]
        self.opt = build_optimizer(student.named_parameters(), config.optimizer, config.lr, config.weight_decay,
                                   (0.9, 0.95), fused=True)
        self.loss_fn = get_loss(config.family)
        self.n_pos = positions_scored(config, student)
        self.state_path = self.checkpoint_dir / STATE_FILE if self.checkpoint_dir is not None else None
        self.steps, self.seconds, self.planned = 0, 0.0, config.steps
        self.recent: list[tuple[float, Tensor, Tensor]] = []  # (loss, hits[k], counts[k]) of the last <= 20 steps
        if resume and self.state_path is not None and self.state_path.is_file():
            state = load_state(self.state_path, self.key)
            try:
                student.load_state_dict(state["student"])
                self.opt.load_state_dict(state["optimizer"])
                torch.set_rng_state(state["rng"])
                self.recent = [(float(l), h, c) for l, h, c in state["recent"]]
            except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
                why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
                raise CheckpointError(f"{self.state_path} does not fit this run's student and optimizer ({why}); "
                                      + START_OVER.format(partial=self.state_path.parent)) from None
            self.steps, self.seconds, self.planned = int(state["step"]), float(state["seconds"]), int(state["planned"])
        self.resumed_from = self.steps
        self.frozen = [p for p in target.parameters() if p.requires_grad]
        for p in self.frozen:
            p.requires_grad_(False)
        target.eval()
        self.rows = config.batch // self.world
        self.lo = self.rank * self.rows
        self.teacher = Teacher(target, needed_taps(student, teacher_drafter), cache_dir,
                               {"target": self.key["target"], "data": self.dfp, "seed": config.seed,
                                **({"target_quant": tq.text} if tq is not None else {}),
                                "batch": config.batch, "seq_len": config.seq_len, "bf16": config.bf16,
                                "compile": config.compile},
                               compile=config.compile, vocab=draft_vocab(student))

    def forward_backward(self, s: int, *, update: bool) -> LossOut:
        """Step `s`'s loss on this rank's rows [lo, lo + rows) of the global batch, backpropagated; with
        `update`, gradients averaged over ranks, clipped and applied."""
        config, lo, rows = self.config, self.lo, self.rows
        ids = self.data.batch_at(s)[lo:lo + rows].to(self.dev)
        with torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=config.bf16):
            with compile_errors(config.compile, "the teacher (the target's forward)"):
                batch = self.teacher.signals(s, ids, (lo, lo + rows))
            ctx = LossContext(self.student, batch, config, step_generator(config.seed, s), self.teacher_drafter, True,
                              (lo, config.batch))
            res = self.loss_fn(ctx)
        res.loss.backward()
        if update:
            all_reduce_mean([p.grad for p in self.params if p.grad is not None], self.world)
            if config.resolved_grad_clip() > 0:
                nn.utils.clip_grad_norm_(self.params, config.resolved_grad_clip())
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return res

    def warm_up(self, budget_s: float) -> None:
        """--minutes alone: a warm-up pass (and, with compile, the compilation), then the progress bar's
        first estimate of `planned` from the median of 3 timed passes (no update); all of it counts."""
        t_warm = time.monotonic()
        self.forward_backward(0, update=False)
        times = []
        for s in (1, 2, 3):
            t1 = time.monotonic()
            self.forward_backward(s, update=False)
            times.append(time.monotonic() - t1)
        self.seconds += time.monotonic() - t_warm
        self.planned = max(2, int((budget_s - self.seconds) / max(sorted(times)[1], 1e-6)))

    def step(self, lr: float) -> None:
        """Optimizer step `self.steps` at learning rate `lr`; its rank-averaged (loss, hits, counts) join
        `recent`."""
        for g in self.opt.param_groups:
            g["lr"] = lr
        res = self.forward_backward(self.steps, update=True)
        stats = torch.cat([res.loss.detach().float().reshape(1).cpu(), res.hits, res.counts]).to(self.dev)
        all_reduce_mean([stats], self.world)  # on the device: NCCL reduces only CUDA tensors
        stats = stats.cpu()
        k = res.hits.numel()
        self.recent = (self.recent + [(float(stats[0]), stats[1:1 + k], stats[1 + k:])])[-20:]
        self.steps += 1

    def checkpoint(self) -> None:
        """Rank 0 writes the resumable state to `<out>.partial/state.pt` (nothing when out is None)."""
        if self.state_path is None or self.rank != 0:
            return
        save_state(self.state_path, {"student": self.student.state_dict(), "optimizer": self.opt.state_dict(),
                                     "step": self.steps, "seconds": self.seconds, "planned": self.planned,
                                     "rng": torch.get_rng_state(), "recent": [[l, h, c] for l, h, c in self.recent],
                                     "key": self.key})

    def run(self, progress: bool, heldout: WindowSampler | None,
            on_step: Callable[[int, float, list[float]], None] | None,
            provenance_extra: Mapping[str, Any] | None) -> DistillReport:
        config, world, dev = self.config, self.world, self.dev
        self.student.train()
        stopped_by = "steps"
        consistent = True  # False only when a second Ctrl-C cut a step in half (weights updated, step not yet)
        budget_s = config.minutes * 60 if config.minutes is not None else None
        timed = config.steps is None  # --minutes alone: the lr follows the share of the budget used
        try:
            if self.planned is None:
                assert budget_s is not None
                self.warm_up(budget_s)
            durations: deque[float] = deque(maxlen=50)  # the last steps' wall times
            with TrainProgress(progress and self.rank == 0, self.planned, f"distill {config.family}",
                               self.n_pos) as bar:
                bar.update(self.steps, self.recent)
                every = Periodic(config.checkpoint_minutes * 60)
                while timed or self.steps < self.planned:
                    if budget_s is not None and from_rank0(int(self.seconds >= budget_s), world, dev):
                        stopped_by = "minutes"
                        break
                    t0 = time.monotonic()
                    if timed:
                        assert budget_s is not None  # every rank uses rank 0's clock, in millionths of the budget
                        lr = lr_at_progress(from_rank0(int(1e6 * self.seconds / budget_s), world, dev) / 1e6, config)
                    else:
                        lr = lr_at(self.steps, self.planned, config)
                    with held_interrupts():  # Ctrl-C mid-step waits for the step to be booked
                        consistent = False
                        self.step(lr)
                        consistent = True
                    dt = time.monotonic() - t0
                    self.seconds += dt
                    durations.append(dt)
                    if timed and self.steps % 25 == 0:  # re-estimate the bar's total from the recent steps
                        assert budget_s is not None
                        per_step = max(statistics.median(durations), 1e-6)
                        self.planned = self.steps + max(0, int((budget_s - self.seconds) / per_step))
                        bar.set_total(self.planned)
                    bar.update(self.steps, self.recent)
                    if on_step is not None:
                        loss, hits, counts = self.recent[-1]
                        on_step(self.steps, loss, [float(h / max(c, 1)) for h, c in zip(hits, counts)])
                    if every.due():
                        self.checkpoint()
        except KeyboardInterrupt:
            if consistent:
                self.checkpoint()  # Ctrl-C loses nothing: the next --resume starts at this step
            raise
        finally:
            for p in self.frozen:
                p.requires_grad_(True)
        self.checkpoint()
        if timed:
            self.planned = self.steps  # the schedule ran to the end of the budget
        return self.finish(heldout, stopped_by, provenance_extra)

    def finish(self, heldout: WindowSampler | None, stopped_by: str,
               provenance_extra: Mapping[str, Any] | None) -> DistillReport:
        """Agreement on held-out (or fresh) windows, the provenance step, and rank 0's atomic write."""
        config, student, recent, n_pos = self.config, self.student, self.recent, self.n_pos
        student.eval()
        final_loss = sum(r[0] for r in recent) / len(recent) if recent else float("nan")
        h = sum((r[1] for r in recent), torch.zeros(n_pos))
        c = sum((r[2] for r in recent), torch.zeros(n_pos))
        train_acc = [float(a / max(b, 1.0)) for a, b in zip(h, c)]
        evaluated = heldout or self.data
        acc = agreement(self.target, student, evaluated, config.eval_batches, config=_eval_cfg(config, evaluated),
                        first_step=0 if heldout is not None else FRESH_WINDOWS)
        student.provenance = tuple(student.provenance) + ({
            "step": "distill", "config": config.to_dict(), "data": {**self.dfp, **dict(provenance_extra or {})},
            "steps": self.steps, "final_loss": final_loss, "agreement": acc, "heldout": heldout is not None,
            "teacher_drafter": self.key["teacher_drafter"], "init": self.key["init"]},)
        if self.out is not None and self.rank == 0:
            save_drafter(student, self.out, force=self.force)
            shutil.rmtree(partial_dir(self.out), ignore_errors=True)
        return DistillReport(self.out, student, self.steps, int(self.planned), final_loss, train_acc, acc,
                             heldout is not None, time.monotonic() - self.t0_total, stopped_by, self.resumed_from,
                             self.dfp)


def _eval_cfg(config: DistillConfig, sampler: WindowSampler) -> DistillConfig:
    """The training config, on the evaluation sampler's windows (no teacher term: teacher=None there)."""
    return dataclasses.replace(config, batch=sampler.batch, seq_len=sampler.seq_len, seed=sampler.seed)


def distill_from_dirs(target_dir: str | Path, config: DistillConfig, data_path: str | Path, out: str | Path, *,
                      from_dir: str | Path | None = None, init_dir: str | Path | None = None,
                      resume: bool = False, force: bool = False,
                      cache_dir: str | Path | None = None, progress: bool = False,
                      target_dtype: str = "bf16", target_quant: Any = None,
                      target_quant_data: str | Path | None = None) -> DistillReport:
    """The CLI's path: load the target (once, in `target_dtype`) and its tokenizer, tokenize the data
    (documents joined by the target's EOS; the last 5% held out for the final agreement), load --from /
    --init drafters, distill. target_quant (a TargetQuant): distill against the target compressed so (its
    hidden states and distribution: what a drafter deployed beside that target sees), calibrated, when the
    spec needs data, on target_quant_data or else on the training windows; the step's data records it."""
    from specpress.compress.calibration import load_calibration
    from specpress.models.drafter_io import load_drafter
    from specpress.models.target import load_target

    check_new(out, force, writes="drafter")  # before any loading or tokenizing
    target = load_target(target_dir, dtype=target_dtype)
    cal = load_calibration(target, target_dir, data_path, config.seq_len, config.batch, config.seed)
    sampler, heldout = cal.sampler(), cal.heldout()
    compressed: dict[str, Any] = {}
    if target_quant is not None:
        compressed["target_quant"] = cal.compress_target(target, target_dir, target_quant, target_quant_data)
    teacher = load_drafter(from_dir, target) if from_dir is not None else None
    init = load_drafter(init_dir, target) if init_dir is not None else None
    held = 0 if cal.held is None else len(cal.held)
    return distill(target, config, sampler, out, init=init, teacher_drafter=teacher, resume=resume, force=force,
                   heldout=heldout, cache_dir=cache_dir, progress=progress,
                   provenance_extra={"source": str(data_path), "heldout_tokens": held,
                                     "target": str(target_dir), "from": None if from_dir is None else str(from_dir),
                                     "init": None if init_dir is None else str(init_dir), **compressed})


__all__ = ["DistillConfig", "DistillReport", "distill", "distill_from_dirs", "agreement", "batch_loss",
           "student_config", "LossContext", "LossOut"]
