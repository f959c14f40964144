"""EAGLE-3 pinned to a forward written by hand from the algorithm (shared/reference/algorithms.md §3),
not from any implementation: plain tensor ops on the drafter's public tensors.

  taps  = the residual entering target layers 2, L//2, L-3 (HF hidden_states[2, L//2, L-3]), concatenated
          in that (ascending) order; position j pairs the taps of token j with the embedding of token j+1
  g     = fc(taps) for target features, or the drafter's own previous output (pre-norm) when fed back
  x     = cat(input_layernorm(emb), hidden_norm(g))                              [2H]
  h     = g + o_proj(attn(q_proj(x), k_proj(x), v_proj(x)))   causal, RoPE at the drafter position
  h     = h + down(silu(gate(post_attention_layernorm(h))) * up(...))             <- fed back
  logit = lm_head(norm(h))  over the draft vocab;  target id = draft id + d2t[draft id]

And the checkpoint rule that makes EAGLE's own loader (cnets.Model) give the drafter the target's
embedding: config.json without `target_hidden_size`, checkpoint without `embed_tokens.weight`.
"""

from __future__ import annotations

import json
import math

import torch
from safetensors.torch import load_file

from drafters_common import IDS, L, make, tiny_target
from specpress.models.drafter_io import load_drafter, save_drafter


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [T, heads, D] rotated at positions pos [T] (the half-split convention of Llama checkpoints)."""
    d = x.shape[-1]
    freqs = pos.double()[:, None] * theta ** (-torch.arange(0, d, 2).double() / d)  # [T, D/2]
    cos, sin = freqs.cos()[:, None].float(), freqs.sin()[:, None].float()
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def reference_step(w: dict[str, torch.Tensor], cfg, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor,
                   past: tuple[torch.Tensor, torch.Tensor] | None):
    """One EAGLE-3 pass over T positions; emb, g [T, H]; past = (k, v) [P, kv_heads, D] of earlier positions.
    Returns (draft-vocab logits [T, Vd], h [T, H], (k, v) including these positions)."""
    p = "midlayer."
    eps, nh, nkv, d = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    x = torch.cat([rms(emb, w[p + "input_layernorm.weight"], eps), rms(g, w[p + "hidden_norm.weight"], eps)], -1)
    t = x.shape[0]
    q = rope((x @ w[p + "self_attn.q_proj.weight"].T).view(t, nh, d), pos, cfg.rope.theta)
    k = rope((x @ w[p + "self_attn.k_proj.weight"].T).view(t, nkv, d), pos, cfg.rope.theta)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(t, nkv, d)
    if past is not None:
        k, v = torch.cat([past[0], k]), torch.cat([past[1], v])
    n_past = k.shape[0] - t
    out = torch.empty(t, nh, d)
    for i in range(t):
        for h in range(nh):
            kv = h // (nh // nkv)
            s = k[: n_past + i + 1, kv] @ q[i, h] / math.sqrt(d)
            out[i, h] = torch.softmax(s, dim=0) @ v[: n_past + i + 1, kv]
    hid = g + out.reshape(t, nh * d) @ w[p + "self_attn.o_proj.weight"].T
    m = rms(hid, w[p + "post_attention_layernorm.weight"], eps)
    gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
    hid = hid + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    logits = rms(hid, w["norm.weight"], eps) @ w["lm_head.weight"].T
    return logits, hid, (k, v)


@torch.no_grad()
def test_eagle3_forward_matches_the_algorithm_written_out():
    target = tiny_target()
    d = make("eagle3", target)  # draft vocab 24 of 61: d2t in use
    w = {k: (v.float() if v.is_floating_point() else v) for k, v in d.public_state_dict().items()}
    cfg = d.config
    ids = IDS[0]
    assert d.taps == (2, L // 2, L - 3)
    # The residual entering layer i, computed here layer by layer (HF hidden_states[i]).
    x, entering = target.model.embed_tokens(IDS), {}
    pos = torch.arange(IDS.shape[1])[None]
    cos, sin = target.rotary(pos, x.dtype)
    causal = torch.ones(IDS.shape[1], IDS.shape[1], dtype=torch.bool).tril()[None, None]
    for i, layer in enumerate(target.model.layers):
        entering[i] = x
        x = layer(x, cos, sin, causal, None, i)
    fused = torch.cat([entering[i] for i in (2, L // 2, L - 3)], dim=-1)[0]  # ascending layer order
    assert (d.fuse_taps(target(IDS, taps=d.taps).taps)[0] - fused).abs().max() < 1e-5

    # Prefill: taps of tokens 0..T-2 with the embeddings of tokens 1..T-1, positions 0..T-2.
    t = ids.numel() - 1
    emb = target.model.embed_tokens.weight[ids[1:]]
    ref_logits, ref_h, past = reference_step(w, cfg, emb, fused[:-1] @ w["fc.weight"].T, torch.arange(t), None)
    cache = d.new_cache(32)
    logits, h = d(fused[None, :-1], ids[None, 1:], cache=cache)
    assert (logits[0] - ref_logits).abs().max() < 1e-4
    assert (h[0] - ref_h).abs().max() < 1e-4

    # A draft step: the last position's pre-norm output fed back with a drafted token, at position T-1.
    top = int(ref_logits[-1].argmax())
    tok = top + int(w["d2t"][top])  # draft id -> target id
    assert tok == int(d.to_target_ids(torch.tensor(top)))
    emb2 = target.model.embed_tokens.weight[[tok]]
    ref2, ref_h2, _ = reference_step(w, cfg, emb2, ref_h[-1:], torch.tensor([t]), past)
    logits2, h2 = d(h[:, -1:], torch.tensor([[tok]]), cache=cache)
    assert (logits2[0] - ref2).abs().max() < 1e-4
    assert (h2[0] - ref_h2).abs().max() < 1e-4
    full = d.full_vocab_logits(logits2[0, 0])
    kept = torch.arange(cfg.draft_vocab_size) + w["d2t"]
    assert torch.equal(full[kept], logits2[0, 0]) and torch.isinf(full[~d.t2d]).all()


def test_checkpoint_lets_eagles_loader_take_the_target_embedding(tmp_path):
    """EAGLE's cnets.Model copies the target's embed_tokens only when config.json has no
    `target_hidden_size`; otherwise it expects embed_tokens.weight in the checkpoint and, lacking it,
    keeps random rows (the cause of τ 1.19 in its code, issue 26)."""
    target = tiny_target()
    d = make("eagle3", target)
    out = save_drafter(d, tmp_path / "e3")
    cfg = json.loads((out / "config.json").read_text())
    stored = set(load_file(str(out / "model.safetensors")))
    assert "target_hidden_size" not in cfg and "embed_tokens.weight" not in stored
    assert cfg["hidden_size"] == target.config.hidden_size and cfg["draft_vocab_size"] == 24
    assert {"d2t", "t2d", "fc.weight"} <= stored
    # A public config that does carry target_hidden_size (SpecForge style) still reads the same.
    cfg["target_hidden_size"] = target.config.hidden_size
    (out / "config.json").write_text(json.dumps(cfg))
    assert load_drafter(out, target).config == d.config
    # With the shared tensors included, the checkpoint is self-contained under either rule.
    out2 = save_drafter(d, tmp_path / "e3-full", include_shared=True)
    assert torch.equal(load_file(str(out2 / "model.safetensors"))["embed_tokens.weight"],
                       target.model.embed_tokens.weight)
