"""One ONNX graph per computation a drafter runner call needs, per family, built from the module's weights.

Graph I/O (B = 1; dims: tokens T, past P, total = P + T (+ C for dflash), context C, block Bk, words W):

- every attention graph: positions int64 [1, T] (dflash: [1, C+Bk]); the mask as the attention form
  reads it (standard: mask bool [T, total]; plugin: committed int32 [1] + tree_mask int32 [T, W]);
  past_key.{i} / past_value.{i} [1, Hkv, P, D] in, present_key.{i} / present_value.{i} [1, Hkv, total, D] out.
- eagle  `step`: hidden [1,T,H], ids [1,T] -> logits [1,T,V], hidden_out [1,T,H]
- eagle3 `fuse`: taps [1,T,n*Ht] -> features [1,T,H] (fc); `step`: hidden [1,T,H] (fc output or fed-back
  g), ids -> logits [1,T,Vd], hidden_out [1,T,H]
- mtp    `step.{k}` per module k (its cache layer k as past_key.0): hidden, ids -> logits, hidden_out
- dflash `fuse`: taps [1,C,n*H] -> features [1,C,H] (hidden_norm(fc)); `block`: features [1,C,H],
  block_ids [1,Bk] -> logits [1,Bk,V]; `markov` (with a Markov head): prev_ids [N] -> bias [N,V]
- lm     `lm`: ids [1,T] -> logits [1,T,V]
The target's embeddings and head (eagle, eagle3's embeddings, mtp, dflash) are shared initializers. A drafter's
own head (eagle3, lm) is its Linear or, low rank, its two factor Linears (each float or quantized as stored);
eagle3's shared head is the target's head (the same shared initializer) gathered at the draft vocabulary's
target ids, a drafter-own int64 constant.

`EXPORTS` holds one `ExportFamily` per exportable family: the builder, the role of each graph it emits
(manifest.GraphRole: the runner call and the cache layers, recorded in manifest.json, which is all the backends
read) and the torch computation of its `fuse` graph (for validation). Each family's builder is one module of
this package (eagle.py, eagle3.py, mtp.py, dflash.py, lm.py) that registers it with `register_export`; every
module here is loaded with the package (nothing lists the families), and a family defined elsewhere calls
register_export itself. common.py holds what several families' graphs share (the attention and cache I/O, the
shared embeddings and heads). The other facts export needs come from the family's traits (models/family.py:
draft vocabulary, session kind).

Why these graphs are written here rather than traced from the torch modules by torch.onnx.export(dynamo=True)
(bench/onnx_dynamo.py; BENCHMARKS.md, "Hand-built graphs against torch.onnx"): on the float graphs both give the
same numbers and, since the norms are written in the form onnxruntime fuses, the same onnxruntime speed (dynamo
÷ hand-built 0.96-1.03), and TensorRT for RTX builds both. The tracer cannot do four things these graphs need:
write a tied head without a Transpose of the embedding (onnxruntime folds a second copy at load), write the
target's embedding and head once for every graph of an export, lower a quantized Linear's stored codes
(export/quant/) or emit the TreeAttention plugin node, without a custom translation for each. The parity tests
(onnxruntime against torch, per family and scheme) are what keeps the two copies of each network one network.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from torch import Tensor, nn

from specpress.errors import RequestError
from specpress.export.context import Ctx
from specpress.export.families.common import NewCtx, cache_dims
from specpress.manifest import GraphRole
from specpress.models.drafter import BUILTIN_FAMILIES

# ------------------------------------------------------------------------- the registry of export descriptors

Builder = Callable[[nn.Module, NewCtx], dict[str, Ctx]]
Roles = Callable[[Any], dict[str, GraphRole]]
Fuse = Callable[[Any, Tensor], Tensor]


@dataclass(frozen=True)
class ExportFamily:
    """How one drafter family exports to ONNX.

    build  (drafter, new ctx) -> {graph name: Ctx}: its graphs (I/O in the module docstring)
    roles  drafter -> {graph name: GraphRole}, the same names in the same order: what each graph serves
    fuse   (drafter, taps [1, T, n*Ht]) -> features [1, T, H]: what its `fuse` graph computes, in torch
    """

    build: Builder
    roles: Roles
    fuse: Fuse | None = None


EXPORTS: dict[str, ExportFamily] = {}  # drafter family -> its export descriptor, in registration order


def register_export(name: str, family: ExportFamily) -> ExportFamily:
    """Register drafter family `name`'s export descriptor (beside its graph builder); a name registered twice
    is an error."""
    if name in EXPORTS:
        raise ValueError(f"an ONNX export for drafter family {name!r} is already registered")
    EXPORTS[name] = family
    return family


def unregister_export(name: str) -> None:
    """Remove a registered descriptor that is not built in (for tests that register their own family)."""
    if name in BUILTIN_FAMILIES:
        raise ValueError(f"{name!r} is a built-in drafter family and its export stays registered")
    EXPORTS.pop(name, None)


def export_family(name: str) -> ExportFamily:
    """The export descriptor of drafter family `name`; a family without one is refused, naming those with one."""
    try:
        return EXPORTS[name]
    except KeyError:
        raise RequestError(f"no ONNX export for drafter family {name!r}; exportable: {', '.join(EXPORTS)}") from None


def build_graphs(drafter: Any, new: NewCtx) -> tuple[dict[str, Ctx], dict[str, GraphRole]]:
    """({graph name: its built Ctx}, {graph name: its role}) for `drafter`'s family."""
    fam = export_family(drafter.family)
    ctxs, roles = fam.build(drafter, new), fam.roles(drafter)
    assert list(ctxs) == list(roles), f"{drafter.family}: built graphs {list(ctxs)}, roles of {list(roles)}"
    return ctxs, roles


def graph_role(drafter: Any, graph: str) -> GraphRole:
    """The role of graph `graph` of `drafter`'s export (validation looks it up per call)."""
    return export_family(drafter.family).roles(drafter)[graph]


def _load_family_modules() -> None:
    """Import every family module of this package (each registers its builder): the built-ins in
    BUILTIN_FAMILIES order, then any other, sorted."""
    found = {m.name for m in pkgutil.iter_modules(__path__)} - {"common"}
    for name in [*(n for n in BUILTIN_FAMILIES if n in found), *sorted(found - set(BUILTIN_FAMILIES))]:
        importlib.import_module(f"{__name__}.{name}")


_load_family_modules()

__all__ = ["EXPORTS", "ExportFamily", "build_graphs", "cache_dims", "export_family", "graph_role", "register_export",
           "unregister_export"]
