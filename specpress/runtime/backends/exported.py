"""Backend-neutral runners over an `export onnx` directory (onnxruntime's sessions, TensorRT's engines).

`ExportedRunner` drives the exported graphs named by manifest.json: it builds each graph's inputs
(positions, the mask in the export's attention form, past K/V from its KVCache), calls the graph through
a `GraphCall` (the only backend-specific piece: an onnxruntime InferenceSession, a TensorRT
EngineSession), and writes the new K/V slots back. Which graph serves which call, and which cache layers
it holds, it reads from each graph's role in the manifest, never from the family's name; so does
`build_runner`, which picks the runner of the calls the graphs serve: `ExportedFeatureRunner` (a
`feature` graph), `ExportedTokenRunner` (`lm`) or `ExportedBlockRunner` (`block`). Its cache is a
`models.kv.KVCache`, so crop / compact behave exactly like the torch backend's. No torch module of the
drafter is needed.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from specpress.errors import CheckpointError, RequestError
from specpress.manifest import ExportManifest, GraphSpec, manifest_from_dict
from specpress.models.kv import KVCache
from specpress.models.layers import causal_mask
from specpress.runtime.tree import pack_mask

# feeds {input name: tensor} -> {output name: tensor}; tensors on the runner's device
GraphCall = Callable[[Mapping[str, Tensor]], dict[str, Tensor]]
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


class SessionCall:
    """A session with `run(output_names, feeds) -> [outputs]` (an onnxruntime InferenceSession, a TensorRT
    EngineSession) as a GraphCall: torch tensors in (numpy when `numpy_io`), torch tensors on `device` out."""

    def __init__(self, session: Any, outputs: Sequence[str], device: torch.device, numpy_io: bool = False,
                 label: str = "the exported graph") -> None:
        self.session, self.outputs, self.device, self.numpy_io = session, list(outputs), device, numpy_io
        self.label = label

    def __call__(self, feeds: Mapping[str, Tensor]) -> dict[str, Tensor]:
        if self.numpy_io:
            arrays: dict[str, Any] = {n: t.detach().cpu().contiguous().numpy() for n, t in feeds.items()}
        else:
            arrays = {n: t.contiguous() for n, t in feeds.items()}
        try:
            outs = self.session.run(self.outputs, arrays)
        except Exception as exc:  # the session's own refusal (onnxruntime's error types share no base): typed
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(f"{self.label} refused the inputs its manifest describes ({first}): the export's "
                                  f"manifest.json and its graphs disagree (edited, or from another specpress); "
                                  f"export it again") from None
        return {n: torch.as_tensor(a).to(self.device) for n, a in zip(self.outputs, outs)}


def check_target(manifest_target: Mapping[str, Any] | None, target: Any, path: Any, strict: bool,
                 warn: Callable[[str], None]) -> None:
    """The shared tensors in the export came from one target: another one warns (drafts will be poor),
    or fails with `strict` (as the torch backend treats a drafter built for another target)."""
    if not manifest_target or target is None:
        return
    from specpress.models.drafter import target_fingerprint

    mine = target_fingerprint(target.config, target)
    bad = [k for k in ("config_sha256", "weights_sha256") if k in manifest_target and k in mine
           and manifest_target[k] != mine[k]]
    if bad:
        msg = (f"{path} was exported against another target ({', '.join(bad)} differ): its embeddings/head are "
               f"that target's; export the drafter again with --target set to this one")
        if strict:
            raise CheckpointError(msg)
        warn(f"warning: {msg}")


def build_runner(manifest: ExportManifest | Mapping[str, Any], sessions: Mapping[str, Any], target: Any,
                 device: torch.device | str, *, backend: str, provider: str, strict: bool = False,
                 warn: Callable[[str], None] = print, numpy_io: bool = False, **_: Any) -> "ExportedRunner":
    """An ExportedRunner over `sessions` ({graph name: object with run(output_names, feeds)}), one per graph
    of `manifest` (an ExportManifest or its JSON object). The onnxruntime and tensorrt backends both use it."""
    m = manifest if isinstance(manifest, ExportManifest) else manifest_from_dict(manifest)
    check_target(m.target, target, f"this {m.family} export", strict, warn)
    dev = torch.device(device)
    missing = [g.name for g in m.graphs if g.name not in sessions]
    if missing:
        raise CheckpointError(f"graphs {missing} of the {m.family} export have no session; rebuild the backend's "
                              f"files from a complete `specpress export onnx` directory")
    for g in m.graphs:
        check_io(g, sessions[g.name])
    calls = {g.name: SessionCall(sessions[g.name], [o.name for o in g.outputs], dev, numpy_io, g.file)
             for g in m.graphs}
    kinds = [cls for call, cls in RUNNERS.items() if m.graphs_for(call)]
    if len(kinds) != 1:
        served = sorted({g.role.call for g in m.graphs})
        raise CheckpointError(f"the {m.family} export's graphs serve {', '.join(served)}: a drafter export has "
                              f"exactly one of {', '.join(RUNNERS)} graphs; export it again with `specpress export "
                              f"onnx`")
    return kinds[0](m, calls, dev, backend, provider)


def check_io(graph: GraphSpec, session: Any) -> None:
    """The inputs and outputs the manifest lists for `graph` are the session's (by name), when the session
    says what they are (onnxruntime's get_inputs / get_outputs): a manifest edited to call a graph with
    other names is refused before anything runs."""
    if not (hasattr(session, "get_inputs") and hasattr(session, "get_outputs")):
        return
    for kind, listed, actual in (("inputs", graph.inputs, session.get_inputs()),
                                 ("outputs", graph.outputs, session.get_outputs())):
        want, have = sorted(t.name for t in listed), sorted(a.name for a in actual)
        if want != have:
            extra = sorted(set(want) - set(have)) or sorted(set(have) - set(want))
            raise CheckpointError(f"{graph.file}: the manifest lists {kind} {want} but the graph has {have} (differ "
                                  f"in {extra}): the export's manifest.json and its graphs disagree (edited, or from "
                                  f"another specpress); export it again")


def run_cached(call: GraphCall, feeds: dict[str, Tensor], cache: KVCache, layers: Sequence[int], past: int,
               keep: int) -> dict[str, Tensor]:
    """Call a graph with past_key/value.{j} = `cache` layer layers[j]'s first `past` slots; write `keep` new
    slots of its present_key/value.{j} back and set the cache's length to past + keep."""
    for j, layer in enumerate(layers):
        feeds[f"past_key.{j}"] = cache.k[layer, :, :, :past]
        feeds[f"past_value.{j}"] = cache.v[layer, :, :, :past]
    out = call(feeds)
    for j, layer in enumerate(layers):
        cache.k[layer, :, :, past:past + keep] = out[f"present_key.{j}"][:, :, past:past + keep]
        cache.v[layer, :, :, past:past + keep] = out[f"present_value.{j}"][:, :, past:past + keep]
    cache.length = past + keep
    return out


def plugin_mask(mask: Tensor, committed: int | None = None) -> tuple[Tensor, Tensor]:
    """bool [T, S] (True = may attend) -> (committed int32 [1], tree_mask int32 [T, ceil((S-c)/32)]).

    c = `committed` when given (slots every query sees: the committed context), else the longest prefix
    of slots every query sees; c < S always, so the words are never empty (no zero-size plugin input).
    The words cover slots c..S-1, LSB first (runtime.tree.pack_mask)."""
    s = mask.shape[1]
    if committed is None:
        seen = mask.all(0)
        committed = s if bool(seen.all()) else int((~seen).nonzero()[0, 0])
    c = max(0, min(committed, s - 1))
    return torch.tensor([c], dtype=torch.int32, device=mask.device), pack_mask(mask[:, c:]).contiguous()


class ExportedRunner:
    """What the three exported runners share; `calls` maps graph name -> GraphCall."""

    def __init__(self, manifest: ExportManifest, calls: Mapping[str, GraphCall], device: torch.device,
                 backend: str, provider: str) -> None:
        self.manifest = m = manifest
        self.calls = dict(calls)
        self.backend, self.family = backend, m.family
        self._device, self._provider = torch.device(device), provider
        info = m.drafter
        self.info = info
        self.taps = tuple(info.taps)
        self.vocab_size = info.vocab_size
        self.token_map = None if info.token_map is None else torch.tensor(info.token_map, device=self._device)
        self.dtype = TORCH_DTYPES[m.dtype]
        missing = [g.name for g in m.graphs if g.name not in self.calls]
        if missing:
            raise CheckpointError(f"graphs {missing} of the export have no loaded session")
        self._fuse = self._only("fuse")

    def _only(self, call: str) -> GraphSpec | None:
        graphs = self.manifest.graphs_for(call)
        if len(graphs) > 1:
            raise CheckpointError(f"the {self.family} export has {len(graphs)} graphs for the {call} call "
                                  f"({', '.join(g.name for g in graphs)}); one serves it")
        return graphs[0] if graphs else None

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def provider(self) -> str:
        return self._provider

    def new_cache(self, capacity: int) -> KVCache:
        i = self.info
        return KVCache(i.cache_layers, 1, i.kv_heads, capacity, i.head_dim, self.dtype, self._device)

    # -- inputs ------------------------------------------------------------------------------------

    def _mask_feeds(self, mask: Tensor, committed: int | None = None) -> dict[str, Tensor]:
        if self.manifest.attention == "standard":
            return {"mask": mask.to(torch.bool)}
        committed, words = plugin_mask(mask, committed)
        return {"committed": committed, "tree_mask": words}

    def _fused(self, taps: Tensor) -> Tensor:
        assert self._fuse is not None
        return self.calls[self._fuse.name]({"taps": taps.to(self.dtype)})["features"]

    def _run(self, graph: GraphSpec, feeds: dict[str, Tensor], cache: KVCache, past: int,
             keep: int) -> dict[str, Tensor]:
        """Call `graph` with past K/V of its cache layers from `cache`; append `keep` new slots of its presents."""
        return run_cached(self.calls[graph.name], feeds, cache, graph.role.cache_layers, past, keep)

    def _step_inputs(self, t: int, cache: KVCache, positions: Tensor | None,
                     mask: Tensor | None) -> tuple[int, Tensor, Tensor]:
        past = cache.reserve(t)
        dev = self._device
        pos = torch.arange(past, past + t, device=dev) if positions is None else positions.to(dev)
        if mask is None:
            mask = causal_mask(t, past, dev)
        if tuple(mask.shape) != (t, past + t):
            raise ValueError(f"mask must be [{t}, {past + t}] (new tokens x (cache + new)), got {tuple(mask.shape)}")
        return past, pos.reshape(1, t).to(torch.int64), mask

    def _fuse_taps(self, taps: dict[int, Tensor]) -> Tensor:
        """{tap: [1, T, Ht]} -> the fused features [1, T, H] (the exported `fuse` graph: fc, + hidden_norm
        for dflash); feature_step / block_drafts take them as they come."""
        if self._fuse is None and not self.taps:
            raise RequestError(f"{self.family} drafters take no fused taps (they read the target's last hidden state)")
        if self._fuse is None:
            raise CheckpointError(f"this {self.family} export has no `fuse` graph for taps {list(self.taps)}; "
                                  f"export it again with `specpress export onnx`")
        missing = [i for i in self.taps if i not in taps]
        if missing:
            raise RequestError(f"target taps {missing} were not computed; run the target with taps=runner.taps")
        return self._fused(torch.cat([taps[i] for i in self.taps], dim=-1))


class ExportedFeatureRunner(ExportedRunner):
    """A `FeatureDrafter` over an export with `feature` graphs (one per draft module) and maybe a `fuse` graph."""

    def __init__(self, manifest: ExportManifest, calls: Mapping[str, GraphCall], device: torch.device,
                 backend: str, provider: str) -> None:
        super().__init__(manifest, calls, device, backend, provider)
        self._steps = manifest.graphs_for("feature")  # one per draft module, in module order

    def fuse_taps(self, taps: dict[int, Tensor]) -> Tensor:
        return self._fuse_taps(taps)

    def feature_step(self, feats: Tensor, ids: Tensor, cache: KVCache, positions: Tensor | None,
                     mask: Tensor | None, module: int = 0) -> tuple[Tensor, Tensor]:
        t = ids.shape[1]
        if feats.shape[-1] != self.info.hidden_size and self._fuse is not None:
            feats = self._fused(feats)
        past, pos, mask = self._step_inputs(t, cache, positions, mask)
        feeds = {"hidden": feats.to(self.dtype), "ids": ids.to(torch.int64), "positions": pos,
                 **self._mask_feeds(mask)}
        out = self._run(self._steps[module % len(self._steps)], feeds, cache, past, t)
        return out["logits"], out["hidden_out"]


class ExportedTokenRunner(ExportedRunner):
    """A `TokenDrafter` over an export with one `lm` graph."""

    def __init__(self, manifest: ExportManifest, calls: Mapping[str, GraphCall], device: torch.device,
                 backend: str, provider: str) -> None:
        super().__init__(manifest, calls, device, backend, provider)
        lm = self._only("lm")
        assert lm is not None
        self._lm_graph = lm

    def lm_step(self, ids: Tensor, cache: KVCache, positions: Tensor | None, mask: Tensor | None,
                last_only: bool = False) -> Tensor:
        t = ids.shape[1]
        past, pos, mask = self._step_inputs(t, cache, positions, mask)
        feeds = {"ids": ids.to(torch.int64), "positions": pos, **self._mask_feeds(mask)}
        logits = self._run(self._lm_graph, feeds, cache, past, t)["logits"]
        return logits[:, -1:] if last_only else logits


class ExportedBlockRunner(ExportedRunner):
    """A `BlockDrafter` over an export with one `block` graph (a `fuse` graph, and maybe a `markov` graph)."""

    def __init__(self, manifest: ExportManifest, calls: Mapping[str, GraphCall], device: torch.device,
                 backend: str, provider: str) -> None:
        super().__init__(manifest, calls, device, backend, provider)
        block = self._only("block")
        assert block is not None
        self._block_graph, self._markov = block, self._only("markov")

    def fuse_taps(self, taps: dict[int, Tensor]) -> Tensor:
        return self._fuse_taps(taps)

    def block_drafts(self, feats: Tensor | None, root: int, block_size: int, cache: KVCache) -> list[int]:
        i = self.info
        if i.mask_token_id is None:
            raise RequestError("this dflash export has no mask_token_id; set dflash_config.mask_token_id in the "
                               "drafter's config and export it again")
        dev = self._device
        if feats is None:
            feats = torch.zeros(1, 0, i.hidden_size, dtype=self.dtype, device=dev)
        elif feats.shape[-1] != i.hidden_size:
            feats = self._fused(feats)
        c = feats.shape[1]
        past = cache.reserve(c + block_size)
        block = torch.full((1, block_size), i.mask_token_id, dtype=torch.int64, device=dev)
        block[0, 0] = root
        pos = torch.arange(past, past + c + block_size, device=dev)[None]
        mask = torch.ones(block_size, past + c + block_size, dtype=torch.bool, device=dev)
        feeds = {"features": feats.to(self.dtype), "block_ids": block, "positions": pos,
                 **self._mask_feeds(mask, committed=past + c)}  # the context is committed, the block all-visible
        logits = self._run(self._block_graph, feeds, cache, past, c)["logits"][0]
        if self._markov is None:
            return logits[1:].argmax(-1).tolist()
        markov, drafts, prev = self.calls[self._markov.name], [], root
        for k in range(1, block_size):
            bias = markov({"prev_ids": torch.tensor([prev], device=dev)})["bias"]
            prev = int((logits[k:k + 1] + bias.to(logits.dtype)).argmax(-1))
            drafts.append(prev)
        return drafts


RUNNERS: dict[str, type[ExportedRunner]] = {"feature": ExportedFeatureRunner, "lm": ExportedTokenRunner,
                                            "block": ExportedBlockRunner}

