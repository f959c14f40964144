"""DFlash's export (models/dflash.py): `fuse` (hidden_norm(fc(taps))), `block` (the block's tokens attending to
[context ; block] K/V) and, with a Markov head, `markov` (the bias rows of the previous tokens)."""

from __future__ import annotations

from typing import Any

from torch import nn

from specpress.export.blocks import linear, mlp, rms_norm, rotary, self_attention
from specpress.export.context import Ctx
from specpress.export.families import ExportFamily, register_export
from specpress.export.families.common import (INT64, NewCtx, attention_io, every_layer, present_io, shared_embed,
                                              shared_head)
from specpress.manifest import GraphRole


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
    return {"fuse": GraphRole("fuse"), "block": GraphRole("block", every_layer(d)), **markov}


register_export("dflash", ExportFamily(dflash_graphs, _dflash_roles, fuse=lambda d, taps: d.hidden_norm(d.fc(taps))))
