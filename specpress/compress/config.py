"""DistillConfig: what one distillation run does (frozen, versioned, validated, strict from_dict)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping

from specpress.errors import ConfigError
from specpress.config import config_kwargs
from specpress.models.drafter import as_int_tuple, families_phrase, get_family


@dataclass(frozen=True)
class DistillConfig:
    """What one distillation run does. Frozen, validated on construction, strict from_dict (version 1).

    Student shape (None = from the target): hidden, layers, ffn, heads, kv_heads. Family options: draft_vocab
    (eagle3; default min(V, 32000)), taps (eagle3 / dflash: the target taps fused, HF hidden_states indices, L = the
    final normed hidden; default eagle3 2, L//2, L-3, dflash the published spread), ttt_steps (unrolled draft steps:
    eagle3 3 on CPU (paper 7), eagle 1, mtp = its module count), block_size / anchors / gamma / mask_token_id
    (dflash), markov_rank (dflash: DSpark's sequential Markov head, 0/None = none), feature_noise /
    feature_weight / ce_weight (eagle), step_decay (weight of unrolled step i = decay^i),
    labels ("target" = soft CE to the target's distribution, "data" = CE on the data token; mtp, dflash),
    tv_weight (dflash: per position (1 - w)·CE + w·||p_draft - p_target||_1, DSpark's loss at w = 0.9; 0 = CE only),
    teacher_weight (weight of the KL to a --from drafter), optimizer ("adamw", or "muon": Muon on the 2-D weights
    inside the drafter's transformer layers, AdamW on the rest). lr / optimizer None = the family's default
    (its descriptor's DistillDefaults: eagle3 2e-3 with muon, others 1e-3 with adamw), resolved on construction
    so to_dict records the value used. bf16: the target's and the student's forwards run under bfloat16 autocast (losses, optimizer state
    and weights stay fp32); None = where the device computes bf16 natively (specpress.device.native_bf16), resolved
    on construction like lr. compile: the target's teacher forward runs through torch.compile (teacher.py).
    """

    version: ClassVar[int] = 1

    family: str
    steps: int | None = None
    minutes: float | None = None
    lr: float | None = None
    optimizer: str | None = None
    warmup_ratio: float = 0.04
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float | None = None
    batch: int = 8
    seq_len: int = 128
    seed: int = 0
    hidden: int | None = None
    layers: int | None = None
    ffn: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    draft_vocab: int | None = None
    taps: tuple[int, ...] | None = None
    ttt_steps: int | None = None
    block_size: int = 8
    anchors: int = 16
    gamma: float | None = None
    mask_token_id: int | None = None
    markov_rank: int | None = None
    feature_noise: float = 0.1
    feature_weight: float = 1.0
    ce_weight: float = 0.1
    step_decay: float = 0.8
    labels: str = "target"
    tv_weight: float = 0.0
    teacher_weight: float = 1.0
    checkpoint_minutes: float = 2.0
    eval_batches: int = 4
    bf16: bool | None = None
    compile: bool = False

    def __post_init__(self) -> None:
        fam = get_family(self.family)  # unknown family -> ConfigError listing the known ones
        if self.bf16 is None:
            from specpress.device import native_bf16, pick_device

            object.__setattr__(self, "bf16", native_bf16(pick_device()))
        if self.lr is None:
            object.__setattr__(self, "lr", fam.distill.lr)
        if self.optimizer is None:
            object.__setattr__(self, "optimizer", fam.distill.optimizer)
        if self.taps is not None:
            taps = as_int_tuple(self.taps, "taps")  # a JSON list (resume, provenance) becomes an equal tuple
            if not taps or min(taps) < 0:
                raise ConfigError(f"distill config field 'taps' must be a non-empty list of layer indices >= 0, "
                                  f"found {self.taps!r}")
            object.__setattr__(self, "taps", taps)
        tv = self.tv_weight
        if not isinstance(tv, (int, float)) or isinstance(tv, bool) or not 0 <= tv <= 1:
            raise ConfigError(f"distill config field 'tv_weight' must be a number in [0, 1], found {tv!r}")
        for name in ("taps", "tv_weight", "gamma", "markov_rank"):  # set (taps, markov_rank: given at all)
            v = getattr(self, name)
            if (v is not None if name in ("taps", "markov_rank") else bool(v)) and not fam.takes(name):
                who = families_phrase(lambda f, name=name: f.takes(name))  # type: ignore[misc]
                raise ConfigError(f"distill config field {name!r} applies to {who} drafters, not {self.family}")
        if self.steps is None and self.minutes is None:
            raise ConfigError("distill needs a budget: steps and/or minutes")
        for name in ("steps", "batch", "seq_len", "hidden", "layers", "ffn", "heads", "kv_heads", "draft_vocab",
                     "ttt_steps", "block_size", "anchors", "eval_batches", "markov_rank"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError(f"distill config field {name!r} must be a positive integer, found {v!r}")
        for name in ("minutes", "lr", "gamma", "checkpoint_minutes"):
            v = getattr(self, name)
            if v is None:
                continue
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            if not number or not (v > 0 or (v == 0 and name == "checkpoint_minutes")):  # 0: after every step
                raise ConfigError(f"distill config field {name!r} must be a positive number, found {v!r}")
        for name in ("weight_decay", "grad_clip", "feature_noise", "feature_weight", "ce_weight", "teacher_weight",
                     "warmup_ratio", "min_lr_ratio"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0):
                raise ConfigError(f"distill config field {name!r} must be a number >= 0, found {v!r}")
        if not isinstance(self.step_decay, (int, float)) or not 0 < self.step_decay <= 1:
            raise ConfigError(f"distill config: step_decay must be in (0, 1], found {self.step_decay!r}")
        for name in ("bf16", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"distill config field {name!r} must be true or false, found {getattr(self, name)!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"distill config field 'seed' must be an integer, found {self.seed!r}")
        if self.block_size < 2:
            raise ConfigError(f"distill config: block_size must be >= 2 (anchor + drafts), found {self.block_size}")
        from specpress.optim import OPTIMIZERS

        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"distill config: optimizer must be one of {', '.join(OPTIMIZERS)}, "
                              f"found {self.optimizer!r}")
        if self.labels not in ("target", "data"):
            raise ConfigError(f"distill config: labels must be 'target' or 'data', found {self.labels!r}")
        if not 0 <= self.warmup_ratio < 1 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError("distill config: need 0 <= warmup_ratio < 1 and 0 <= min_lr_ratio <= 1")

    def resolved_ttt_steps(self, drafter: Any = None) -> int:
        """Unrolled draft steps: ttt_steps, else the family's default (eagle3 3, others 1), or for families
        with several draft modules (mtp) one step per module (of `drafter` when given, else --layers)."""
        if self.ttt_steps is not None:
            return self.ttt_steps
        steps = get_family(self.family).distill.ttt_steps
        if steps is None:
            return drafter.draft_modules() if drafter is not None else (self.layers or 1)
        return steps

    def resolved_grad_clip(self) -> float:
        if self.grad_clip is not None:
            return self.grad_clip
        return get_family(self.family).distill.grad_clip

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DistillConfig":
        return cls(**config_kwargs(cls, d, "distill config"))

    def resume_key(self) -> dict[str, Any]:
        """The fields a checkpoint must share to be resumed (budgets and bookkeeping may change)."""
        d = self.to_dict()
        for k in ("minutes", "checkpoint_minutes", "eval_batches"):
            d.pop(k)
        return d

