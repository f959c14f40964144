"""Validation of every exported graph: onnxruntime against the drafter's torch forward on random inputs.

Each graph gets random inputs of its family's shapes (a past of P slots, T new tokens under a random
tree mask, C context positions for DFlash); the torch reference is the module's own forward with a
KVCache preloaded with the same past. Errors per output: max_abs = max |ort - torch|, max_rel =
max_abs / max |torch| (scale-free). Every graph is compared before any verdict, then one typed error
lists each output over tolerance.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from specpress.errors import CheckpointError
from specpress.models.drafter import SharedModules
from specpress.runtime.backends.exported import plugin_mask

P, T, C = 5, 4, 3  # past slots, new tokens, new context positions (dflash)
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2}  # max_rel per output
QUANT_TOLERANCE = 2e-2  # quantized graphs: onnxruntime's kernels accumulate differently from torch's


class ExportValidationError(CheckpointError):
    """An exported graph disagrees with the torch drafter beyond tolerance (nothing was written)."""


def reference_copy(drafter: Any, dtype: str) -> Any:
    """The drafter (and its borrowed target modules) in the export's float type (itself when it is)."""
    want = {"fp32": torch.float32, "fp16": torch.float16}[dtype]
    if drafter.compute_param().dtype == want:
        return drafter
    d = copy.deepcopy(drafter).to(want)
    if drafter._shared is not None and drafter.family != "lm":
        s = drafter.shared
        d._shared = SharedModules(copy.deepcopy(s.embed_tokens).to(want), copy.deepcopy(s.lm_head).to(want),
                                  s.target_config)
    return d


def _tree_mask(gen: torch.Generator, queries: int, past: int, new: int, full: bool) -> Tensor:
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
    """(inputs, torch reference outputs) of graph `graph` of drafter `d` (already in the export dtype)."""
    gen = torch.Generator().manual_seed(seed)
    cfg = d.config
    fdt = d.compute_param().dtype
    V = cfg.vocab_size

    def ids(n: int) -> Tensor:
        return torch.randint(0, V, (1, n), generator=gen)

    def positions(n: int, past: int) -> Tensor:
        return past + torch.randint(0, n, (1, n), generator=gen).sort().values

    if graph == "fuse":
        width = d.fc.weight.shape[1]
        taps = torch.randn(1, C, width, generator=gen).to(fdt)
        ref = d.fc(taps) if d.family == "eagle3" else d.hidden_norm(d.fc(taps))
        return {"taps": taps}, {"features": ref}
    if graph == "markov":
        prev = torch.randint(0, V, (3,), generator=gen)
        return {"prev_ids": prev}, {"bias": d.markov_head(prev)}
    if graph == "block":
        bk = cfg.block_size
        cache = _cache(d, P, P + C + bk, gen, fdt)
        taps = torch.randn(1, C, d.fc.weight.shape[1], generator=gen).to(fdt)
        block = d.make_block(ids(1)[0], bk)
        pos = positions(C + bk, P)
        mask = _tree_mask(gen, bk, P + C, bk, full=True)
        feeds = {"features": d.hidden_norm(d.fc(taps)), "block_ids": block, "positions": pos,
                 **_attn_feeds(form, mask, cache, list(range(cfg.num_hidden_layers)))}
        logits = d(taps, block, cache=cache, positions=pos[0], mask=mask, keep_block=True)
        return feeds, {"logits": logits, **_presents(cache, list(range(cfg.num_hidden_layers)), P + C + bk)}
    mask = _tree_mask(gen, T, P, T, full=False)
    pos = positions(T, P)
    if graph == "lm":
        layers = list(range(cfg.num_hidden_layers))
        cache = _cache(d, P, P + T, gen, fdt)
        feeds = {"ids": ids(T), "positions": pos, **_attn_feeds(form, mask, cache, layers)}
        out = d(feeds["ids"], cache=cache, positions=pos[0], mask=mask)
        return feeds, {"logits": out.logits, **_presents(cache, layers, P + T)}
    # feature steps: eagle / eagle3 "step", mtp "step.{k}"
    k = int(graph.split(".")[1]) if "." in graph else 0
    layers = [k] if d.family == "mtp" else list(range(d.cache_dims()[0]))
    cache = _cache(d, P, P + T, gen, fdt)
    hidden = torch.randn(1, T, cfg.hidden_size, generator=gen).to(fdt)
    feeds = {"hidden": hidden, "ids": ids(T), "positions": pos, **_attn_feeds(form, mask, cache, layers)}
    logits, g = d(hidden, feeds["ids"], cache=cache, positions=pos[0], mask=mask, **d.step_kwargs(k))
    return feeds, {"logits": logits, "hidden_out": g, **_presents(cache, layers, P + T)}


def compare(run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], feeds: dict[str, Tensor],
            ref: dict[str, Tensor]) -> dict[str, dict[str, float]]:
    """{output: {max_abs, max_rel}} of `run` (an onnxruntime call) against the torch reference."""
    got = run({n: t.cpu().numpy() for n, t in feeds.items()})
    out = {}
    for name, r in ref.items():
        a, b = np.asarray(got[name], np.float64), r.detach().double().cpu().numpy()
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


def check(errors: dict[str, dict[str, dict[str, float]]], tolerance: float) -> None:
    """Raise ExportValidationError naming every output over `tolerance` (NaN/inf count as over)."""
    bad = [f"{g}.{o}: max_rel {e['max_rel']:.3g} (max_abs {e['max_abs']:.3g})"
           for g, outs in errors.items() for o, e in outs.items() if not e["max_rel"] <= tolerance]
    if bad:
        raise ExportValidationError(
            f"onnxruntime disagrees with the torch drafter beyond max_rel {tolerance:g}: {'; '.join(bad)}; "
            f"nothing was written. This is a bug in the exporter for this drafter: please report it with "
            f"the drafter's config.json")
