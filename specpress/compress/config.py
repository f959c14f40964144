"""DistillConfig: what one distillation run does (frozen, versioned, validated, strict from_dict)."""

from __future__ import annotations

import inspect
from dataclasses import InitVar, dataclass
from typing import Any, ClassVar, Mapping

from specpress.errors import ConfigError
from specpress.config import config_kwargs
from specpress.models.drafter import families_phrase, family_names, get_family
from specpress.models.family import DistillOptions, Family

# the family options every version-1 record writes for every family, with the value it reads when the family
# does not take the option (its position in the record is its place among DistillConfig's arguments)
RECORD_OPTIONS: Mapping[str, Any] = {"taps": None, "gamma": None, "markov_rank": None, "tv_weight": 0.0}


@dataclass(frozen=True)
class DistillConfig:
    """What one distillation run does. Frozen, validated on construction, strict from_dict (version 1).

    Student shape (None = from the target): hidden, layers, ffn, heads, kv_heads. draft_vocab (eagle3; default
    min(V, 32000)), ttt_steps (unrolled draft steps: eagle3 3 on CPU (paper 7), eagle 1, mtp = its module count),
    block_size / anchors / mask_token_id (dflash), feature_noise / feature_weight / ce_weight (eagle), step_decay
    (weight of unrolled step i = decay^i), labels ("target" = soft CE to the target's distribution, "data" = CE on
    the data token; mtp, dflash), teacher_weight (weight of the KL to a --from drafter), optimizer ("adamw", or
    "muon": Muon on the 2-D weights inside the drafter's transformer layers, AdamW on the rest). lr / optimizer
    None = the family's default (its descriptor's DistillDefaults: eagle3 2e-3 with muon, others 1e-3 with adamw),
    resolved on construction so to_dict records the value used. bf16: the target's and the student's forwards run
    under bfloat16 autocast (losses, optimizer state and weights stay fp32); None = where the device computes bf16
    natively (specpress.device.native_bf16), resolved on construction like lr. compile: the target's teacher
    forward runs through torch.compile (teacher.py).

    options: the options only its family takes, an instance of the family's DistillDefaults.options class
    (eagle3's Eagle3Options: taps; dflash's DFlashOptions: taps, gamma, markov_rank, tv_weight; each documented
    in its family's module; the others take none). None = built from the flat taps / gamma / markov_rank /
    tv_weight arguments, which stay the way to give them (one the family does not take is a ConfigError naming
    the families that do). config.<name> reads through to config.options (the unset value where the family
    does not take it); to_dict writes them flat, as version 1 always has.
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
    taps: InitVar[tuple[int, ...] | None] = None
    ttt_steps: int | None = None
    block_size: int = 8
    anchors: int = 16
    gamma: InitVar[float | None] = None
    mask_token_id: int | None = None
    markov_rank: InitVar[int | None] = None
    feature_noise: float = 0.1
    feature_weight: float = 1.0
    ce_weight: float = 0.1
    step_decay: float = 0.8
    labels: str = "target"
    tv_weight: InitVar[float | None] = None
    teacher_weight: float = 1.0
    checkpoint_minutes: float = 2.0
    eval_batches: int = 4
    bf16: bool | None = None
    compile: bool = False
    options: DistillOptions | None = None  # None on construction only: resolved to the family's

    def __post_init__(self, taps: Any, gamma: Any, markov_rank: Any, tv_weight: Any) -> None:
        fam = get_family(self.family)  # unknown family -> ConfigError listing the known ones
        flat = {"taps": taps, "gamma": gamma, "markov_rank": markov_rank, "tv_weight": tv_weight}
        object.__setattr__(self, "options", _resolve_options(fam, self.options, flat))
        if self.bf16 is None:
            from specpress.device import native_bf16, pick_device

            object.__setattr__(self, "bf16", native_bf16(pick_device()))
        if self.lr is None:
            object.__setattr__(self, "lr", fam.distill.lr)
        if self.optimizer is None:
            object.__setattr__(self, "optimizer", fam.distill.optimizer)
        if self.steps is None and self.minutes is None:
            raise ConfigError("distill needs a budget: steps and/or minutes")
        for name in ("steps", "batch", "seq_len", "hidden", "layers", "ffn", "heads", "kv_heads", "draft_vocab",
                     "ttt_steps", "block_size", "anchors", "eval_batches"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError(f"distill config field {name!r} must be a positive integer, found {v!r}")
        for name in ("minutes", "lr", "checkpoint_minutes"):
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
        """The version-1 record: every field, the family's options flat among them (RECORD_OPTIONS in their
        places, with their unset value when the family does not take them; any other option of the family's
        after the rest)."""
        opts = self.options
        assert opts is not None  # resolved on construction
        taken = opts.names()
        out: dict[str, Any] = {"version": self.version}
        for name in _RECORD:
            if name in RECORD_OPTIONS:
                out[name] = getattr(opts, name) if name in taken else RECORD_OPTIONS[name]
            else:
                out[name] = getattr(self, name)
        out.update({n: getattr(opts, n) for n in taken if n not in out})
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DistillConfig":
        """A record (to_dict's, or a recipe's flat mapping) read back; its family's options become `options`."""
        kw = config_kwargs(cls, d, "distill config", allowed=record_keys())
        flat = {n: kw.pop(n) for n in list(kw) if n in _option_names()}
        if "family" not in kw:
            raise ConfigError("distill config needs 'family'")
        return cls(**kw, options=_resolve_options(get_family(kw["family"]), None, flat))

    def resume_key(self) -> dict[str, Any]:
        """The fields a checkpoint must share to be resumed (budgets and bookkeeping may change)."""
        d = self.to_dict()
        for k in ("minutes", "checkpoint_minutes", "eval_batches"):
            d.pop(k)
        return d



class _RecordOption:
    """config.<name> for a RECORD_OPTIONS name: read through to config.options (the record's unset value when
    the family does not take it), so a reader of the flat name, or dataclasses.replace, sees the value held."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return None  # the flat argument's default: not given
        return getattr(obj.options, self.name, RECORD_OPTIONS[self.name])


for _name in RECORD_OPTIONS:
    setattr(DistillConfig, _name, _RecordOption(_name))
# the record's keys in order: DistillConfig's arguments (its fields and the flat options), less `options`
_RECORD = tuple(n for n in inspect.signature(DistillConfig).parameters if n != "options")


def _option_names() -> set[str]:
    """Every family option name: the record's own and those of every registered family's options class."""
    return {*RECORD_OPTIONS, *(n for f in family_names() for n in get_family(f).distill.options.names())}


def record_keys() -> tuple[str, ...]:
    """The keys a distill record (or a recipe's drafter.distill block) may hold besides "version"."""
    return (*_RECORD, *sorted(_option_names() - set(_RECORD)))


def _unset(name: str, v: Any) -> bool:
    """Whether option `name` given as `v` means "not set": None, or for a name every version-1 record writes,
    the value it writes for a family that does not take it."""
    if v is None:
        return True
    return name in RECORD_OPTIONS and v == RECORD_OPTIONS[name] and not isinstance(v, bool)


def _resolve_options(fam: Family, options: DistillOptions | None, flat: Mapping[str, Any]) -> DistillOptions:
    """The family's options: `options` as given (its class must be the family's), else its class built from the
    flat values it takes. A flat option that is set and that the family does not take is a ConfigError naming
    the families that take it; set beside `options`, it must agree with them."""
    cls = fam.distill.options
    given = {n: v for n, v in flat.items() if not _unset(n, v)}
    for name in given:
        if not fam.takes(name):
            who = families_phrase(lambda f, name=name: f.takes(name))  # type: ignore[misc]
            raise ConfigError(f"distill config field {name!r} applies to {who} drafters, not {fam.name}")
    if options is None:
        return cls(**{n: v for n, v in flat.items() if n in cls.names() and v is not None})
    if type(options) is not cls:
        raise ConfigError(f"distill config: {fam.name}'s options are {cls.__name__}, found {type(options).__name__}")
    clash = sorted(n for n, v in given.items() if v != getattr(options, n))
    if clash:
        raise ConfigError(f"distill config: {', '.join(clash)} given both flat and in options, with different values; "
                          f"give each once")
    return options
