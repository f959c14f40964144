"""EAGLE-1's export (models/eagle.py): one `step` graph, fc over [embedding ; hidden], its decoder layers,
the target's head."""

from __future__ import annotations

from torch import nn

from specpress.export.blocks import decoder_layer, linear, rotary
from specpress.export.context import Ctx
from specpress.export.families import ExportFamily, register_export
from specpress.export.families.common import (NewCtx, attention_io, feature_inputs, feature_outputs, feature_roles,
                                              present_io, shared_embed, shared_head)


def eagle_graphs(d: nn.Module, new: NewCtx) -> dict[str, Ctx]:
    cfg = d.config
    c = new("step")
    hidden, ids, pos = feature_inputs(c, cfg.hidden_size)
    pasts = attention_io(c, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
    x = linear(c, c.g.op("Concat", c.g.op("Gather", shared_embed(c, d), ids), hidden, axis=-1), d.fc, "fc")
    cos, sin = rotary(c, pos, d.rotary)
    presents = []
    for i, layer in enumerate(d.layers):
        x, pk, pv = decoder_layer(c, x, layer, cos, sin, pasts[i], f"layers.{i}")
        presents.append((pk, pv))
    feature_outputs(c, shared_head(c, x, d), cfg.vocab_size, x, cfg.hidden_size)
    present_io(c, presents, cfg.num_key_value_heads, cfg.head_dim)
    return {"step": c}


register_export("eagle", ExportFamily(eagle_graphs, feature_roles))
