"""Serving facets: how each engine `export hf --for` writes for (engines.py) serves one drafter family.

What an engine does with a family is inherently per family AND per engine (vLLM's method names, SGLang's
--speculative-algorithm and model files, TensorRT-LLM's decoding_type), so it lives on neither side alone:
each family has one module in this package that registers one `ServingFacet` (its `Route` per engine, and the
engine's rule where it has none). The engine files (vllm.py, sglang.py, trtllm.py, rules.py, heads.py) and
export_hf read the facet and never compare family names; adding a family touches only its own files (its
models/ file and its facet module here; a family registered elsewhere calls `register_serving` itself).

    serving_facet("eagle3").routes["vllm"].layout   -> "speculators"
    serving_facet("mtp").no_route["sglang"]         -> SGLang's rule that leaves specpress's mtp out

A family with no facet, or no route and no rule for an engine, gets "<engine> has no route for '<family>'
drafters". The rule texts of a Route follow the engine's label (engine files write "<label> <text>").

This package imports no torch: `specpress export hf --help` lists the routes from it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field

LAYOUTS = ("speculators", "public", "hf")  # speculators' layout, the family's own public one, a plain HF LM
# The built-in facet modules in the order --help lists them; other modules of this package load after, sorted.
LISTED = ("eagle3", "dflash", "eagle", "mtp", "lm")


@dataclass(frozen=True)
class Route:
    """How one engine serves one family.

    layout: what it reads ("speculators" | "public" | "hf"); name: the engine's name for the family (vLLM's
    speculative method, SGLang's --speculative-algorithm, TensorRT-LLM's decoding_type); own_head: the engine's
    rule for the one dense head it builds (a low-rank head has no place in it; export/hf/heads.py);
    no_quant: the engine's rule that refuses a quantized drafter of the family ("" = it loads one; every
    engine asks it first: rules.py unquantized_only); plain_fc (SGLang): the model file whose `fc` is a plain
    torch Linear, so a quantized fc is refused; architectures (SGLang): the config.json architectures it picks
    the model class by (() = the family's own); serve_taps (TensorRT-LLM): the taps go into the serve config
    (eagle3_layers_to_capture), not the checkpoint.
    """

    layout: str
    name: str
    own_head: str = ""
    no_quant: str = ""
    plain_fc: str = ""
    architectures: tuple[str, ...] = ()
    serve_taps: bool = False

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"route {self.name!r}: layout {self.layout!r} must be among {', '.join(LAYOUTS)}")


@dataclass(frozen=True)
class ServingFacet:
    """One family as the serving engines see it.

    routes: engine (--for name) -> its Route; no_route: engine -> the engine's rule that leaves the family out;
    own_head: the rule `--format` alone follows for the family's dense head (vLLM's and TensorRT-LLM's);
    residual_taps: its taps are hidden_states indices the engines capture as the residual ENTERING that layer
    (EAGLE-3), so a tap on the last layer's output has nothing to capture; fused_input_norms: the norms whose
    outputs feed a layer's fused q/k/v, in input order (EAGLE-3's midlayer reads cat(input_layernorm(emb),
    hidden_norm(feature)))."""

    family: str
    routes: Mapping[str, Route] = field(default_factory=dict)
    no_route: Mapping[str, str] = field(default_factory=dict)
    own_head: str = ""
    residual_taps: bool = False
    fused_input_norms: tuple[str, ...] = ("input_layernorm",)

    def __post_init__(self) -> None:
        from specpress.export.hf.engines import ENGINE_NAMES

        both = sorted(set(self.routes) & set(self.no_route))
        unknown = sorted((set(self.routes) | set(self.no_route)) - set(ENGINE_NAMES))
        if both or unknown:
            raise ValueError(f"serving facet {self.family!r}: engines with a route and a rule {both}, unknown engines "
                             f"{unknown} (known: {', '.join(ENGINE_NAMES)})")


_FACETS: dict[str, ServingFacet] = {}
_loaded = False


def register_serving(facet: ServingFacet) -> ServingFacet:
    """Register a family's serving facet; registering a family twice is an error."""
    if facet.family not in LISTED:
        _load_builtins()  # the built-ins first, so the listing order does not depend on who registered first
    if facet.family in _FACETS:
        raise ValueError(f"serving facet {facet.family!r} is already registered")
    _FACETS[facet.family] = facet
    return facet


def unregister_serving(family: str) -> None:
    """Remove a registered facet that is not built in (for tests that register their own family)."""
    if family in LISTED:
        raise ValueError(f"{family!r} is a built-in serving facet and stays registered")
    _FACETS.pop(family, None)


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    found = {m.name for m in pkgutil.iter_modules(__path__)}
    for name in [*(n for n in LISTED if n in found), *sorted(found - set(LISTED))]:
        importlib.import_module(f"{__name__}.{name}")
    _loaded = True


def serving_facets() -> dict[str, ServingFacet]:
    """Every registered facet (family -> facet): the built-ins in LISTED order, then the others as registered."""
    _load_builtins()
    return dict(_FACETS)


def serving_facet(family: str) -> ServingFacet | None:
    """The serving facet of drafter family `family` (None: no engine has a route or a rule for it)."""
    _load_builtins()
    return _FACETS.get(family)


def route(family: str, engine: str) -> Route | None:
    """How `engine` serves `family` (None: it has no route for it)."""
    facet = serving_facet(family)
    return None if facet is None else facet.routes.get(engine)


__all__ = ["LAYOUTS", "Route", "ServingFacet", "register_serving", "route", "serving_facet", "serving_facets",
           "unregister_serving"]
