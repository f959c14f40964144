"""Validation of every exported graph: onnxruntime against the drafter's torch forward on given inputs.

`case` draws random inputs of a graph's shapes (a past of P slots, T new tokens under a random tree mask,
C context positions for DFlash); export/rounds.py records the inputs real drafting rounds feed each graph.
Either way `reference` computes the torch outputs from the same inputs: the module's own forward with a
KVCache preloaded with the fed past. Errors per output: max_abs = max |ort - torch|, max_rel =
max_abs / max |torch| (scale-free). Every graph is compared before any verdict, then one typed error
lists each output over tolerance.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specpress.errors import CheckpointError
from specpress.export.families import export_family, graph_role
from specpress.models.drafter import SharedModules, get_family
from specpress.runtime.backends.exported import plugin_mask
from specpress.runtime.tree import unpack_mask

P, T, C = 5, 4, 3  # past slots, new tokens, new context positions (dflash)
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2}  # max_rel per output


class ExportValidationError(CheckpointError):
    """An exported graph disagrees with the torch drafter beyond tolerance (nothing was written)."""


def reference_copy(drafter: Any, dtype: str) -> Any:
    """The drafter in the export's float type (itself when it is), computing with its borrowed target
    modules in that type too: they are wrapped (CastEmbedding, CastHead), never copied, so a bf16 target
    behind an fp32 export costs no fp32 copy of its embeddings or head."""
    want = {"fp32": torch.float32, "fp16": torch.float16}[dtype]
    d = drafter if drafter.compute_param().dtype == want else converted_copy(drafter, want)
    if drafter._shared is not None and get_family(drafter.family).draft_vocab != "own":  # it borrows them
        s = drafter.shared
        if s.embed_tokens.weight.dtype != want or s.lm_head.weight.dtype != want:
            d = copy.copy(d) if d is drafter else d  # a shallow twin: the caller's drafter keeps its modules
            d._shared = SharedModules(CastEmbedding(s.embed_tokens.weight, want), CastHead(s.lm_head.weight, want),
                                      s.target_config)
    return d


def converted_copy(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """copy.deepcopy(module).to(dtype) without the full-precision copy in between: each floating tensor is
    converted straight into the copy (deepcopy's memo)."""
    memo: dict[int, Any] = {}
    for t in list(module.parameters()) + list(module.buffers()):
        if t.is_floating_point() and id(t) not in memo:
            c = t.detach().to(dtype)
            memo[id(t)] = nn.Parameter(c, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else c
    return copy.deepcopy(module, memo)


class CastEmbedding(nn.Module):
    """The target's embedding table, looked up and cast to `dtype` (the rows asked for, not the table)."""

    def __init__(self, weight: Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.source, self.dtype = weight, dtype

    @property
    def weight(self) -> Tensor:  # what Drafter.embed / head read: the compute dtype (a 0-element stand-in)
        return torch.empty(0, dtype=self.dtype)

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.source).to(self.dtype)


class CastHead(CastEmbedding):
    """The target's head [V, H] applied in `dtype`, HEAD_ROWS rows of it cast at a time (never whole)."""

    def forward(self, x: Tensor) -> Tensor:  # x [..., H] -> [..., V]
        w = self.source
        out = x.new_empty((*x.shape[:-1], w.shape[0]), dtype=self.dtype)
        for r in range(0, w.shape[0], HEAD_ROWS):
            out[..., r:r + HEAD_ROWS] = x.to(self.dtype) @ w[r:r + HEAD_ROWS].to(self.dtype).t()
        return out


HEAD_ROWS = 16384


def random_tree_mask(gen: torch.Generator, queries: int, past: int, new: int, full: bool) -> Tensor:
    if full:
        return torch.ones(queries, past + new, dtype=torch.bool)
    tree = (torch.rand(queries, new, generator=gen) < 0.5).tril(-1) | torch.eye(queries, new, dtype=torch.bool)
    return torch.cat([torch.ones(queries, past, dtype=torch.bool), tree], dim=1)


def _cache(d: Any, past: int, total: int, gen: torch.Generator, fdt: torch.dtype):
    cache = d.new_cache(total)
    cache.k[:, :, :, :past] = torch.randn(cache.k[:, :, :, :past].shape, generator=gen).to(fdt)
    cache.v[:, :, :, :past] = torch.randn(cache.v[:, :, :, :past].shape, generator=gen).to(fdt)
    cache.length = past
    return cache


def _attn_feeds(form: str, mask: Tensor, cache: Any, layers: list[int]) -> dict[str, Tensor]:
    feeds: dict[str, Tensor] = {}
    if form == "standard":
        feeds["mask"] = mask
    else:
        feeds["committed"], feeds["tree_mask"] = plugin_mask(mask)
    for j, layer in enumerate(layers):
        feeds[f"past_key.{j}"] = cache.k[layer, :, :, :cache.length].clone()
        feeds[f"past_value.{j}"] = cache.v[layer, :, :, :cache.length].clone()
    return feeds


def _presents(cache: Any, layers: list[int], total: int) -> dict[str, Tensor]:
    out = {}
    for j, layer in enumerate(layers):
        out[f"present_key.{j}"] = cache.k[layer, :, :, :total]
        out[f"present_value.{j}"] = cache.v[layer, :, :, :total]
    return out


@torch.no_grad()
def case(d: Any, graph: str, form: str, seed: int = 0) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(random inputs, torch reference outputs) of graph `graph` of drafter `d` (already in the export dtype)."""
    gen = torch.Generator().manual_seed(seed)
    cfg = d.config
    fdt = d.compute_param().dtype
    V = cfg.vocab_size

    def ids(n: int) -> Tensor:
        return torch.randint(0, V, (1, n), generator=gen)

    def positions(n: int, past: int) -> Tensor:
        return past + torch.randint(0, n, (1, n), generator=gen).sort().values

    role = graph_role(d, graph)
    if role.call == "fuse":
        taps = torch.randn(1, C, d.fc.weight.shape[1], generator=gen).to(fdt)
        return {"taps": taps}, reference(d, graph, {"taps": taps})
    if role.call == "markov":
        feeds = {"prev_ids": torch.randint(0, V, (3,), generator=gen)}
        return feeds, reference(d, graph, feeds)
    layers = list(role.cache_layers)
    if role.call == "block":
        bk = cfg.block_size
        cache = _cache(d, P, P + C + bk, gen, fdt)
        taps = torch.randn(1, C, d.fc.weight.shape[1], generator=gen).to(fdt)
        mask = random_tree_mask(gen, bk, P + C, bk, full=True)
        feeds = {"features": _fuse(d, taps), "block_ids": d.make_block(ids(1)[0], bk),
                 "positions": positions(C + bk, P), **_attn_feeds(form, mask, cache, layers)}
        return feeds, reference(d, graph, feeds, taps=taps)
    mask = random_tree_mask(gen, T, P, T, full=False)
    pos = positions(T, P)
    cache = _cache(d, P, P + T, gen, fdt)
    feeds = {"ids": ids(T), "positions": pos, **_attn_feeds(form, mask, cache, layers)}
    if role.call == "feature":
        feeds["hidden"] = torch.randn(1, T, cfg.hidden_size, generator=gen).to(fdt)
    return feeds, reference(d, graph, feeds)


def feed_mask(feeds: Mapping[str, Tensor], queries: int, slots: int) -> Tensor:
    """The bool mask [queries, slots] a graph was fed: `mask` (standard form) or committed + tree_mask (plugin)."""
    if "mask" in feeds:
        return feeds["mask"].to(torch.bool)
    c = int(feeds["committed"].reshape(-1)[0])
    mask = torch.ones(queries, slots, dtype=torch.bool)
    mask[:, c:] = unpack_mask(feeds["tree_mask"].cpu(), slots - c)
    return mask


def _fuse(d: Any, taps: Tensor) -> Tensor:
    fuse = export_family(d.family).fuse
    assert fuse is not None, f"{d.family} exports a fuse graph but its ExportFamily has no fuse"
    return fuse(d, taps)


def _module(d: Any, graph: str) -> int:
    """The draft module feature graph `graph` runs: its place among the family's feature graphs."""
    return [n for n, r in export_family(d.family).roles(d).items() if r.call == "feature"].index(graph)


@torch.no_grad()
def reference(d: Any, graph: str, feeds: Mapping[str, Tensor], taps: Tensor | None = None) -> dict[str, Tensor]:
    """The torch drafter's outputs for graph `graph` given its ONNX inputs `feeds` (past K/V preloaded into a
    fresh KVCache). `block` takes the context as features (its fuse applied) but the module fuses
    taps itself: pass the taps [1, C, n*H] those features came from (None when C = 0)."""
    feeds = {n: t.cpu() for n, t in feeds.items()}
    role = graph_role(d, graph)
    if role.call == "fuse":
        return {"features": _fuse(d, feeds["taps"])}
    if role.call == "markov":
        return {"bias": d.markov_head(feeds["prev_ids"])}
    layers = list(role.cache_layers)
    past = feeds["past_key.0"].shape[2]
    new = feeds["positions"].shape[1]
    cache = d.new_cache(past + new)
    for j, layer in enumerate(layers):
        cache.k[layer, :, :, :past] = feeds[f"past_key.{j}"]
        cache.v[layer, :, :, :past] = feeds[f"past_value.{j}"]
    cache.length = past
    queries = feeds["block_ids"].shape[1] if role.call == "block" else new
    mask = feed_mask(feeds, queries, past + new)
    pos = feeds["positions"][0]
    if role.call == "block":
        logits = d(taps, feeds["block_ids"], cache=cache, positions=pos, mask=mask, keep_block=True)
        return {"logits": logits, **_presents(cache, layers, past + new)}
    if role.call == "lm":
        out = d(feeds["ids"], cache=cache, positions=pos, mask=mask)
        return {"logits": out.logits, **_presents(cache, layers, past + new)}
    logits, g = d(feeds["hidden"], feeds["ids"], cache=cache, positions=pos, mask=mask,
                  **d.step_kwargs(_module(d, graph)))
    return {"logits": logits, "hidden_out": g, **_presents(cache, layers, past + new)}


def compare(run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], feeds: dict[str, Tensor],
            ref: dict[str, Tensor]) -> dict[str, dict[str, float]]:
    """{output: {max_abs, max_rel}} of `run` (an onnxruntime call) against the torch reference."""
    return errors_of(run({n: t.cpu().numpy() for n, t in feeds.items()}), ref)


def errors_of(got: Mapping[str, Any], ref: Mapping[str, Tensor]) -> dict[str, dict[str, float]]:
    """{output: {max_abs, max_rel}} of outputs `got` (arrays or tensors) against `ref`; a shape mismatch is
    inf, a NaN/inf where the reference is finite (or the reverse) is NaN - both fail `check`."""
    out = {}
    for name, r in ref.items():
        g = got[name]
        a = g.detach().double().cpu().numpy() if isinstance(g, Tensor) else np.asarray(g, np.float64)
        b = r.detach().double().cpu().numpy()
        if a.shape != b.shape:
            out[name] = {"max_abs": float("inf"), "max_rel": float("inf")}
            continue
        finite = np.isfinite(b)
        if (np.isfinite(a) != finite).any():
            out[name] = {"max_abs": float("nan"), "max_rel": float("nan")}
            continue
        err = float(np.abs(a - b)[finite].max()) if finite.any() else 0.0
        scale = float(np.abs(b[finite]).max()) if finite.any() else 0.0
        out[name] = {"max_abs": err, "max_rel": err / scale if scale > 0 else err}
    return out


def worst(into: dict[str, dict[str, float]], new: Mapping[str, Mapping[str, float]]) -> None:
    """Fold one call's {output: {max_abs, max_rel}} into `into`, keeping the largest (NaN wins: it fails)."""
    for name, e in new.items():
        old = into.setdefault(name, {"max_abs": 0.0, "max_rel": 0.0})
        for k in ("max_abs", "max_rel"):
            if not e[k] <= old[k]:
                old[k] = float(e[k])


def check(errors: Mapping[str, Mapping[str, Mapping[str, float]]], tolerance: float,
          stage: str = "random inputs") -> None:
    """Raise ExportValidationError naming every output over `tolerance` (NaN/inf count as over)."""
    bad = [f"{g}.{o}: max_rel {e['max_rel']:.3g} (max_abs {e['max_abs']:.3g})"
           for g, outs in errors.items() for o, e in outs.items() if not e["max_rel"] <= tolerance]
    if bad:
        raise ExportValidationError(
            f"onnxruntime disagrees with the torch drafter beyond max_rel {tolerance:g} on {stage}: "
            f"{'; '.join(bad)}; nothing was written. This is a bug in the exporter for this drafter: please "
            f"report it with the drafter's config.json")
