"""The base of every quantization config: a frozen, versioned dataclass, validated on construction.

Each scheme file (int.py, fp8.py, bnb.py, …) defines its configs on this base; the scheme registry
(scheme.py) reads them back from provenance by `name` (`config_from_dict`) and builds them from the
CLI's words (`config_for`).

Every config says which modules to touch: `include` names optional modules to quantize too (the draft
`lm_head`), `exclude` names modules to keep in full precision. A name matches a module when it is its
full dotted name or a run of its dotted segments (`q_proj`, `self_attn`, `layers.0.mlp`), or a glob
over the full name (`layers.*.mlp.down_proj`).

`GPTQSettings` holds GPTQ's own fields for the configs whose codes it chooses (integer.GPTQConfig,
lowbit.LowBitGPTQConfig).

`to_dict()` / `from_dict()` round-trip through the artifact's provenance and recipes; unknown keys, a
wrong `name` and a newer `version` are errors that say what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping, Self

from specpress.errors import ConfigError
from specpress.config import config_kwargs


def _names(v: Any, field: str) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [s for s in v.split(",")]
    v = tuple(str(s).strip() for s in (v or ()))
    if any(not s for s in v):
        raise ConfigError(f"quantize config field {field!r} holds an empty module name: {list(v)}")
    return v


@dataclass(frozen=True)
class QuantizeConfig:
    """Base of every quantization config (not used directly)."""

    name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    needs_calibration: ClassVar[bool] = False  # a method that runs the drafter on data (GPTQ, AWQ, …)
    has_pre_quant_scale: ClassVar[bool] = False  # stores a pre_quant_scale [K] per Linear (AWQ, SmoothQuant)

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    kv_cache: str = "none"  # "fp8": the drafter's own KV cache in e4m3 (models/kv.py Fp8KVCache)

    def __post_init__(self) -> None:
        from specpress.models.kv import KV_FORMATS

        object.__setattr__(self, "include", _names(self.include, "include"))
        object.__setattr__(self, "exclude", _names(self.exclude, "exclude"))
        if self.kv_cache not in KV_FORMATS:
            raise ConfigError(f"--kv-cache {self.kv_cache!r}: choose one of {', '.join(KV_FORMATS)}")
        self.validate()

    def validate(self) -> None:
        """Field rules; subclasses extend (call super)."""

    @property
    def scheme(self) -> str:
        """The storage format in the CLI's words: int8, int4, nf4, fp4, fp8."""
        raise NotImplementedError

    @property
    def method(self) -> str:
        """How codes are chosen in the CLI's words: rtn, gptq, bnb."""
        raise NotImplementedError

    @property
    def act_mode(self) -> str:
        """What happens to the activations entering each quantized Linear (activations.py)."""
        return str(getattr(self, "activations", "none"))

    def needs_data(self) -> bool:
        """Whether quantizing needs calibration inputs: a calibrated method, or static activation scales
        found from data (not fixed:V or weights)."""
        from specpress.models.quantized.activations import DEFAULT_CALIBRATION, parse_calibration

        return self.needs_calibration or (self.act_mode == "static" and parse_calibration(
            str(getattr(self, "act_calibration", DEFAULT_CALIBRATION))).kind not in ("fixed", "weights"))

    def label(self) -> str:
        """A short name for tables and sweep point ids (`int4-g64-gptq`), module selection included."""
        s = self.storage_label() + ("-kv8" if self.kv_cache == "fp8" else "")
        if self.include:
            s += "-inc_" + "_".join(self.include)
        if self.exclude:
            s += "-exc_" + "_".join(self.exclude)
        return s

    def storage_label(self) -> str:
        raise NotImplementedError

    def sizing_config(self) -> "QuantizeConfig":
        """A config storing the same bytes without calibration (what a sweep sizes points with)."""
        return self

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "version": self.version}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        d = dict(d)
        name = d.pop("name", cls.name)
        if name != cls.name:
            raise ConfigError(f"config is for quantize method {name!r}, expected {cls.name!r}")
        d = config_kwargs(cls, d, f"quantize config {cls.name!r}")
        return cls(**d)


def positive_int(v: Any, what: str) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConfigError(f"{what} must be a positive integer, found {v!r}")


@dataclass(frozen=True)
class GPTQSettings:
    """GPTQ's settings, mixed into a storage's config (listed before it: `class GPTQConfig(GPTQSettings,
    IntConfig)`, so these fields come after the storage's and `method` / `validate` run first).
    damp: added to the Hessian's diagonal as a fraction of its mean; block_size: columns per lazy-update
    block; sequential: quantize Linears in call order, each calibrated on inputs that already pass through
    the quantized Linears before it (else all from the full-precision model in one pass)."""

    needs_calibration: ClassVar[bool] = True

    damp: float = 0.01
    block_size: int = 128
    sequential: bool = True

    def validate(self) -> None:
        super().validate()  # type: ignore[misc]  # the storage config's rules first
        if not isinstance(self.damp, (int, float)) or isinstance(self.damp, bool) or not 0 < self.damp <= 1:
            raise ConfigError(f"gptq damp must be in (0, 1], found {self.damp!r}")
        positive_int(self.block_size, "gptq block_size")

    @property
    def method(self) -> str:
        return "gptq"
