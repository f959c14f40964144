"""MTP's export (models/mtp.py): one `step.{k}` graph per module k, which holds that module's cache layer k."""

from __future__ import annotations

from torch import nn

from specpress.export.blocks import decoder_layer, linear, rms_norm, rotary
from specpress.export.context import Ctx
from specpress.export.families import ExportFamily, register_export
from specpress.export.families.common import (NewCtx, attention_io, feature_inputs, feature_outputs, present_io,
                                              shared_embed, shared_head)
from specpress.manifest import GraphRole


def mtp_graphs(d: nn.Module, new: NewCtx) -> dict[str, Ctx]:
    cfg = d.config
    out = {}
    for k in range(cfg.num_nextn_predict_layers):
        c = new(f"step.{k}")
        g = c.g
        layer = d.module(k)
        hidden, ids, pos = feature_inputs(c, cfg.hidden_size)
        pasts = attention_io(c, 1, cfg.num_key_value_heads, cfg.head_dim)
        emb = g.op("Gather", shared_embed(c, d), ids)
        emb = g.op("Where", g.op("Unsqueeze", g.op("Equal", pos, g.const(0)), g.const([-1])), g.fconst(0.0), emb)
        x = linear(c, g.op("Concat", rms_norm(c, emb, layer.enorm, "enorm"), rms_norm(c, hidden, layer.hnorm, "hnorm"),
                           axis=-1), layer.eh_proj, "eh_proj")
        cos, sin = rotary(c, pos, d.rotary)
        h, pk, pv = decoder_layer(c, x, layer, cos, sin, pasts[0], "block")
        logits = shared_head(c, rms_norm(c, h, layer.shared_head.norm, "shared_head.norm"), d)
        feature_outputs(c, logits, cfg.vocab_size, h, cfg.hidden_size)
        present_io(c, [(pk, pv)], cfg.num_key_value_heads, cfg.head_dim)
        out[f"step.{k}"] = c
    return out


# one step graph per MTP module k, holding that module's cache layer k
register_export("mtp", ExportFamily(mtp_graphs, lambda d: {f"step.{k}": GraphRole("feature", (k,))
                                                         for k in range(d.config.num_nextn_predict_layers)}))
