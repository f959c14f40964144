"""What several families' export graphs share: the attention form's mask and past K/V inputs, the present
outputs, the target's embeddings and head (shared initializers, written once per export), a drafter's own
head, the feature-conditioned I/O (eagle, eagle3, mtp) and their roles."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from onnx import TensorProto
from torch import nn

from specpress.export.blocks import linear
from specpress.export.context import Ctx
from specpress.export.graph import NP_TYPES
from specpress.manifest import GraphRole
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


def feature_inputs(c: Ctx, width: int) -> tuple[str, str, str]:
    g = c.g
    return (g.input("hidden", g.ft, [1, "tokens", width]), g.input("ids", INT64, [1, "tokens"]),
            g.input("positions", INT64, [1, "tokens"]))


def feature_outputs(c: Ctx, logits: str, vocab: int, hidden: str, width: int) -> None:
    c.g.output("logits", logits, c.g.ft, [1, "tokens", vocab])
    c.g.output("hidden_out", hidden, c.g.ft, [1, "tokens", width])


def cache_dims(d: Any) -> tuple[int, int, int]:
    """(cache layers, kv heads, head dim) of drafter `d`'s KV cache, read off a one-slot cache: every
    family's new_cache knows them (the lm drafter is a TargetModel and has no cache_dims)."""
    k = d.new_cache(1).k  # [layers, batch, kv heads, capacity, head dim]
    return k.shape[0], k.shape[2], k.shape[4]


def every_layer(d: Any) -> tuple[int, ...]:
    return tuple(range(cache_dims(d)[0]))


def feature_roles(d: Any) -> dict[str, GraphRole]:  # eagle, eagle3 after its fuse
    return {"step": GraphRole("feature", every_layer(d))}
