"""The lm family's export (models/lm.py): one `lm` graph, a TargetModel's forward; `export target` writes the
same forward (causal_lm)."""

from __future__ import annotations

from torch import nn

from specpress.export.blocks import decoder_layer, rms_norm, rotary
from specpress.export.context import Ctx
from specpress.export.families import ExportFamily, register_export
from specpress.export.families.common import INT64, NewCtx, attention_io, every_layer, own_head, present_io
from specpress.manifest import GraphRole


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


register_export("lm", ExportFamily(lm_graphs, lambda d: {"lm": GraphRole("lm", every_layer(d))}))
