"""Graph-side twins of the torch building blocks (models/layers.py, models/target.py), written from a
module's own weights: Linear (float or quantized as stored), RMSNorm, rotary, SwiGLU, attention.

Activations are [B, T, X] in the graph's float type; norms compute in fp32 like RMSNorm.forward.
Every block takes the `Ctx` of export/context.py; the tree-attention node comes from export/ops.py in the form
`Ctx.attention` names.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto
from torch import nn

from specpress.export import ops
from specpress.export.context import Ctx


def linear(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    """y = x W^T + b for a float nn.Linear or a quantized Linear (export/quant/, codes as stored)."""
    if getattr(mod, "is_quantized", False):
        from specpress.export.quant import quantized_linear

        y = quantized_linear(c, x, mod, hint)
    else:
        y = c.g.op("MatMul", x, c.weight(mod.weight.t(), f"{hint}.weight_t"))
    bias = getattr(mod, "bias", None)
    return y if bias is None else c.g.op("Add", y, c.weight(bias, f"{hint}.bias"))


def rms_norm(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    """(x / sqrt(mean(x^2) + eps)) * weight computed in fp32, cast back before the weight (as torch).

    Written as Pow -> ReduceMean -> Add -> Sqrt -> Div -> (Cast) -> Mul, the pattern onnxruntime fuses into one
    SimplifiedLayerNormalization kernel (with Mul(x, x) and a Reciprocal it ran as seven nodes per norm; with that and
    graph.py's Identity copies, torch.onnx's dynamo graph of the same network ran in 0.86-0.98x its time; BENCHMARKS.md,
    "Hand-built graphs against torch.onnx"). Only primitive ops, so every opset and TensorRT parser reads it."""
    g = c.g
    xf = g.op("Cast", x, to=TensorProto.FLOAT) if g.ft != TensorProto.FLOAT else x
    ms = g.op("ReduceMean", g.op("Pow", xf, g.const(2.0, np.float32)), g.const([-1]), keepdims=1)
    y = g.op("Div", xf, g.op("Sqrt", g.op("Add", ms, g.const(mod.eps, np.float32))))
    if g.ft != TensorProto.FLOAT:
        y = g.op("Cast", y, to=g.ft)
    return g.op("Mul", y, c.weight(mod.weight, f"{hint}.weight"))


def mlp(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    gate = linear(c, x, mod.gate_proj, f"{hint}.gate_proj")
    act = c.g.op("Mul", gate, c.g.op("Sigmoid", gate))
    return linear(c, c.g.op("Mul", act, linear(c, x, mod.up_proj, f"{hint}.up_proj")), mod.down_proj,
                  f"{hint}.down_proj")


def rotary(c: Ctx, positions: str, rot: nn.Module) -> tuple[str, str]:
    """positions int64 [B, T] -> cos, sin [B, 1, T, D] in the graph's float type (Rotary.forward)."""
    g = c.g
    freqs = g.op("Mul", g.op("Unsqueeze", g.op("Cast", positions, to=TensorProto.FLOAT), g.const([-1])),
                 g.init(rot.inv_freq.float().cpu().numpy(), "inv_freq"))
    emb = g.op("Concat", freqs, freqs, axis=-1)
    out = []
    for fn in ("Cos", "Sin"):
        v = g.op(fn, emb)
        if rot.scale != 1.0:
            v = g.op("Mul", v, g.const(rot.scale, np.float32))
        if g.ft != TensorProto.FLOAT:
            v = g.op("Cast", v, to=g.ft)
        out.append(g.op("Unsqueeze", v, g.const([1])))
    return out[0], out[1]


def apply_rotary(c: Ctx, x: str, cos: str, sin: str) -> str:
    """x [B, H, T, D] * cos + rotate_half(x) * sin."""
    g = c.g
    x1, x2 = g.op("Split", x, axis=-1, num_outputs=2, outputs=2)
    rot = g.op("Concat", g.op("Neg", x2), x1, axis=-1)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", rot, sin))


def heads(c: Ctx, x: str, n: int, d: int) -> str:
    """[B, T, n*d] -> [B, T, n, d]."""
    return c.g.op("Reshape", x, c.g.const([0, 0, n, d]))


def tree_attention(c: Ctx, q: str, k: str, v: str, past_k: str, past_v: str, attn: nn.Module) -> tuple[str, str, str]:
    """q [B,Hq,T,D], k/v [B,Hkv,T,D] after RoPE -> (out [B,T,Hq*D], present k, present v)."""
    scale = ops.default_scale(attn.d)
    if c.attention == "standard":
        out, pk, pv = ops.attention_standard(c.g, q, k, v, past_k, past_v, c.mask["mask"], scale)
    else:
        out, pk, pv = ops.attention_plugin(c.g, q, k, v, past_k, past_v, c.mask["committed"], c.mask["tree_mask"],
                                           num_heads=attn.nq, num_kv_heads=attn.nkv, head_size=attn.d, scale=scale)
    out = c.g.op("Reshape", c.g.op("Transpose", out, perm=[0, 2, 1, 3]), c.g.const([0, 0, attn.nq * attn.d]))
    return out, pk, pv


def self_attention(c: Ctx, x: str, attn: nn.Module, cos: str, sin: str, past: tuple[str, str], hint: str,
                   kv_in: str | None = None, q_cos: tuple[str, str] | None = None) -> tuple[str, str, str]:
    """TargetAttention (and DFlash's InjectedAttention when kv_in = [ctx ; x] is given, with q_cos the
    block's cos/sin): x [B, T, in] -> (o_proj output [B, T, H], present k, present v)."""
    g = c.g
    kv_src = x if kv_in is None else kv_in
    q = heads(c, linear(c, x, attn.q_proj, f"{hint}.q_proj"), attn.nq, attn.d)
    k = heads(c, linear(c, kv_src, attn.k_proj, f"{hint}.k_proj"), attn.nkv, attn.d)
    v = heads(c, linear(c, kv_src, attn.v_proj, f"{hint}.v_proj"), attn.nkv, attn.d)
    if hasattr(attn, "q_norm"):
        q, k = rms_norm(c, q, attn.q_norm, f"{hint}.q_norm"), rms_norm(c, k, attn.k_norm, f"{hint}.k_norm")
    qc, qs = q_cos or (cos, sin)
    q = apply_rotary(c, g.op("Transpose", q, perm=[0, 2, 1, 3]), qc, qs)
    k = apply_rotary(c, g.op("Transpose", k, perm=[0, 2, 1, 3]), cos, sin)
    v = g.op("Transpose", v, perm=[0, 2, 1, 3])
    if c.kv_cache == "fp8":  # what Fp8KVCache.write stores: the cache, and attention, see only e4m3 K/V
        from specpress.export.quant.inputs import fp8_rows

        k, v = fp8_rows(c, k), fp8_rows(c, v)
    out, pk, pv = tree_attention(c, q, k, v, past[0], past[1], attn)
    return linear(c, out, attn.o_proj, f"{hint}.o_proj"), pk, pv


def decoder_layer(c: Ctx, x: str, layer: nn.Module, cos: str, sin: str, past: tuple[str, str],
                  hint: str) -> tuple[str, str, str]:
    """models.target.DecoderLayer (input_layernorm may be None: EAGLE-1's first layer)."""
    h = x if layer.input_layernorm is None else rms_norm(c, x, layer.input_layernorm, f"{hint}.input_layernorm")
    a, pk, pv = self_attention(c, h, layer.self_attn, cos, sin, past, f"{hint}.self_attn")
    x = c.g.op("Add", x, a)
    return c.g.op("Add", x, mlp(c, rms_norm(c, x, layer.post_attention_layernorm, f"{hint}.post_attention_layernorm"),
                                layer.mlp, f"{hint}.mlp")), pk, pv
