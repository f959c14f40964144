"""Serving encodings as facets of the quantization schemes: how one scheme's stored tensors are written in a
serving format (compressed-tensors, ModelOpt's unified checkpoint), or the format's rule that refuses them.

    enc = encoding("compressed-tensors", config)       # the scheme's facet; a ConfigError names the rule
    tensors = enc.encode(stored, config)                # one Linear's stored tensors (modules.py keys) -> the format's
    stored = enc.decode(tensors, config, (n, k), where) # and back, bit for bit where `exact`

Each format registers one `Encoding` per scheme it holds (`register_facet(FORMAT, scheme)`, scheme.py) in its
own file here (ct_encodings.py, modelopt_encodings.py), so that export hf and the reader name no scheme. A
scheme with no facet in a format is refused with the list of what the format holds.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from specpress.errors import CheckpointError, ConfigError

CT, MODELOPT = "compressed-tensors", "modelopt"
MODULES = {CT: "specpress.models.formats.ct_encodings", MODELOPT: "specpress.models.formats.modelopt_encodings"}
LABELS = {CT: "compressed-tensors", MODELOPT: "ModelOpt's unified checkpoint"}


def _no_notes(config: Any, shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    return []


@dataclass(frozen=True)
class Encoding:
    """One scheme's encoding in one serving format.

    holds:  one line, for messages: what of the scheme the format holds ("int4 / int8 weight-only as pack-quantized")
    refuse(config) -> the format's rule this config breaks (a message with the fix), or None when it is written
    spec(config) -> the format's description of it: compressed-tensors' config group (weights,
            input_activations, format); ModelOpt's `quantization` fields (quant_algo, group_size, ...)
    encode(stored, config) -> the format's tensors of one Linear (bias excluded)
    decode(tensors, config, (n, k), where) -> specpress's stored tensors of that Linear
    notes(config, shapes) -> what a server does differently (kernels, casts)
    exact:  decode(encode(x)) == x bit for bit (False where the format stores a scale as its reciprocal)
    """

    format: str
    holds: str
    refuse: Callable[[Any], str | None]
    spec: Callable[[Any], dict[str, Any]]
    encode: Callable[[Mapping[str, Tensor], Any], dict[str, Tensor]]
    decode: Callable[[Mapping[str, Tensor], Any, tuple[int, int], str], dict[str, Tensor]]
    notes: Callable[[Any, Mapping[str, tuple[int, int]]], list[str]] = _no_notes
    exact: bool = True


def encodings(fmt: str) -> dict[str, Encoding]:
    """Scheme name -> its encoding in `fmt`, for every registered scheme that has one."""
    from specpress.models.quantized.scheme import facet, schemes

    importlib.import_module(MODULES[fmt])
    return {s.name: e for s in schemes() if (e := facet(fmt, s)) is not None}


def encoding(fmt: str, config: Any) -> Encoding:
    """The encoding of quantize `config` in `fmt`, or a ConfigError naming the format's rule and the fix."""
    from specpress.models.quantized.scheme import facet, scheme_of

    if fmt not in MODULES:
        raise ConfigError(f"unknown serving format {fmt!r}; known: {', '.join(MODULES)}")
    importlib.import_module(MODULES[fmt])
    enc = facet(fmt, scheme_of(config))
    if enc is None:
        held = "; ".join(e.holds for e in encodings(fmt).values())
        raise ConfigError(f"{LABELS[fmt]} has no encoding for a {config.scheme} ({config.method}) drafter here; it "
                          f"holds {held}. Re-quantize the full-precision drafter with one of those, or export it "
                          f"dequantized")
    why = enc.refuse(config)
    if why:
        raise ConfigError(why)
    if getattr(config, "kv_cache", "none") != "none":
        raise ConfigError(f"{LABELS[fmt]} has no form for the drafter's own {config.kv_cache} KV cache (specpress's "
                          f"has a dynamic scale per token and head; the format's KV-cache schemes store static "
                          f"per-tensor k/v scales): quantize without --kv-cache and give the server its own "
                          f"--kv-cache-dtype")
    return enc


def need(tensors: Mapping[str, Tensor], key: str, where: str, fmt: str) -> Tensor:
    """tensors[key], or a CheckpointError saying which Linear lacks it."""
    t = tensors.get(key)
    if t is None:
        raise CheckpointError(f"{where}: the {fmt} checkpoint stores no {key!r} for this Linear "
                              f"(it has {', '.join(sorted(tensors)) or 'nothing'})")
    return t
