"""The scheme registry: one `Scheme` descriptor per storage format, found by word, config or module.

    from specpress.models.quantized.scheme import config_for, scheme_of
    cfg = config_for("int4", "gptq", group_size=32)      # the CLI's / recipe's words -> a frozen config
    scheme_of(cfg).restore(cfg, linear, dtype, stored, where)

A scheme file (int.py, fp8.py, bnb.py, …) defines its configs and quantized modules and calls
`register_scheme(Scheme(...))` once. Everything that varies per scheme is on the descriptor, or is a
*facet* registered by the layer that owns it (`register_facet("onnx", "int")(lower)` in
specpress/export/quant/), so that models/ imports nothing above it and no consumer names a scheme.
The torch-free word table (names.py) says which file answers each (word, method) pair; registering a
pair the table gives to another file is an error, as is registering anything twice.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from specpress.errors import ConfigError
from specpress.models.quantized import names as N


@dataclass(frozen=True)
class Words:
    """What a user said (CLI flags or recipe keys) before it is a config; None = the scheme's default."""

    method: str | None = None
    group_size: int | None = None
    symmetric: bool | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    activations: str | None = None
    act_calibration: str | None = None
    kv_cache: str | None = None

    def settings(self, drop: tuple[str, ...] = ()) -> dict[str, Any]:
        """The config fields the user set (None = keep the config's default), module selection included,
        less the fields in `drop` (ones a scheme checked do not apply)."""
        out: dict[str, Any] = {"include": self.include, "exclude": self.exclude}
        for k in ("group_size", "symmetric", "activations", "act_calibration", "kv_cache"):
            if getattr(self, k) is not None and k not in drop:
                out[k] = getattr(self, k)
        return out


def _no_check(model: Any, names: list[str], config: Any) -> None:
    return None


@dataclass(frozen=True)
class Scheme:
    """One storage format: what it stores, how it is chosen, loaded back and checked.

    name:      the file's short name ("int", "fp8", "bnb"): the key facets are registered under
    words:     scheme word -> the methods this scheme answers for it ({"int4": ("rtn", "gptq")})
    configs:   the config classes it defines (readable back from provenance by their `name`)
    modules:   its QuantizedLinear classes
    make_config(word, method, words) -> config: validates the words, raises ConfigError with the fix
    quantize(model, names, config, notes): replaces the named Linears, for its calibration-free
               configs (calibrated methods such as GPTQ register a handler in specpress/compress/quantize)
    restore(config, linear, dtype, stored, where) -> an empty module shaped after `stored`, to load into
    tolerance: max relative error an ONNX export of it may show against torch
    check(model, names, config): refuses layers / platforms it cannot handle, before anything changes
    speed:     how the torch backend computes it (shown by inspect and the tables)
    """

    name: str
    words: Mapping[str, tuple[str, ...]]
    configs: tuple[type, ...]
    modules: tuple[type, ...]
    make_config: Callable[[str, str, Words], Any]
    quantize: Callable[[Any, list[str], Any, list[str]], None]
    restore: Callable[[Any, Any, Any, Mapping[str, Any], str], Any]
    tolerance: float
    check: Callable[[Any, list[str], Any], None] = _no_check
    speed: str = ""


_SCHEMES: dict[str, Scheme] = {}
_BY_PAIR: dict[tuple[str, str], Scheme] = {}
_CONFIG_NAMES: dict[str, type] = {}
_FACETS: dict[tuple[str, str], Any] = {}


def register_scheme(s: Scheme) -> Scheme:
    """Add a scheme; a second registration of a name, pair, config name or module is an error."""
    if s.name in _SCHEMES:
        raise ValueError(f"quantization scheme {s.name!r} is registered twice")
    for word, methods in s.words.items():
        entry = N.BY_WORD.get(word)
        for m in methods:
            owner = None if entry is None else entry.methods.get(m)
            if owner is None:
                raise ValueError(f"scheme {s.name!r} answers --scheme {word} --method {m}, which names.py does not "
                                 f"list: add it there")
            if owner != s.make_config.__module__:
                raise ValueError(f"names.py gives --scheme {word} --method {m} to {owner}, but "
                                 f"{s.make_config.__module__} registers it")
            if (word, m) in _BY_PAIR:
                raise ValueError(f"--scheme {word} --method {m} is answered by {_BY_PAIR[word, m].name!r} and "
                                 f"{s.name!r}")
    for c in s.configs:
        if c.name in _CONFIG_NAMES:
            raise ValueError(f"quantize config name {c.name!r} is registered twice")
    _SCHEMES[s.name] = s
    for word, methods in s.words.items():
        for m in methods:
            _BY_PAIR[word, m] = s
    for c in s.configs:
        _CONFIG_NAMES[c.name] = c
    return s


def load_all() -> dict[str, Scheme]:
    """Import every scheme file names.py lists (each registers itself); name -> scheme."""
    for mod in N.MODULES:
        importlib.import_module(mod)
    return dict(_SCHEMES)


def schemes() -> list[Scheme]:
    """Every registered scheme, in names.py's order (not the order imports happened to register them)."""
    order = {m: i for i, m in enumerate(N.MODULES)}
    return sorted(load_all().values(), key=lambda s: order.get(s.make_config.__module__, len(order)))


def config_class(name: Any) -> type:
    """The config class recorded under `name` in provenance; an unknown name lists the known ones."""
    load_all()
    if name not in _CONFIG_NAMES:
        raise ConfigError(f"unknown quantize config {name!r}; known: {', '.join(sorted(_CONFIG_NAMES))}")
    return _CONFIG_NAMES[name]


def config_from_dict(d: Mapping[str, Any]) -> Any:
    """The config a provenance step (or a recipe) recorded, validated."""
    return config_class(d.get("name")).from_dict(d)


def for_words(word: str, method: str | None = None) -> tuple[Scheme, str]:
    """(the scheme answering --scheme word --method method, the method) — method None: the word's default."""
    entry = N.BY_WORD.get(word)
    if entry is None:
        raise ConfigError(f"unknown scheme {word!r}; choose one of {', '.join(N.SCHEME_WORDS)}")
    method = entry.default_method if method is None else method
    if method not in N.METHOD_WORDS:
        raise ConfigError(f"unknown method {method!r}; choose one of {', '.join(N.METHOD_WORDS)}")
    if method not in entry.methods:
        others = [n.word for n in N.NAMES if method in n.methods]
        raise ConfigError(f"--scheme {word} does not take --method {method}: use --method {' or '.join(entry.methods)}"
                          + (f" (--method {method} goes with --scheme {', '.join(others)})" if others else ""))
    importlib.import_module(entry.methods[method])
    return _BY_PAIR[word, method], method


def config_for(word: str, method: str | None = None, *, group_size: int | None = None,
               symmetric: bool | None = None, include: tuple[str, ...] = (), exclude: tuple[str, ...] = (),
               activations: str | None = None, act_calibration: str | None = None,
               kv_cache: str | None = None) -> Any:
    """The config the CLI's --scheme / --method / --group-size / --(a)symmetric / --activations /
    --act-calibration / --kv-cache words name (None: the scheme's default); a combination that does not
    exist is a ConfigError saying what does, and so is an --act-calibration that finds nothing: only static
    input scales are calibrated, so with weight-only or run-time (dynamic) activations it would be recorded
    and ignored."""
    s, m = for_words(word, method)
    words = Words(method, group_size, symmetric, tuple(include), tuple(exclude), activations, act_calibration,
                  kv_cache)
    config = s.make_config(word, m, words)
    if act_calibration is not None and config.act_mode != "static":
        why = (f"--scheme {word} --method {m} is weight-only" if config.act_mode == "none" else
               f"--activations {config.act_mode} scales the activations at run time" if activations is not None else
               f"--scheme {word} scales its activations at run time by default (--activations {config.act_mode})")
        fix = "drop --act-calibration"
        if activations is None:
            try:
                s.make_config(word, m, replace(words, activations="static"))
                fix += ", or add --activations static to calibrate static input scales"
            except ConfigError:
                pass
        raise ConfigError(f"--act-calibration {act_calibration} finds static input scales, but {why}: nothing "
                          f"would be calibrated; {fix}")
    return config


def scheme_of(config: Any) -> Scheme:
    """The scheme that defines this config's type (or a base of it)."""
    load_all()
    for s in _SCHEMES.values():
        if isinstance(config, s.configs):
            return s
    raise ConfigError(f"no quantization scheme defines {type(config).__name__}")


def scheme_of_module(mod: Any) -> Scheme:
    """The scheme whose quantized module class `mod` is."""
    load_all()
    for s in _SCHEMES.values():
        if isinstance(mod, s.modules):
            return s
    raise ConfigError(f"{type(mod).__name__} is not a registered quantized module")


def register_facet(kind: str, scheme: str) -> Callable[[Any], Any]:
    """Decorator: `obj` is scheme `scheme`'s implementation of facet `kind` ("onnx", …); twice is an error."""

    def deco(obj: Any) -> Any:
        if (kind, scheme) in _FACETS:
            raise ValueError(f"the {kind} facet of scheme {scheme!r} is registered twice")
        _FACETS[kind, scheme] = obj
        return obj

    return deco


def facet(kind: str, scheme: Scheme | str) -> Any:
    """Scheme `scheme`'s `kind` facet, or None when it registered none."""
    return _FACETS.get((kind, scheme if isinstance(scheme, str) else scheme.name))
