"""Recovery after quantization: quantization-aware distillation of a quantized drafter against its target.

    recover(drafter, target, sampler, RecoverConfig(steps=300), sources=originals, checkpoint_dir=...)

Every quantized Linear becomes a FakeQuantLinear (fakequant.py: a float master weight through the scheme's
own quantize-dequantize, a straight-through gradient); the drafter is then trained with its family's own
distillation loss and loop (compress/distill.py: the same losses, AdamW, warmup + cosine, checkpoints every
`checkpoint_minutes`, resumable), and each FakeQuantLinear is frozen back into the scheme's module: the
artifact stores codes and scales exactly as any other drafter of that scheme (same export, same serving
encodings). The float tensors the drafter keeps (norms, biases, a draft head kept in full precision) are
trained too. The quantize provenance step gets a `recovery` record (this config, the distill config used,
the steps done, the final loss, the scales mode of each Linear, the seconds).

Cost: a distillation step of the drafter (plus the fake quantization, small beside the target's forward);
on the zoo EAGLE-3 drafter with 2 threads about what `distill` spends per step. It pays where rounding costs
acceptance: int4 and wider lose little to recover; int3, int2 and ternary lose most of it as rounded.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from specpress.compress.data import WindowSampler
from specpress.compress.quantize.fakequant import SCALES, freeze, wrap
from specpress.config import config_kwargs
from specpress.errors import ConfigError, RequestError
from specpress.models.quantized.modules import quantized_modules
from specpress.models.quantized.restore import active_quantize_step
from specpress.models.quantized.scheme import config_from_dict


@dataclass(frozen=True)
class RecoverConfig:
    """Quantization-aware distillation after quantize. Frozen, validated, strict from_dict (version 1).

    steps: optimizer steps (0 = none); lr: AdamW's peak learning rate (warmup then cosine, as distill);
    scales: "learned" (the quantizer's scales trained too, where the scheme has a learned rule) or "rederived"
    (re-quantized by the scheme's own rule every step); batch / seq_len / seed: the training windows.
    """

    version: ClassVar[int] = 1
    steps: int = 0
    lr: float = 1e-4
    scales: str = "learned"
    batch: int = 8
    seq_len: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        for name, lo in (("steps", 0), ("batch", 1), ("seq_len", 2)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ConfigError(f"--recover-{name.replace('_', '-')} must be an integer >= {lo}, found {v!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not self.lr > 0:
            raise ConfigError(f"--recover-lr must be a positive number, found {self.lr!r}")
        if self.scales not in SCALES:
            raise ConfigError(f"--recover-scales {self.scales!r}: choose {' or '.join(SCALES)}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"recovery seed must be an integer, found {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RecoverConfig:
        return cls(**config_kwargs(cls, d, "recover config"))

    def distill_config(self, family: str) -> Any:
        from specpress.compress.config import DistillConfig

        return DistillConfig(family=family, steps=self.steps, lr=self.lr, optimizer="adamw", batch=self.batch,
                             seq_len=self.seq_len, seed=self.seed, eval_batches=1)


def recover(drafter: nn.Module, target: Any, sampler: WindowSampler, config: RecoverConfig, *,
            sources: Mapping[str, Tensor] | None = None, checkpoint_dir: str | Path | None = None,
            resume: bool = False, progress: bool = False,
            on_step: Callable[[int, float, list[float]], None] | None = None) -> nn.Module:
    """The quantized `drafter` after `config.steps` steps of quantization-aware distillation against `target`
    on windows of `sampler` (whose batch / seq_len / seed must be the config's); returns a new drafter (the
    input is left as it was). sources: name -> the float weight each quantized Linear was made from (the
    master weights start there; else at the dequantized weights). checkpoint_dir: where the resumable state
    goes (resume continues from it). on_step(step, loss, acc): called after every optimizer step."""
    from specpress.compress.distill import distill

    step = active_quantize_step(getattr(drafter, "provenance", ()))
    mods = quantized_modules(drafter)
    if step is None or not mods:
        raise RequestError("recovery trains a quantized drafter: quantize it first (quantize --recover-steps N)")
    if config.steps == 0:
        return drafter
    t0 = time.monotonic()
    qconfig = config_from_dict(step["config"])
    provenance = tuple(drafter.provenance)
    dtype = drafter.compute_param().dtype
    work = copy.deepcopy(drafter).float()  # what distill trains; fp32 whatever the drafter's float dtype
    fakes = wrap(work, {n: qconfig for n in mods}, sources, config.scales)
    modes = sorted({f.scales_mode for f in fakes.values()})
    report = distill(target, config.distill_config(drafter.family), sampler, None, init=work, resume=resume,
                     progress=progress, checkpoint_dir=checkpoint_dir, on_step=on_step)
    student = report.drafter
    freeze(student)
    student = student.to(dtype).eval().requires_grad_(False)
    student.provenance = provenance
    from specpress.compress.quantize.api import update_step

    update_step(student, recovery={
        "config": config.to_dict(), "distill": config.distill_config(drafter.family).to_dict(),
        "steps": report.steps, "resumed_from": report.resumed_from, "final_loss": round(report.final_loss, 6),
        "train_agreement": [round(a, 4) for a in report.train_agreement], "scales": modes,
        "sources": "float weights" if sources else "dequantized weights", "seconds": round(time.monotonic() - t0, 1)})
    return student


def source_weights(model: nn.Module, names: list[str]) -> dict[str, Tensor]:
    """name -> a copy of each named Linear's float weight (taken before quantizing, for `recover`)."""
    with torch.no_grad():
        return {n: model.get_submodule(n).weight.detach().float().clone() for n in names}
