"""Drafter networks on a tiny random target: shapes, independent reference math, caches, registry, configs."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from drafters_common import CONFIGS, FAMILIES, IDS, SHAPE, H, L, V, make, run, tiny_target
from specpress.errors import CheckpointError, ConfigError, RequestError
from specpress.models.dflash import DFlashConfig, default_target_layer_ids
from specpress.models.drafter import build_drafter, family_names, get_family, register_family
from specpress.models.eagle import EagleConfig
from specpress.models.eagle3 import Eagle3Config
from specpress.models.target import TargetConfig, TargetModel


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return tiny_target()


# ------------------------------------------------------------------------------------ shapes


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_shapes(family, target):
    d = make(family, target)
    y = run(d, target)
    n = IDS.shape[1] - 1
    expected = {"eagle": (1, n, V + H), "eagle3": (1, n, 24 + H), "mtp": (1, n, V + H),
                "dflash": (1, 4, V), "lm": (1, n + 1, V)}[family]
    assert tuple(y.shape) == expected
    assert torch.isfinite(y).all() and y.abs().max() > 0.1


def test_eagle3_taps_fc_and_vocab(target):
    d = make("eagle3", target)
    assert d.taps == (2, 4, 5)  # (2, L//2, L-3), distinct for L = 8
    out = target(IDS, taps=d.taps)
    fused = d.fuse_taps(out.taps)
    with torch.no_grad():
        a = d(fused, IDS)
        b = d(d.fc(fused), IDS)  # feeding an H-dim g skips fc
    assert torch.allclose(a[0], b[0]) and torch.allclose(a[1], b[1])
    tids = d.to_target_ids(torch.arange(24))
    assert bool(d.t2d[tids].all()) and int(d.t2d.sum()) == 24
    full = d.full_vocab_logits(a[0])
    assert torch.equal(full[..., tids], a[0]) and torch.isinf(full).sum() == a[0].shape[1] * (V - 24)


# Independent references: plain torch math, transformers' rotary; written from algorithms.md §3 / §5.


def _rms(x, w, eps=1e-5):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _swiglu(mlp, x):
    return torch.nn.functional.silu(x @ mlp.gate_proj.weight.T) * (x @ mlp.up_proj.weight.T) @ mlp.down_proj.weight.T


def _attend(q, k, v, allowed):
    """q [T, Hq, D], k/v [S, Hkv, D], allowed bool [T, S] -> [T, Hq*D]."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("thd,shd->hts", q, k) / q.shape[-1] ** 0.5
    p = s.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hts,shd->thd", p, v).reshape(q.shape[0], -1)


def _rope(x, positions):
    """x [T, Hx, D] rotated at positions [T] with transformers' Llama rotary (theta 1e4)."""
    tr = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, rotate_half
    rot = LlamaRotaryEmbedding(tr.LlamaConfig(hidden_size=H, num_attention_heads=4, head_dim=8))
    cos, sin = rot(x, positions[None])
    cos, sin = cos[0][:, None], sin[0][:, None]
    return x * cos + rotate_half(x) * sin


def test_eagle3_matches_reference_math(target):
    d = make("eagle3", target)
    out = target(IDS, taps=d.taps)
    fused, ids = d.fuse_taps(out.taps)[0, :-1], IDS[0, 1:]
    m, t = d.midlayer, ids.shape[0]
    with torch.no_grad():
        emb = target.model.embed_tokens(ids)
        g = fused @ d.fc.weight.T
        x = torch.cat([_rms(emb, m.input_layernorm.weight), _rms(g, m.hidden_norm.weight)], -1)  # embedding first
        a = m.self_attn
        pos = torch.arange(t)
        q = _rope((x @ a.q_proj.weight.T).view(t, 4, 8), pos)
        k = _rope((x @ a.k_proj.weight.T).view(t, 2, 8), pos)
        v = (x @ a.v_proj.weight.T).view(t, 2, 8)
        h = g + _attend(q, k, v, torch.ones(t, t).tril().bool()) @ a.o_proj.weight.T  # residual = raw g
        h = h + _swiglu(m.mlp, _rms(h, m.post_attention_layernorm.weight))
        ref = _rms(h, d.norm.weight) @ d.lm_head.weight.T
        logits, g_out = d(fused[None], ids[None])
    assert (logits[0] - ref).abs().max() < 1e-4 and (g_out[0] - h).abs().max() < 1e-4


def _llama_block(layer, x, pos, norm_in=True):
    """A Llama decoder layer in plain math (causal); norm_in=False skips input_layernorm (EAGLE-1 layer 0)."""
    a, t = layer.self_attn, x.shape[0]
    hx = _rms(x, layer.input_layernorm.weight) if norm_in else x
    q = _rope((hx @ a.q_proj.weight.T).view(t, 4, 8), pos)
    k = _rope((hx @ a.k_proj.weight.T).view(t, 2, 8), pos)
    v = (hx @ a.v_proj.weight.T).view(t, 2, 8)
    x = x + _attend(q, k, v, torch.ones(t, t).tril().bool()) @ a.o_proj.weight.T
    return x + _swiglu(layer.mlp, _rms(x, layer.post_attention_layernorm.weight))


def test_eagle_and_mtp_match_reference_math(target):
    out = target(IDS)
    f, ids = out.hidden[0, :-1], IDS[0, 1:]
    pos = torch.arange(ids.shape[0])
    with torch.no_grad():
        e = make("eagle", target)
        emb = target.model.embed_tokens(ids)
        feat = _llama_block(e.layers[0], torch.cat([emb, f], -1) @ e.fc.weight.T + e.fc.bias, pos, norm_in=False)
        logits, g = e(f[None], ids[None])
        assert (g[0] - feat).abs().max() < 1e-4
        assert (logits[0] - feat @ target.lm_head.weight.T).abs().max() < 1e-4  # no final norm

        m = make("mtp", target)
        mod = m.model.layers[str(L)]
        emb0 = emb.clone()
        emb0[0] = 0  # position 0: embedding zeroed, as vLLM does
        x = torch.cat([_rms(emb0, mod.enorm.weight), _rms(f, mod.hnorm.weight)], -1) @ mod.eh_proj.weight.T
        h = _llama_block(mod, x, pos)
        logits, h_out = m(f[None], ids[None])
        assert (h_out[0] - h).abs().max() < 1e-4
        assert (logits[0] - _rms(h, mod.shared_head.norm.weight) @ target.lm_head.weight.T).abs().max() < 1e-4


def test_dflash_matches_reference_math(target):
    d = make("dflash", target)
    out = target(IDS, taps=d.taps)
    c = 8
    ctx_in = torch.cat([out.taps[2], out.taps[6]], -1)[0, :c]  # target_layer_ids (1, 5) -> hidden_states[2], [6]
    block = torch.tensor([int(IDS[0, c]), 0, 0, 0])
    with torch.no_grad():
        ctx = _rms(ctx_in @ d.fc.weight.T, d.hidden_norm.weight)
        x = target.model.embed_tokens(block)
        pos = torch.arange(c + 4)
        for layer in d.layers:
            a = layer.self_attn
            hx = _rms(x, layer.input_layernorm.weight)
            kv_in = torch.cat([ctx, hx], 0)  # K/V from [context ; block], queries from the block only
            q = _rope(_rms((hx @ a.q_proj.weight.T).view(4, 4, 8), a.q_norm.weight, 1e-5), pos[c:])
            k = _rope(_rms((kv_in @ a.k_proj.weight.T).view(c + 4, 2, 8), a.k_norm.weight, 1e-5), pos)
            v = (kv_in @ a.v_proj.weight.T).view(c + 4, 2, 8)
            x = x + _attend(q, k, v, torch.ones(4, c + 4, dtype=torch.bool)) @ a.o_proj.weight.T  # non-causal
            x = x + _swiglu(layer.mlp, _rms(x, layer.post_attention_layernorm.weight))
        ref = _rms(x, d.norm.weight) @ target.lm_head.weight.T
        got = d(ctx_in[None], block[None])
    assert (got[0] - ref).abs().max() < 1e-4


def test_dflash_is_non_causal_and_defaults():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(8, 1) == (4,)
    assert DFlashConfig(**SHAPE, num_hidden_layers=2, num_target_layers=L).target_layer_ids == (1, 5)


def test_dflash_block_sees_later_block_tokens(target):
    d = make("dflash", target)
    out = target(IDS, taps=d.taps)
    ctx = d.fuse_taps(out.taps)[:, :8]
    block = d.make_block(IDS[:, 8])
    other = block.clone()
    other[0, 3] = 7
    with torch.no_grad():
        a, b = d(ctx, block), d(ctx, other)
    assert not torch.allclose(a[0, 0], b[0, 0])  # position 0 attends to block position 3


def test_deepcopy_keeps_sharing_the_target(target):
    d = make("eagle", target)
    c = copy.deepcopy(d)
    assert c.shared.embed_tokens is target.model.embed_tokens
    assert "embed_tokens.weight" not in d.state_dict() and "lm_head.weight" not in d.state_dict()


def test_unattached_drafter_says_what_to_do():
    d = build_drafter(CONFIGS["eagle"])
    with pytest.raises(RequestError, match="attach_target"):
        d(torch.zeros(1, 2, H), torch.zeros(1, 2, dtype=torch.long))


# ------------------------------------------------------------------------------------ caches


@pytest.mark.parametrize("family", ["eagle", "eagle3", "mtp", "lm"])
def test_cache_compact_and_crop_equal_a_fresh_run(family, target):
    """Prefill, draft 3 sibling candidates at one position (tree mask), keep the real one by compact,
    then one more token: equals a fresh run of the kept tokens. Same with junk written then cropped."""
    d = make(family, target)
    n, p = IDS.shape[1] - 1, 7
    out = target(IDS, taps=d.taps)
    if family == "lm":
        x, ids = None, IDS[:, :n]
    else:
        x = (d.fuse_taps(out.taps) if family == "eagle3" else out.hidden)[:, :n]
        ids = IDS[:, 1:]

    def step(sl, **kw):
        with torch.no_grad():
            if family == "lm":
                return d(ids[:, sl], logits="all", **kw).logits
            return d(x[:, sl], ids[:, sl], **kw)[0]

    fresh = step(slice(0, p + 2))
    for mode in ("compact", "crop"):
        cache = d.new_cache(32)
        step(slice(0, p), cache=cache)
        junk = torch.tensor([[2, 3, 5]]) if mode == "compact" else torch.tensor([[2, 3]])
        cand_ids = ids[:, p:p + 1].repeat(1, junk.shape[1])
        cand_ids[0, 1:] = junk[0, 1:]  # candidate 0 is the real token, the others are siblings
        k = cand_ids.shape[1]
        mask = torch.cat([torch.ones(k, p, dtype=torch.bool), torch.eye(k, dtype=torch.bool)], dim=1)
        with torch.no_grad():
            if family == "lm":
                d(cand_ids, cache=cache, positions=torch.full((k,), p), mask=mask)
            else:
                d(x[:, p:p + 1].repeat(1, k, 1), cand_ids, cache=cache, positions=torch.full((k,), p), mask=mask)
        if mode == "compact":
            cache.compact(p, [0])
            got = step(slice(p + 1, p + 2), cache=cache)
        else:
            cache.crop(p)
            got = step(slice(p, p + 2), cache=cache)[:, -1:]
        assert cache.length == p + 2
        assert (got - fresh[:, p + 1:p + 2]).abs().max() < 1e-5, mode


def test_dflash_context_cache_persists_and_block_is_dropped(target):
    d = make("dflash", target)
    out = target(IDS, taps=d.taps)
    ctx = d.fuse_taps(out.taps)
    with torch.no_grad():
        fresh = d(ctx[:, :9], d.make_block(IDS[:, 9]))
        cache = d.new_cache(32)
        d(ctx[:, :5], d.make_block(IDS[:, 5]), cache=cache)  # round 1: context 0..4, block at 5..8
        assert cache.length == 5
        got = d(ctx[:, 5:9], d.make_block(IDS[:, 9]), cache=cache)  # round 2: context 5..8, block at 9..12
        assert cache.length == 9
        d(ctx[:, 9:10], d.make_block(IDS[:, 10]), cache=cache, keep_block=True)
        assert cache.length == 14
    assert (got - fresh).abs().max() < 1e-5


# ------------------------------------------------------------------------------------ errors


def test_vocab_mismatch_is_clear(target):
    other = TargetModel(TargetConfig(**{**SHAPE, "vocab_size": 50}, num_hidden_layers=L))
    with pytest.raises(CheckpointError, match="vocab_size"):
        build_drafter(CONFIGS["eagle3"], other)


def test_unknown_family_lists_the_known_ones():
    with pytest.raises(ConfigError, match="medusa.*eagle, eagle3, lm, mtp") as e:
        get_family("medusa")
    assert "dflash" in str(e.value)
    assert family_names() == ["dflash", "eagle", "eagle3", "lm", "mtp"]
    fam = get_family("eagle")
    with pytest.raises(ValueError, match="already registered"):
        register_family("eagle", fam.config_cls, fam.model_cls, fam.reader, fam.writer)


@pytest.mark.parametrize("family", FAMILIES)
def test_config_dict_round_trip_and_unknown_key(family):
    cfg = CONFIGS[family]
    d = cfg.to_dict()
    assert type(cfg).from_dict(json.loads(json.dumps(d))) == cfg
    with pytest.raises(ConfigError, match=r"'hiden_size'.*allowed:.*hidden_size"):
        type(cfg).from_dict({**d, "hiden_size": 3})


def test_config_values_validated():
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        Eagle3Config(**SHAPE, draft_vocab_size=V + 1)
    with pytest.raises(ConfigError, match="target_layer_ids"):
        DFlashConfig(**SHAPE, num_target_layers=L, target_layer_ids=(1, 9))
    with pytest.raises(ConfigError, match="mask_token_id"):
        DFlashConfig(**SHAPE, num_target_layers=L, mask_token_id=V)
    with pytest.raises(ConfigError, match="hidden_size"):
        EagleConfig(**{**SHAPE, "hidden_size": "32"})
    with pytest.raises(ConfigError, match="version"):
        EagleConfig.from_dict({**CONFIGS["eagle"].to_dict(), "version": 99})
