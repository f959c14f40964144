"""What every drafter family shares: the config base, the module base, and the family registry.

A family registers under its name its config class, its module class, a reader (public config.json ->
config), a writer (config -> public config.json) and its traits: what the family IS for the code above
models/ (draft session kind, policies, teacher-forced forward, loss, distill defaults, pruning, draft
vocabulary; models/family.py). Module state_dict keys
ARE the family's public checkpoint names (`fc.weight`, `midlayer.*`, `model.layers.{L}.eh_proj.weight`),
so weights need no renaming on the way in or out.

Drafters borrow the target's frozen `embed_tokens` / `lm_head` through `attach_target(target)`; the
references are plain attributes, not submodules, so they are never in the drafter's state_dict, never
moved by `.to()` and never copied by `deepcopy`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Self

import torch
from torch import Tensor, nn

from specpress.errors import CheckpointError, ConfigError, RequestError
from specpress.config import config_kwargs
from specpress.limits import check_dims
from specpress.models.family import REQUIRED_TRAITS, TRAITS, Detection, Family
from specpress.models.io import load_into
from specpress.models.kv import Fp8KVCache, KVCache
from specpress.models.layers import RopeConfig, resolve_mask, resolve_positions
from specpress.models.target import TargetConfig

if TYPE_CHECKING:
    from specpress.models.target import TargetModel

BUILTIN_FAMILIES = ("eagle", "eagle3", "mtp", "dflash", "lm")


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------


def rope_from_dict(d: Mapping[str, Any]) -> RopeConfig:
    allowed = {f.name for f in fields(RopeConfig)}
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ConfigError(f"unknown rope key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    return RopeConfig(**d)


_SCALARS = {"int": int, "float": (int, float), "bool": bool, "str": str}


@dataclass(frozen=True)
class DrafterConfig:
    """Base of every family's config: frozen, versioned, validated on construction, strict from_dict."""

    family: ClassVar[str] = ""
    version: ClassVar[int] = 1

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Type-check scalar fields; subclasses extend (call super) with their own rules."""
        for f in fields(self):
            want = _SCALARS.get(str(f.type))
            v = getattr(self, f.name)
            if want is not None and (not isinstance(v, want) or (want is not bool and isinstance(v, bool))):
                raise ConfigError(f"{self.family} config field {f.name!r} must be {f.type}, found {v!r}")
        check_dims({f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), int)},
                   f"{self.family} config")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"family": self.family, "version": self.version}
        for f in fields(self):
            v = getattr(self, f.name)
            if dataclasses.is_dataclass(v):
                v = dataclasses.asdict(v)  # type: ignore[arg-type]
            elif isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, Mapping):
                v = dict(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        """Inverse of to_dict; an unknown key is an error that names it and the allowed ones."""
        d = dict(d)
        fam = d.pop("family", cls.family)
        if fam != cls.family:
            raise ConfigError(f"config is for family {fam!r}, expected {cls.family!r}")
        d = config_kwargs(cls, d, f"{cls.family} config")
        if isinstance(d.get("rope"), Mapping):
            d["rope"] = rope_from_dict(d["rope"])
        return cls(**d)


@dataclass(frozen=True)
class LlamaDrafterConfig(DrafterConfig):
    """Shape of Llama-style drafter layers (EAGLE, EAGLE-3, MTP, DFlash share these fields).

    vocab_size is the TARGET's vocabulary: the rows of the shared embedding (and the shared head).
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    rope: RopeConfig = field(default_factory=RopeConfig)

    def validate(self) -> None:
        super().validate()
        put = object.__setattr__
        if self.num_key_value_heads is None:
            put(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None and self.num_attention_heads > 0:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                  f"{self.num_attention_heads}; set head_dim explicitly")
            put(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if isinstance(self.rope, Mapping):
            put(self, "rope", rope_from_dict(self.rope))
        if not isinstance(self.rope, RopeConfig):
            raise ConfigError(f"{self.family} config field 'rope' must be a RopeConfig, found {self.rope!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{self.family} config field {name!r} must be a positive integer, found {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:  # type: ignore[operator]
            raise ConfigError(f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                              f"num_key_value_heads {self.num_key_value_heads}")

    def layer_config(self, num_layers: int = 1, *, qk_norm: bool = False) -> TargetConfig:
        """The same layer shape as a TargetConfig, to build TargetAttention / DecoderLayer from it."""
        return TargetConfig(
            architecture="Qwen3ForCausalLM" if qk_norm else "LlamaForCausalLM",
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=num_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope.theta, rope=self.rope, qkv_bias=self.attention_bias, o_bias=self.attention_bias)

    @classmethod
    def llama_fields(cls, cfg: Mapping[str, Any], source: str, *, arch: str = "LlamaForCausalLM") -> dict[str, Any]:
        """The shared fields of a public HF-style config, parsed by TargetConfig.from_hf (one parser)."""
        t = TargetConfig.from_hf({**cfg, "architectures": [arch]}, source=source)
        return dict(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                    num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
                    head_dim=t.head_dim, rms_norm_eps=t.rms_norm_eps, rope=t.rope,
                    max_position_embeddings=t.max_position_embeddings, attention_bias=bool(t.qkv_bias))

    def llama_hf(self, num_layers: int, *, qk_norm: bool = False) -> dict[str, Any]:
        """The shared fields as HF config.json entries (the inverse of llama_fields)."""
        out = self.layer_config(num_layers, qk_norm=qk_norm).to_hf()
        for k in ("bos_token_id", "eos_token_id"):
            out.pop(k, None)
        return out


def as_int_tuple(v: Any, name: str) -> tuple[int, ...] | None:
    if v is None:
        return None
    if isinstance(v, (str, bytes)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise ConfigError(f"config field {name!r} must be a list of integers, found {v!r}")
    return tuple(v)


def taps_option(taps: Any) -> tuple[int, ...] | None:
    """A distill `taps` option checked: None, or a non-empty list of layer indices >= 0 (a JSON list becomes a
    tuple)."""
    checked = as_int_tuple(taps, "taps")
    if checked is not None and (not checked or min(checked) < 0):
        raise ConfigError(f"distill config field 'taps' must be a non-empty list of layer indices >= 0, "
                          f"found {taps!r}")
    return checked


def target_fingerprint(cfg: TargetConfig, model: "TargetModel | None" = None) -> dict[str, Any]:
    """What a drafter records about the target it was built for: dims, a hash of its config and, with
    the model, a hash of its final norm and head weights (tells apart two trainings of one config)."""
    blob = json.dumps(cfg.to_hf(), sort_keys=True, default=str).encode()
    out = {"architecture": cfg.architecture, "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
           "num_hidden_layers": cfg.num_hidden_layers, "config_sha256": hashlib.sha256(blob).hexdigest()[:16]}
    if model is not None:
        # load_target records the digest of the weights as stored, before any --dtype cast: fp16 re-rounded
        # to bf16 differs from the stored weights rounded to bf16, which refused the right target
        out["weights_sha256"] = getattr(model, "stored_weights_sha256", None) or head_digest(
            model.model.norm.weight, model.lm_head.weight)
    return out


def head_digest(norm: Tensor, head: Tensor) -> str:
    """Hash of a target's final norm and head weights, rounded to bf16 (fp32 and bf16 copies agree)."""
    h = hashlib.sha256()
    for t in (norm, head):
        h.update(t.detach().to(torch.bfloat16).float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# Module base
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SharedModules:
    """The target's frozen modules a drafter borrows (never copied, never stored by the drafter)."""

    embed_tokens: nn.Module
    lm_head: nn.Module
    target_config: TargetConfig

    def __deepcopy__(self, memo: dict) -> "SharedModules":
        return self


class Drafter(nn.Module):
    """Base of every drafter module. Subclasses set `family`, build from (config), implement forward."""

    family: ClassVar[str] = ""
    config: Any
    # Metadata carried from load to save: the ordered compression steps, and the target it was built for.
    provenance: tuple[dict[str, Any], ...] = ()
    kv_cache_format: str = "none"  # "fp8": new_cache rounds every K/V to e4m3 (the quantize step records it)
    target_fingerprint: dict[str, Any] | None = None
    fingerprint_mismatch: list[str] = []  # set by load_drafter(path, target): fields that differ
    _shared: SharedModules | None = None

    # -- target -----------------------------------------------------------------------------------

    def check_target(self, target: TargetConfig) -> None:
        """Raise CheckpointError when this drafter cannot run against `target` (dims, vocab, layers)."""
        raise NotImplementedError

    def attach_target(self, target: "TargetModel") -> Self:
        """Check dims against `target` and borrow its embed_tokens / lm_head (returns self)."""
        self.check_target(target.config)
        self._shared = SharedModules(target.model.embed_tokens, target.lm_head, target.config)
        self.target_fingerprint = target_fingerprint(target.config, target)
        return self

    @property
    def shared(self) -> SharedModules:
        if self._shared is None:
            raise RequestError(f"this {self.family} drafter borrows the target's embeddings/head: call "
                               f"drafter.attach_target(target) (or load_drafter(path, target=...)) first")
        return self._shared

    def _mismatch(self, what: str, mine: Any, theirs: Any) -> None:
        if mine != theirs:
            raise CheckpointError(
                f"{self.family} drafter does not fit this target: drafter {what} = {mine}, target {what} = "
                f"{theirs}; load the drafter that was trained for this target (or rebuild it with distill)")

    @property
    def taps(self) -> tuple[int, ...]:
        """Target tap indices (HF hidden_states indexing) this drafter reads; () = final hidden only."""
        return ()

    def draft_modules(self) -> int:
        """How many draft modules its chained steps cycle through (step i runs module i % this); 1 = one."""
        return 1

    def step_kwargs(self, step: int) -> dict[str, Any]:
        """Extra forward arguments of chained step `step` ({} unless the family has several draft modules)."""
        return {}

    def fuse_taps(self, taps: Mapping[int, Tensor]) -> Tensor:
        """TargetOutput.taps -> [B, T, len(self.taps) * H_t], concatenated in self.taps order."""
        missing = [i for i in self.taps if i not in taps]
        if missing:
            raise RequestError(f"target taps {missing} were not computed; run the target with taps=drafter.taps")
        return torch.cat([taps[i] for i in self.taps], dim=-1)

    def embed(self, ids: Tensor) -> Tensor:
        """ids [B, T] -> the target's embeddings [B, T, H] in the drafter's compute dtype."""
        return self.shared.embed_tokens(ids).to(self.compute_param().dtype)

    def head(self, x: Tensor) -> Tensor:
        """x [B, T, H] -> logits [B, T, V] through the target's lm_head (in the head's dtype)."""
        head = self.shared.lm_head
        return head(x.to(head.weight.dtype))

    # -- caches -----------------------------------------------------------------------------------

    def step_inputs(self, cache: KVCache | None, b: int, t: int, positions: Tensor | None, mask: Tensor | None,
                    device: torch.device, *, causal: bool = True) -> tuple[int, Tensor, Tensor | None]:
        """Check room in `cache`; return (past length, positions [B, T], mask [B|1, 1, T, past+T] | None)."""
        past = cache.reserve(t) if cache is not None else 0
        return past, resolve_positions(positions, b, t, past, device), resolve_mask(mask, t, past, device,
                                                                                   causal=causal)

    def cache_dims(self) -> tuple[int, int, int]:
        """(attention layers, kv heads, head dim) of this drafter's KV cache."""
        raise NotImplementedError

    def new_cache(self, max_len: int, batch: int = 1) -> KVCache:
        """A preallocated KVCache for `max_len` tokens on this drafter's device and dtype."""
        layers, kv, d = self.cache_dims()
        w = self.compute_param()
        cls = Fp8KVCache if self.kv_cache_format == "fp8" else KVCache
        return cls(layers, batch, kv, max_len, d, w.dtype, w.device)

    def compute_param(self) -> Tensor:
        """A floating-point parameter whose dtype/device are the drafter's compute dtype/device."""
        for p in self.parameters():
            if p.is_floating_point():
                return p
        raise RequestError(f"{self.family} drafter has no floating-point parameters")

    # -- checkpoint names -------------------------------------------------------------------------

    def shared_keys(self) -> dict[str, str]:
        """Public key -> target state_dict key of tensors shared with the target: optional in a
        checkpoint (dropped on load), written only when asked (save_drafter(include_shared=True))."""
        return {}

    def public_state_dict(self) -> dict[str, Tensor]:
        """The tensors this drafter stores itself, under the family's public names."""
        return dict(self.state_dict())

    def shared_head_params(self) -> int:
        """Parameters of the target's head it reads IN PLACE OF a head of its own (eagle3 shared_head: the draft
        vocabulary's rows): not stored, counted as shared bytes. 0 for a drafter with its own head, and for the
        families that always draft through the target's head (nothing of theirs was replaced)."""
        return 0

    def load_public(self, weights: Mapping[str, Tensor], source: str) -> None:
        """Copy public-named tensors in (names and shapes checked); shared keys must be removed first."""
        load_into(self, weights, source)


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------


_FAMILIES: dict[str, Family] = {}


def register_family(name: str, config_cls: type[DrafterConfig], model_cls: type[Drafter],
                    reader: Callable[[Mapping[str, Any], str], DrafterConfig],
                    writer: Callable[[Any], dict[str, Any]], **traits: Any) -> Family:
    """Register a drafter family with its traits (models/family.py); registering a name twice, a missing or an
    unknown trait, or a config/module class of another family is an error."""
    if name in _FAMILIES:
        raise ValueError(f"drafter family {name!r} is already registered (by {_FAMILIES[name].model_cls.__module__})")
    if config_cls.family != name or model_cls.family != name:
        raise ValueError(f"family {name!r}: config_cls.family={config_cls.family!r}, "
                         f"model_cls.family={model_cls.family!r}; they must agree")
    missing = [t for t in REQUIRED_TRAITS if t not in traits]
    unknown = sorted(set(traits) - set(TRAITS))
    if missing or unknown:
        raise ValueError(f"family {name!r}: missing trait(s) {missing}, unknown trait(s) {unknown}; "
                         f"a family declares {', '.join(TRAITS)} (models/family.py)")
    fam = Family(name, config_cls, model_cls, reader, writer, **traits)
    if fam.detection is not None:  # detect_family asks families in priority order: it must be total
        taken = [f.name for f in _FAMILIES.values() if f.detection and f.detection.priority == fam.detection.priority]
        if taken:
            raise ValueError(f"family {name!r}: detection priority {fam.detection.priority} is {taken[0]}'s; "
                             f"give it one of its own (the families are asked in priority order)")
    _FAMILIES[name] = fam
    return fam


def unregister_family(name: str) -> None:
    """Remove a registered family that is not built in (for tests that register their own)."""
    if name in BUILTIN_FAMILIES:
        raise ValueError(f"{name!r} is a built-in drafter family and stays registered")
    _FAMILIES.pop(name, None)


def _load_builtins() -> None:
    import importlib

    for name in BUILTIN_FAMILIES:
        importlib.import_module(f"specpress.models.{name}")


def family_names() -> list[str]:
    _load_builtins()
    return sorted(_FAMILIES)


def families_where(test: Callable[[Family], bool]) -> list[str]:
    """Names of the families for which test(family) holds: built-ins in their usual order, then the others."""
    _load_builtins()
    order = [*BUILTIN_FAMILIES, *sorted(set(_FAMILIES) - set(BUILTIN_FAMILIES))]
    return [n for n in order if n in _FAMILIES and test(_FAMILIES[n])]


def families_phrase(test: Callable[[Family], bool]) -> str:
    """families_where(test) in words, for messages: "eagle3 and dflash", "eagle, dflash and lm"."""
    names = families_where(test)
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def detection_rules() -> list[tuple[str, Detection]]:
    """(family name, its detection rule) of each family that has one, in the order detect_family asks them:
    lowest priority first."""
    _load_builtins()
    rules = [(f.name, f.detection) for f in _FAMILIES.values() if f.detection is not None]
    return sorted(rules, key=lambda rule: rule[1].priority)


def get_family(name: str) -> Family:
    """The registered family `name`; an unknown name lists the known ones."""
    _load_builtins()
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ConfigError(f"unknown drafter family {name!r}; known families: {', '.join(sorted(_FAMILIES))}") from None


def build_drafter(config: DrafterConfig, target: "TargetModel | None" = None) -> Drafter:
    """A freshly initialised drafter for `config` (attached to `target` when given)."""
    model = get_family(config.family).model_cls(config)  # type: ignore[call-arg]
    return model.attach_target(target) if target is not None else model
