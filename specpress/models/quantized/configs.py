"""Quantization configs: one frozen, versioned dataclass per method, validated on construction.

    IntWeightOnlyConfig(bits=4, group_size=64)      round-to-nearest int8 / int4 (weight-only)
    GPTQConfig(bits=4, group_size=64)               the same storage, codes chosen by GPTQ on calibration inputs
    BnbConfig(quant_type="nf4", blocksize=64)       bitsandbytes nf4 / fp4 (4-bit) or int8 (vectorwise)
    Fp8WeightOnlyConfig()                           float8 e4m3 weights, per-output-channel fp32 scales

Every config also says which modules to touch: `include` names optional modules to quantize too (the
draft `lm_head`), `exclude` names modules to keep in full precision. A name matches a module when it is
its full dotted name or a run of its dotted segments (`q_proj`, `self_attn`, `layers.0.mlp`), or a
glob over the full name (`layers.*.mlp.down_proj`).

`to_dict()` / `config_from_dict()` round-trip through the artifact's provenance; unknown keys, an unknown
`name` and a newer `version` are errors that say what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping, Self

from specpress.errors import ConfigError
from specpress.config import config_kwargs

BNB_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # what bitsandbytes' quantize_4bit accepts

_CONFIGS: dict[str, type["QuantizeConfig"]] = {}


def register_config(cls: type["QuantizeConfig"]) -> type["QuantizeConfig"]:
    """Class decorator: make a config readable back from provenance by its `name` (twice is an error)."""
    if cls.name in _CONFIGS:
        raise ValueError(f"quantize config name {cls.name!r} is already registered by {_CONFIGS[cls.name].__name__}")
    _CONFIGS[cls.name] = cls
    return cls


def config_from_dict(d: Mapping[str, Any]) -> "QuantizeConfig":
    """The config a provenance step recorded; an unknown name lists the known ones."""
    name = d.get("name")
    if name not in _CONFIGS:
        raise ConfigError(f"unknown quantize config {name!r}; known: {', '.join(sorted(_CONFIGS))}")
    return _CONFIGS[str(name)].from_dict(d)


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
    needs_calibration: ClassVar[bool] = False

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "include", _names(self.include, "include"))
        object.__setattr__(self, "exclude", _names(self.exclude, "exclude"))
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


def _positive_int(v: Any, what: str) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConfigError(f"{what} must be a positive integer, found {v!r}")


@register_config
@dataclass(frozen=True)
class IntWeightOnlyConfig(QuantizeConfig):
    """Weight-only integer codes by round-to-nearest. bits 8: per-output-channel by default
    (group_size None); bits 4: groups of `group_size` inputs (default 64). Symmetric (no stored zeros)
    or asymmetric (a zero point per group)."""

    name: ClassVar[str] = "int"

    bits: int = 4
    group_size: int | None = 64
    symmetric: bool = True

    def validate(self) -> None:
        if self.bits not in (4, 8):
            raise ConfigError(f"integer weight-only quantization supports bits 4 or 8, found {self.bits!r}")
        if self.group_size is not None:
            _positive_int(self.group_size, "group_size")
            if self.bits == 4 and self.group_size % 2:
                raise ConfigError(f"int4 group_size must be even (two codes per byte), found {self.group_size}")
        if not isinstance(self.symmetric, bool):
            raise ConfigError(f"symmetric must be true or false, found {self.symmetric!r}")

    @property
    def scheme(self) -> str:
        return f"int{self.bits}"

    @property
    def method(self) -> str:
        return "rtn"


@register_config
@dataclass(frozen=True)
class GPTQConfig(IntWeightOnlyConfig):
    """IntWeightOnlyConfig's storage with codes chosen by GPTQ (Frantar et al. 2022): columns are
    quantized in order and each one's error is spread over the not-yet-quantized columns through the
    Cholesky factor of the inverse Hessian H = 2·XᵀX of the layer's calibration inputs X.
    damp: added to H's diagonal as a fraction of its mean; block_size: columns per lazy-update block;
    sequential: quantize Linears in call order, each calibrated on inputs that already pass through the
    quantized Linears before it (else all from the full-precision model in one pass)."""

    name: ClassVar[str] = "gptq"
    needs_calibration: ClassVar[bool] = True

    damp: float = 0.01
    block_size: int = 128
    sequential: bool = True

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.damp, (int, float)) or isinstance(self.damp, bool) or not 0 < self.damp <= 1:
            raise ConfigError(f"gptq damp must be in (0, 1], found {self.damp!r}")
        _positive_int(self.block_size, "gptq block_size")

    @property
    def method(self) -> str:
        return "gptq"


@register_config
@dataclass(frozen=True)
class BnbConfig(QuantizeConfig):
    """bitsandbytes formats through bitsandbytes' own functions: nf4 / fp4 (quantize_4bit with
    `blocksize` over the row-major weight, no double quantisation) or int8 (int8_vectorwise_quant:
    per-row absmax, LLM.int8()'s weight format; blocksize does not apply)."""

    name: ClassVar[str] = "bnb"

    quant_type: str = "nf4"
    blocksize: int | None = 64

    def validate(self) -> None:
        if self.quant_type not in ("nf4", "fp4", "int8"):
            raise ConfigError(f"bitsandbytes quant_type must be nf4, fp4 or int8, found {self.quant_type!r}")
        if self.quant_type == "int8":
            if self.blocksize is not None:
                raise ConfigError("bitsandbytes int8 is per-row (vectorwise): a group/block size does not apply; "
                                  "drop --group-size")
        elif self.blocksize not in BNB_BLOCKSIZES:
            raise ConfigError(f"bitsandbytes {self.quant_type} blocksize must be one of "
                              f"{', '.join(map(str, BNB_BLOCKSIZES))}, found {self.blocksize!r}")

    @property
    def scheme(self) -> str:
        return self.quant_type

    @property
    def method(self) -> str:
        return "bnb"


@register_config
@dataclass(frozen=True)
class Fp8WeightOnlyConfig(QuantizeConfig):
    """float8 e4m3 weights with a per-output-channel fp32 scale (absmax / 448), round-to-nearest."""

    name: ClassVar[str] = "fp8"

    @property
    def scheme(self) -> str:
        return "fp8"

    @property
    def method(self) -> str:
        return "rtn"


SCHEMES = ("int8", "int4", "nf4", "fp4", "fp8")
METHODS = ("rtn", "gptq", "bnb")


def config_for(scheme: str, method: str | None = None, *, group_size: int | None = None,
               symmetric: bool | None = None, include: tuple[str, ...] = (),
               exclude: tuple[str, ...] = ()) -> QuantizeConfig:
    """The config the CLI's --scheme / --method / --group-size / --(a)symmetric words name.

    Defaults: method rtn for int8 / int4 / fp8 and bnb for nf4 / fp4; group size 64 for the 4-bit
    schemes, per-channel for int8. A combination that does not exist is an error saying what does.
    """
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    if method is None:
        method = "bnb" if scheme in ("nf4", "fp4") else "rtn"
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    sel = dict(include=tuple(include), exclude=tuple(exclude))
    if method == "bnb":
        if scheme not in ("nf4", "fp4", "int8"):
            raise ConfigError(f"--method bnb supports schemes nf4, fp4 and int8, not {scheme}")
        if symmetric is False:
            raise ConfigError(f"bitsandbytes {scheme} has no asymmetric variant; drop --asymmetric")
        default = None if scheme == "int8" else 64
        return BnbConfig(quant_type=scheme, blocksize=default if group_size is None else group_size, **sel)
    if scheme in ("nf4", "fp4"):
        raise ConfigError(f"{scheme} is a bitsandbytes format: use --method bnb (the default for {scheme})")
    if scheme == "fp8":
        if method != "rtn":
            raise ConfigError(f"fp8 supports --method rtn only, not {method}")
        if group_size is not None or symmetric is False:
            raise ConfigError("fp8 uses one scale per output channel: --group-size and --asymmetric do not apply")
        return Fp8WeightOnlyConfig(**sel)
    bits = 8 if scheme == "int8" else 4
    gs = group_size if group_size is not None else (None if bits == 8 else 64)
    cls = GPTQConfig if method == "gptq" else IntWeightOnlyConfig
    return cls(bits=bits, group_size=gs, symmetric=True if symmetric is None else symmetric, **sel)
