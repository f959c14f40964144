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

`EXPORTS` holds one `ExportFamily` per exportable family, each registered by `register_export` beside its
graph builder: the builder, the role of each graph it emits (manifest.GraphRole: the runner call and the
cache layers, recorded in manifest.json, which is all the backends read) and the torch computation of its
`fuse` graph (for validation). Exporting a new family means one builder and one register_export call (from
any module: nothing here lists the families); the other facts export needs come from the family's traits
(models/family.py: draft vocabulary, session kind).

Why these graphs are written here rather than traced from the torch modules by torch.onnx.export(dynamo=True)
(bench/onnx_dynamo.py; BENCHMARKS.md, "Hand-built graphs against torch.onnx"): on the float graphs both give the
same numbers and, since the norms are written in the form onnxruntime fuses, the same onnxruntime speed (dynamo
÷ hand-built 0.96-1.02), and TensorRT for RTX builds both. The tracer cannot do four things these graphs need:
write a tied head without a Transpose of the embedding (onnxruntime folds a second copy at load), write the
target's embedding and head once for every graph of an export, lower a quantized Linear's stored codes
(export/quant/) or emit the TreeAttention plugin node, without a custom translation for each. The parity tests
(onnxruntime against torch, per family and scheme) are what keeps the two copies of each network one network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from onnx import TensorProto
from torch import Tensor, nn

from specpress.errors import RequestError
from specpress.export.blocks import decoder_layer, linear, mlp, rms_norm, rotary, self_attention
from specpress.export.context import Ctx
from specpress.export.graph import NP_TYPES
from specpress.manifest import GraphRole
from specpress.models.drafter import BUILTIN_FAMILIES
from specpress.models.heads import LowRankHead

INT64, INT32, BOOL = TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL
NewCtx = Callable[[str], Ctx]


def attention_io(c: Ctx, n_layers: int, kv_heads: int, head_dim: int, queries: str = "tokens") -> list[tuple[str, str]]:
    """Declare the mask inputs of the form and the past K/V inputs; return [(past_k, past_v)] per layer."""
    g = c.g
    if c.attention == "standard":
        c.mask["mask"] = g.input("mask", BOOL, [queries, "total"])
    else:
        c.mask["committed"] = g.input("committed", INT32, [1])
        c.mask["tree_mask"] = g.input("tree_mask", INT32, [queries, "words"])
    return [(g.input(f"past_key.{i}", g.ft, [1, kv_heads, "past", head_dim]),
             g.input(f"past_value.{i}", g.ft, [1, kv_heads, "past", head_dim])) for i in range(n_layers)]


def present_io(c: Ctx, presents: list[tuple[str, str]], kv_heads: int, head_dim: int) -> None:
    for i, (pk, pv) in enumerate(presents):
        c.g.output(f"present_key.{i}", pk, c.g.ft, [1, kv_heads, "total", head_dim])
        c.g.output(f"present_value.{i}", pv, c.g.ft, [1, kv_heads, "total", head_dim])


def shared_embed(c: Ctx, d: nn.Module) -> str:
    return c.g.shared_init(d.shared.embed_tokens.weight, "embed_tokens", NP_TYPES[c.g.ft])


def shared_head(c: Ctx, x: str, d: nn.Module) -> str:
    """x [1, T, H] -> logits [1, T, V] through the target's lm_head (stored transposed)."""
    w = c.g.shared_init(d.shared.lm_head.weight, "lm_head_t", NP_TYPES[c.g.ft], transpose=True)
    return c.g.op("MatMul", x, w)


def own_head(c: Ctx, x: str, head: nn.Module, hint: str = "lm_head") -> str:
    """x [1, T, H] -> logits through a drafter's own head: a Linear, or a low-rank head's two factors."""
    if isinstance(head, LowRankHead):
        return linear(c, linear(c, x, head.down, f"{hint}.down"), head.up, f"{hint}.up")
    return linear(c, x, head, hint)


def draft_head(c: Ctx, x: str, d: nn.Module) -> str:
    """eagle3: x [1, T, H] -> draft-vocab logits [1, T, Vd]: its own head, or the target's rows (shared_head)."""
    if d.lm_head is not None:
        return own_head(c, x, d.lm_head)
    w = c.g.shared_init(d.shared.lm_head.weight, "lm_head_t", NP_TYPES[c.g.ft], transpose=True)  # [H, V]
    ids = d.to_target_ids(torch.arange(d.config.draft_vocab_size, device=d.d2t.device)).cpu().numpy()
    if not np.array_equal(ids, np.arange(d.config.vocab_size)):  # a reduced draft vocabulary: its rows only
        w = c.g.op("Gather", w, c.g.const(ids), axis=1)  # [H, Vd]; constant-folded when a session loads
    return c.g.op("MatMul", x, w)


def _feature_inputs(c: Ctx, width: int) -> tuple[str, str, str]:
    g = c.g
    return (g.input("hidden", g.ft, [1, "tokens", width]), g.input("ids", INT64, [1, "tokens"]),
            g.input("positions", INT64, [1, "tokens"]))


def _feature_outputs(c: Ctx, logits: str, vocab: int, hidden: str, width: int) -> None:
    c.g.output("logits", logits, c.g.ft, [1, "tokens", vocab])
    c.g.output("hidden_out", hidden, c.g.ft, [1, "tokens", width])


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


def cache_dims(d: Any) -> tuple[int, int, int]:
    """(cache layers, kv heads, head dim) of drafter `d`'s KV cache, read off a one-slot cache: every
    family's new_cache knows them (the lm drafter is a TargetModel and has no cache_dims)."""
    k = d.new_cache(1).k  # [layers, batch, kv heads, capacity, head dim]
    return k.shape[0], k.shape[2], k.shape[4]


def _every_layer(d: Any) -> tuple[int, ...]:
    return tuple(range(cache_dims(d)[0]))


def _feature_roles(d: Any) -> dict[str, GraphRole]:  # eagle, eagle3 after its fuse
    return {"step": GraphRole("feature", _every_layer(d))}


# ------------------------------------------------------------------------- each family: its builder, registered


def eagle_graphs(d: nn.Module, new: NewCtx) -> dict[str, Ctx]:
    cfg = d.config
    c = new("step")
    hidden, ids, pos = _feature_inputs(c, cfg.hidden_size)
    pasts = attention_io(c, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
    x = linear(c, c.g.op("Concat", c.g.op("Gather", shared_embed(c, d), ids), hidden, axis=-1), d.fc, "fc")
    cos, sin = rotary(c, pos, d.rotary)
    presents = []
    for i, layer in enumerate(d.layers):
        x, pk, pv = decoder_layer(c, x, layer, cos, sin, pasts[i], f"layers.{i}")
        presents.append((pk, pv))
    _feature_outputs(c, shared_head(c, x, d), cfg.vocab_size, x, cfg.hidden_size)
    present_io(c, presents, cfg.num_key_value_heads, cfg.head_dim)
    return {"step": c}


register_export("eagle", ExportFamily(eagle_graphs, _feature_roles))


def eagle3_graphs(d: nn.Module, new: NewCtx) -> dict[str, Ctx]:
    cfg = d.config
    fuse = new("fuse")
    taps = fuse.g.input("taps", fuse.g.ft, [1, "tokens", cfg.num_taps * cfg.target_hidden_size])
    fuse.g.output("features", linear(fuse, taps, d.fc, "fc"), fuse.g.ft, [1, "tokens", cfg.hidden_size])
    c = new("step")
    g = c.g
    hidden, ids, pos = _feature_inputs(c, cfg.hidden_size)
    pasts = attention_io(c, 1, cfg.num_key_value_heads, cfg.head_dim)
    m = d.midlayer
    emb = g.op("Gather", shared_embed(c, d), ids)
    x = g.op("Concat", rms_norm(c, emb, m.input_layernorm, "midlayer.input_layernorm"),
             rms_norm(c, hidden, m.hidden_norm, "midlayer.hidden_norm"), axis=-1)
    cos, sin = rotary(c, pos, d.rotary)
    a, pk, pv = self_attention(c, x, m.self_attn, cos, sin, pasts[0], "midlayer.self_attn")
    x = g.op("Add", hidden, a)
    x = g.op("Add", x, mlp(c, rms_norm(c, x, m.post_attention_layernorm, "midlayer.post_attention_layernorm"),
                           m.mlp, "midlayer.mlp"))
    logits = draft_head(c, rms_norm(c, x, d.norm, "norm"), d)
    _feature_outputs(c, logits, cfg.draft_vocab_size, x, cfg.hidden_size)
    present_io(c, [(pk, pv)], cfg.num_key_value_heads, cfg.head_dim)
    return {"fuse": fuse, "step": c}


register_export("eagle3", ExportFamily(eagle3_graphs, lambda d: {"fuse": GraphRole("fuse"), **_feature_roles(d)},
                                     fuse=lambda d, taps: d.fc(taps)))


def mtp_graphs(d: nn.Module, new: NewCtx) -> dict[str, Ctx]:
    cfg = d.config
    out = {}
    for k in range(cfg.num_nextn_predict_layers):
        c = new(f"step.{k}")
        g = c.g
        layer = d.module(k)
        hidden, ids, pos = _feature_inputs(c, cfg.hidden_size)
        pasts = attention_io(c, 1, cfg.num_key_value_heads, cfg.head_dim)
        emb = g.op("Gather", shared_embed(c, d), ids)
        emb = g.op("Where", g.op("Unsqueeze", g.op("Equal", pos, g.const(0)), g.const([-1])), g.fconst(0.0), emb)
        x = linear(c, g.op("Concat", rms_norm(c, emb, layer.enorm, "enorm"), rms_norm(c, hidden, layer.hnorm, "hnorm"),
                           axis=-1), layer.eh_proj, "eh_proj")
        cos, sin = rotary(c, pos, d.rotary)
        h, pk, pv = decoder_layer(c, x, layer, cos, sin, pasts[0], "block")
        logits = shared_head(c, rms_norm(c, h, layer.shared_head.norm, "shared_head.norm"), d)
        _feature_outputs(c, logits, cfg.vocab_size, h, cfg.hidden_size)
        present_io(c, [(pk, pv)], cfg.num_key_value_heads, cfg.head_dim)
        out[f"step.{k}"] = c
    return out


# one step graph per MTP module k, holding that module's cache layer k
register_export("mtp", ExportFamily(mtp_graphs, lambda d: {f"step.{k}": GraphRole("feature", (k,))
                                                         for k in range(d.config.num_nextn_predict_layers)}))


def dflash_graphs(d: nn.Module, new: NewCtx) -> dict[str, Ctx]:
    cfg = d.config
    h = cfg.hidden_size
    fuse = new("fuse")
    taps = fuse.g.input("taps", fuse.g.ft, [1, "context", len(d.taps) * h])
    fuse.g.output("features", rms_norm(fuse, linear(fuse, taps, d.fc, "fc"), d.hidden_norm, "hidden_norm"),
                  fuse.g.ft, [1, "context", h])
    c = new("block")
    g = c.g
    ctx = g.input("features", g.ft, [1, "context", h])
    ids = g.input("block_ids", INT64, [1, "block"])
    pos = g.input("positions", INT64, [1, "context_block"])
    pasts = attention_io(c, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, queries="block")
    x = g.op("Gather", shared_embed(c, d), ids)
    cos, sin = rotary(c, pos, d.rotary)
    n_ctx = g.op("Shape", ctx, start=1, end=2)
    big = g.const([1 << 40])
    q_cos = tuple(g.op("Slice", t, n_ctx, big, g.const([2])) for t in (cos, sin))
    presents = []
    for i, layer in enumerate(d.layers):
        hn = rms_norm(c, x, layer.input_layernorm, f"layers.{i}.input_layernorm")
        a, pk, pv = self_attention(c, hn, layer.self_attn, cos, sin, pasts[i], f"layers.{i}.self_attn",
                                   kv_in=g.op("Concat", ctx, hn, axis=1), q_cos=q_cos)  # type: ignore[arg-type]
        x = g.op("Add", x, a)
        x = g.op("Add", x, mlp(c, rms_norm(c, x, layer.post_attention_layernorm,
                                           f"layers.{i}.post_attention_layernorm"), layer.mlp, f"layers.{i}.mlp"))
        presents.append((pk, pv))
    g.output("logits", shared_head(c, rms_norm(c, x, d.norm, "norm"), d), g.ft, [1, "block", cfg.vocab_size])
    present_io(c, presents, cfg.num_key_value_heads, cfg.head_dim)
    out = {"fuse": fuse, "block": c}
    if d.markov_head is not None:
        mk = new("markov")
        prev = mk.g.input("prev_ids", INT64, ["n"])
        emb = mk.g.op("Gather", mk.weight(d.markov_head.markov_w1.weight, "markov_w1"), prev)
        mk.g.output("bias", linear(mk, emb, d.markov_head.markov_w2, "markov_w2"), mk.g.ft, ["n", cfg.vocab_size])
        out["markov"] = mk
    return out


def _dflash_roles(d: Any) -> dict[str, GraphRole]:
    markov = {"markov": GraphRole("markov")} if d.markov_head is not None else {}
    return {"fuse": GraphRole("fuse"), "block": GraphRole("block", _every_layer(d)), **markov}


register_export("dflash", ExportFamily(dflash_graphs, _dflash_roles, fuse=lambda d, taps: d.hidden_norm(d.fc(taps))))


def causal_lm(c: Ctx, d: nn.Module) -> tuple[str, str, list[tuple[str, str]], list[str]]:
    """A TargetModel's forward (the lm family's graph, and `export target`'s): declares ids, positions, the
    mask and the past K/V inputs; returns (final normed hidden, logits, present (k, v) per layer, the
    residual entering each layer - HF's hidden_states[i])."""
    cfg = d.config
    g = c.g
    ids = g.input("ids", INT64, [1, "tokens"])
    pos = g.input("positions", INT64, [1, "tokens"])
    pasts = attention_io(c, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
    embed = c.weight(d.model.embed_tokens.weight, "embed_tokens")
    x = g.op("Gather", embed, ids)
    cos, sin = rotary(c, pos, d.rotary)
    presents, layer_inputs = [], []
    for i, layer in enumerate(d.model.layers):
        layer_inputs.append(x)
        x, pk, pv = decoder_layer(c, x, layer, cos, sin, pasts[i], f"model.layers.{i}")
        presents.append((pk, pv))
    x = rms_norm(c, x, d.model.norm, "model.norm")
    if cfg.tie_word_embeddings:
        # Gemm's transB reads the embedding where it lies; MatMul(x, Transpose(embed)) had onnxruntime fold a
        # transposed copy at load (V x H: +0.98 GiB in fp32 at the Llama-3.2-1B shape, and twice that while folding)
        rows = g.op("Reshape", x, g.const([-1, cfg.hidden_size]))
        logits = g.op("Reshape", g.op("Gemm", rows, embed, transB=1), g.const([1, -1, cfg.vocab_size]))
    else:
        logits = own_head(c, x, d.lm_head)
    return x, logits, presents, layer_inputs


def lm_graphs(d: nn.Module, new: NewCtx) -> dict[str, Ctx]:
    cfg = d.config
    c = new("lm")
    _, logits, presents, _ = causal_lm(c, d)
    c.g.output("logits", logits, c.g.ft, [1, "tokens", cfg.vocab_size])
    present_io(c, presents, cfg.num_key_value_heads, cfg.head_dim)
    return {"lm": c}


register_export("lm", ExportFamily(lm_graphs, lambda d: {"lm": GraphRole("lm", _every_layer(d))}))


def build_graphs(drafter: Any, new: NewCtx) -> tuple[dict[str, Ctx], dict[str, GraphRole]]:
    """({graph name: its built Ctx}, {graph name: its role}) for `drafter`'s family."""
    fam = export_family(drafter.family)
    ctxs, roles = fam.build(drafter, new), fam.roles(drafter)
    assert list(ctxs) == list(roles), f"{drafter.family}: built graphs {list(ctxs)}, roles of {list(roles)}"
    return ctxs, roles


def graph_role(drafter: Any, graph: str) -> GraphRole:
    """The role of graph `graph` of `drafter`'s export (validation looks it up per call)."""
    return export_family(drafter.family).roles(drafter)[graph]
