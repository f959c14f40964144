"""EAGLE-3's export (models/eagle3.py): `fuse` (fc over the concatenated target taps) and `step` (the
midlayer over [input_layernorm(embedding) ; hidden_norm(hidden)], the draft head: its own or the target's rows)."""

from __future__ import annotations

from torch import nn

from specpress.export.blocks import linear, mlp, rms_norm, rotary, self_attention
from specpress.export.context import Ctx
from specpress.export.families import ExportFamily, register_export
from specpress.export.families.common import (NewCtx, attention_io, draft_head, feature_inputs, feature_outputs,
                                              feature_roles, present_io, shared_embed)
from specpress.manifest import GraphRole


def eagle3_graphs(d: nn.Module, new: NewCtx) -> dict[str, Ctx]:
    cfg = d.config
    fuse = new("fuse")
    taps = fuse.g.input("taps", fuse.g.ft, [1, "tokens", cfg.num_taps * cfg.target_hidden_size])
    fuse.g.output("features", linear(fuse, taps, d.fc, "fc"), fuse.g.ft, [1, "tokens", cfg.hidden_size])
    c = new("step")
    g = c.g
    hidden, ids, pos = feature_inputs(c, cfg.hidden_size)
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
    feature_outputs(c, logits, cfg.draft_vocab_size, x, cfg.hidden_size)
    present_io(c, [(pk, pv)], cfg.num_key_value_heads, cfg.head_dim)
    return {"fuse": fuse, "step": c}


register_export("eagle3", ExportFamily(eagle3_graphs, lambda d: {"fuse": GraphRole("fuse"), **feature_roles(d)},
                                     fuse=lambda d, taps: d.fc(taps)))
