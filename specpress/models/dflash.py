"""DFlash block-diffusion drafter (z-lab/dflash `model.py`, SpecForge).

Context: the outputs of target layers `target_layer_ids` (HF hidden_states[id + 1]), concatenated ->
`fc` (n·H -> H, no bias) -> `hidden_norm` = H_ctx. Each Qwen3-style layer (q_norm / k_norm) takes its
queries from the block tokens only and its K/V from [H_ctx ; normed block hidden] ("KV injection"),
non-causally, with RoPE over context + block positions; a final `norm`, then the target's lm_head. The
input block is [anchor, MASK x (B-1)]; outputs 1..B-1 are the drafts. No own embedding or head: both are
the target's. Public layout: `fc.weight`, `hidden_norm.weight`, `layers.{i}.*`, `norm.weight`; config
`architectures: ["DFlashDraftModel"]`, `block_size`, `dflash_config: {mask_token_id, target_layer_ids}`,
`num_target_layers`, `model_type: qwen3`. An `auto_map` is ignored: no checkpoint code ever runs.

Optional (markov_rank > 0): DSpark's sequential Markov head (algorithms.md §6), a low-rank bigram bias
`markov_w2(markov_w1[x_{k-1}])` added to block position k's logits, with x_{k-1} the token before it
(the anchor for k = 1, then the previous draft), so drafts are chosen left to right. Tensors
`markov_head.markov_w1.weight` [V, r] and `markov_head.markov_w2.weight` [V, r] as DSpark names them;
config `dflash_config.markov_rank`. Only the head is DSpark's: the block layout stays DFlash's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch
from torch import Tensor, nn

from specpress.errors import ConfigError, RequestError
from specpress.models import forced
from specpress.models.drafter import Drafter, LlamaDrafterConfig, as_int_tuple, register_family, taps_option
from specpress.models.family import Detection, DistillDefaults, DistillOptions, StudentSpec, positive_option
from specpress.models.kv import KVCache
from specpress.models.layers import MLP, RMSNorm, Rotary, apply_rotary, attention, resolve_mask, resolve_positions
from specpress.models.target import TargetAttention, TargetConfig

ARCHITECTURE = "DFlashDraftModel"


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """DFlash's default: one layer -> L//2; else n ids spread over [1, L-3] (Python round, as upstream)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    return tuple(int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers))


@dataclass(frozen=True)
class DFlashConfig(LlamaDrafterConfig):
    family: ClassVar[str] = "dflash"

    num_hidden_layers: int = 5
    num_target_layers: int = 36
    block_size: int = 16
    # The id fed at the MASK slots: only an input-embedding row, so any existing id works (e.g. pad).
    mask_token_id: int | None = None
    # Target layers whose OUTPUT is read (tap = id + 1); None -> default_target_layer_ids.
    target_layer_ids: tuple[int, ...] | None = None
    # DSpark's sequential Markov head: rank of the bigram bias (0 = none, plain DFlash).
    markov_rank: int = 0

    def validate(self) -> None:
        super().validate()
        for name in ("num_hidden_layers", "num_target_layers", "block_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"dflash config: {name} must be >= 1, found {getattr(self, name)}")
        r = self.markov_rank
        if not isinstance(r, int) or isinstance(r, bool) or r < 0:
            raise ConfigError(f"dflash config: markov_rank must be an integer >= 0 (0 = no Markov head), "
                              f"found {r!r}")
        ids = as_int_tuple(self.target_layer_ids, "target_layer_ids")
        if ids is None:
            ids = default_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        object.__setattr__(self, "target_layer_ids", ids)
        bad = [i for i in ids if not 0 <= i < self.num_target_layers]
        if not ids or bad:
            raise ConfigError(f"dflash config: target_layer_ids {list(ids)} must be non-empty layer indices in "
                              f"0..{self.num_target_layers - 1} (num_target_layers)")
        m = self.mask_token_id
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or not 0 <= m < self.vocab_size):
            raise ConfigError(f"dflash config: mask_token_id must be a token id in 0..{self.vocab_size - 1}, found {m!r}")


class InjectedAttention(TargetAttention):
    """Qwen3 attention whose K/V also cover the context features ([ctx ; block]); queries = block."""

    def forward(self, x: Tensor, ctx: Tensor, cos: Tensor, sin: Tensor,  # type: ignore[override]
                mask: Tensor | None, cache: KVCache | None, layer: int) -> Tensor:
        """x [B, T, H] block (normed), ctx [B, C, H]; cos/sin [B, 1, C+T, D]; mask [B|1, 1, T, S] | None."""
        b, t, _ = x.shape
        c = ctx.shape[1]
        kv_in = torch.cat([ctx, x], dim=1)
        q = self.q_norm(self.q_proj(x).view(b, t, self.nq, self.d))
        k = self.k_norm(self.k_proj(kv_in).view(b, c + t, self.nkv, self.d))
        v = self.v_proj(kv_in).view(b, c + t, self.nkv, self.d).transpose(1, 2)
        q = apply_rotary(q.transpose(1, 2), cos[:, :, c:], sin[:, :, c:])
        k = apply_rotary(k.transpose(1, 2), cos, sin)
        if cache is not None:
            k, v = cache.write(layer, k, v)
        out = attention(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.nq * self.d))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = InjectedAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: Tensor, ctx: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                cache: KVCache | None, layer: int) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin, mask, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """bias(x_prev) = markov_w2(markov_w1[x_prev]): a rank-r bigram correction over the vocabulary."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        nn.init.zeros_(self.markov_w2.weight)  # starts as plain DFlash

    def forward(self, prev_ids: Tensor) -> Tensor:
        """prev_ids [...] -> bias [..., V]."""
        return self.markov_w2(self.markov_w1(prev_ids))


class DFlashDrafter(Drafter):
    family: ClassVar[str] = "dflash"

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        assert config.target_layer_ids is not None and config.head_dim is not None
        lc = config.layer_config(config.num_hidden_layers, qk_norm=True)
        self.fc = nn.Linear(len(config.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(lc) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.rotary = Rotary(config.rope, config.head_dim, config.max_position_embeddings)
        self.markov_head = MarkovHead(config.vocab_size, config.markov_rank) if config.markov_rank else None

    @property
    def taps(self) -> tuple[int, ...]:
        assert self.config.target_layer_ids is not None
        return tuple(i + 1 for i in self.config.target_layer_ids)

    def check_target(self, target: TargetConfig) -> None:
        self._mismatch("hidden_size", self.config.hidden_size, target.hidden_size)
        self._mismatch("vocab_size", self.config.vocab_size, target.vocab_size)
        self._mismatch("num_hidden_layers (num_target_layers)", self.config.num_target_layers,
                       target.num_hidden_layers)

    def cache_dims(self) -> tuple[int, int, int]:
        c = self.config
        return c.num_hidden_layers, c.num_key_value_heads, c.head_dim

    def shared_keys(self) -> dict[str, str]:
        return {"embed_tokens.weight": "embed_tokens", "lm_head.weight": "lm_head"}

    def make_block(self, anchor_ids: Tensor, block_size: int | None = None) -> Tensor:
        """anchor_ids [B] -> block ids [B, Bk] = [anchor, MASK x (Bk-1)] (Bk defaults to block_size)."""
        if self.config.mask_token_id is None:
            raise RequestError("this dflash drafter's config has no mask_token_id (dflash_config.mask_token_id); "
                               "set one (any token id works, e.g. the pad id) before drafting")
        n = block_size or self.config.block_size
        block = anchor_ids.new_full((anchor_ids.shape[0], n), self.config.mask_token_id)
        block[:, 0] = anchor_ids
        return block

    def features(self, ctx_hidden: Tensor | None, block_ids: Tensor, *, cache: KVCache | None = None,
                 positions: Tensor | None = None, mask: Tensor | None = None,
                 keep_block: bool = False) -> Tensor:
        """Final normed block hidden states [B, Bk, H] (see forward for the arguments)."""
        b, bk = block_ids.shape
        h = self.config.hidden_size
        x = self.embed(block_ids)
        if ctx_hidden is None:
            ctx = x.new_zeros(b, 0, h)
        else:
            n = len(self.taps) * h
            if ctx_hidden.dim() != 3 or ctx_hidden.shape[0] != b or ctx_hidden.shape[2] != n:
                raise ValueError(f"ctx_hidden must be [B, C, {n}] (fuse_taps of taps {list(self.taps)}) with "
                                 f"B = {b}; got {tuple(ctx_hidden.shape)}")
            ctx = self.hidden_norm(self.fc(ctx_hidden.to(x.dtype)))
        c, dev = ctx.shape[1], block_ids.device
        past = cache.reserve(c + bk) if cache is not None else 0
        pos = resolve_positions(positions, b, c + bk, past, dev)
        mask4 = resolve_mask(mask, c + bk, past, dev, causal=False, queries=bk)
        cos, sin = self.rotary(pos, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, ctx, cos, sin, mask4, cache, i)
        if cache is not None:
            cache.length = past + c + (bk if keep_block else 0)
        return self.norm(x)

    def forward(self, ctx_hidden: Tensor | None, block_ids: Tensor, *, cache: KVCache | None = None,
                positions: Tensor | None = None, mask: Tensor | None = None,
                keep_block: bool = False) -> Tensor:
        """Draft one block in a single pass.

        ctx_hidden [B, C, n·H]: fused target taps (fuse_taps(out.taps)) of the C context positions new
        since the last call, or None; block_ids [B, Bk] = make_block(anchor) ([anchor, MASK…]).
        positions [B, C+Bk] | [C+Bk]: positions of the new context then the block (default
        past..past+C+Bk-1); mask bool [Bk, past+C+Bk] | [B, Bk, past+C+Bk] (default: all visible).
        cache: context K/V persist (length advances by C); the block's K/V are dropped after the pass
        unless keep_block. Returns logits [B, Bk, V] through the target's lm_head (drafts at 1..Bk-1).
        """
        return self.head(self.features(ctx_hidden, block_ids, cache=cache, positions=positions, mask=mask,
                                       keep_block=keep_block))

    def with_markov(self, logits: Tensor, prev_ids: Tensor) -> Tensor:
        """Logits of block positions [..., V] plus the Markov bias of the tokens before them (unchanged
        without a Markov head). Training passes the true previous tokens; drafting passes its own."""
        if self.markov_head is None:
            return logits
        return logits + self.markov_head(prev_ids).to(logits.dtype)

    @torch.no_grad()
    def greedy_drafts(self, logits: Tensor, anchor: int) -> list[int]:
        """logits [Bk, V] of one block -> drafts at positions 1..Bk-1: each position's argmax, or with a
        Markov head left to right, each position biased by the draft before it (the anchor first)."""
        if self.markov_head is None:
            return logits[1:].argmax(-1).tolist()
        drafts, prev = [], anchor
        prev_t = torch.empty(1, dtype=torch.long, device=logits.device)
        for k in range(1, logits.shape[0]):
            prev_t[0] = prev
            prev = int(self.with_markov(logits[k:k + 1], prev_t).argmax(-1))
            drafts.append(prev)
        return drafts


def read_config(cfg: Mapping[str, Any], source: str) -> DFlashConfig:
    """A DFlash config.json (z-lab / SpecForge); `auto_map` and other HF boilerplate are ignored."""
    types = set(cfg.get("layer_types") or ["full_attention"])
    if types != {"full_attention"} or cfg.get("is_causal"):
        raise ConfigError(f"{source}: DFlash layers other than non-causal full attention "
                          f"(layer_types {sorted(types)}, is_causal {cfg.get('is_causal')}) are not supported")
    extra = cfg.get("dflash_config") or {}

    def get(key: str, default: Any = None) -> Any:
        return extra.get(key, cfg.get(key, default))

    for key in ("input_embedding_scale", "output_multiplier"):
        if get(key) is not None and float(get(key)) != 1.0:
            raise ConfigError(f"{source}: dflash_config.{key} = {get(key)} is not supported (only 1.0)")
    if get("final_logit_softcapping") not in (None, 0, 0.0):
        raise ConfigError(f"{source}: dflash_config.final_logit_softcapping is not supported")
    if not cfg.get("num_target_layers"):
        raise ConfigError(f"{source}: a DFlash config needs 'num_target_layers' (the target's layer count)")
    ids, mask = get("target_layer_ids"), get("mask_token_id")
    if get("markov_head_type", "vanilla") != "vanilla":
        raise ConfigError(f"{source}: dflash_config.markov_head_type {get('markov_head_type')!r} is not supported "
                          f"(only 'vanilla', the low-rank bigram head)")
    return DFlashConfig(**LlamaDrafterConfig.llama_fields(cfg, source, arch="Qwen3ForCausalLM"),
                        num_hidden_layers=int(cfg.get("num_hidden_layers", 1)),
                        num_target_layers=int(cfg["num_target_layers"]), block_size=int(get("block_size", 16)),
                        mask_token_id=None if mask is None else int(mask),
                        target_layer_ids=None if ids is None else tuple(int(i) for i in ids),
                        markov_rank=int(get("markov_rank", 0) or 0))


def write_config(config: DFlashConfig) -> dict[str, Any]:
    out = config.llama_hf(config.num_hidden_layers, qk_norm=True)
    out["architectures"] = [ARCHITECTURE]
    out["block_size"] = config.block_size
    out["num_target_layers"] = config.num_target_layers
    out["layer_types"] = ["full_attention"] * config.num_hidden_layers
    dcfg: dict[str, Any] = {"target_layer_ids": list(config.target_layer_ids or ())}
    if config.mask_token_id is not None:
        dcfg["mask_token_id"] = config.mask_token_id
    if config.markov_rank:
        dcfg["markov_rank"] = config.markov_rank
        dcfg["markov_head_type"] = "vanilla"
    out["dflash_config"] = dcfg
    return out


def student_config(shape: Mapping[str, Any], spec: StudentSpec, target: TargetConfig, teacher: Any) -> DFlashConfig:
    """A fresh student for distill: `spec.layers` layers (default 2) reading `spec.taps` (HF hidden_states
    indices; default the published spread), blocks of `spec.block_size`."""
    n_layers = spec.layers or 2
    if spec.taps is not None:  # HF hidden_states indices, like eagle3's; DFlash reads layer id = tap - 1
        bad = [i for i in spec.taps if not 1 <= i <= target.num_hidden_layers]
        if bad:
            n = target.num_hidden_layers
            raise RequestError(f"--taps {bad} out of range for dflash: HF hidden_states indices 1..{n} "
                               f"(the output of layer i-1; {n} = the final normed hidden)")
        ids = tuple(sorted({i - 1 for i in spec.taps}))
    else:
        ids = tuple(sorted(set(default_target_layer_ids(target.num_hidden_layers, n_layers))))
    mask = spec.mask_token_id if spec.mask_token_id is not None else 0
    if not 0 <= mask < target.vocab_size:
        raise RequestError(f"--mask-token-id {mask} is outside the target's vocabulary 0..{target.vocab_size - 1}")
    return DFlashConfig(**shape, num_hidden_layers=n_layers, num_target_layers=target.num_hidden_layers,
                        block_size=spec.block_size, mask_token_id=mask, target_layer_ids=ids,
                        markov_rank=spec.markov_rank or 0)


@dataclass(frozen=True)
class DFlashOptions(DistillOptions):
    """dflash's distill options. taps: the target taps fused (None = the published spread over the layers);
    gamma: the block loss's decay, position k weighs e^{-(k-1)/gamma} (None = DFlash's published value for the
    block size); markov_rank: DSpark's sequential Markov head of this rank (None = none); tv_weight: per
    position (1 - w)·CE + w·||p_draft - p_target||_1 (DSpark's loss at w = 0.9; 0 = CE only)."""

    taps: tuple[int, ...] | None = None
    gamma: float | None = None
    markov_rank: int | None = None
    tv_weight: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "taps", taps_option(self.taps))
        tv = self.tv_weight
        if not isinstance(tv, (int, float)) or isinstance(tv, bool) or not 0 <= tv <= 1:
            raise ConfigError(f"distill config field 'tv_weight' must be a number in [0, 1], found {tv!r}")
        positive_option("gamma", self.gamma)
        positive_option("markov_rank", self.markov_rank, integer=True)


# measured on the zoo (BENCHMARKS.md, DFlash recipe): tau 3.27 at block:8 in 10 minutes on target-regenerated
# data (6,144 + 12,288 sequences), against about 2.0 with the defaults on the corpus
MEASURED = {"markov_rank": 128, "lr": 3e-3, "optimizer": "muon", "gamma": 1.0, "minutes": 10.0}
REGENERATE = {"sequences": 18432, "batch": 128}

register_family(
    "dflash", DFlashConfig, DFlashDrafter, read_config, write_config,
    session="block", policies=("block",), default_policy="block:8",
    teacher_forced=forced.block, loss="block",
    distill=DistillDefaults(options=DFlashOptions, measured=MEASURED,
                            regenerate=REGENERATE,
                            published="DFlash: random anchors, the block mask, CE weighted by exp(-(k-1)/gamma) "
                                      "with gamma 7/5/4 for blocks of 16/10/8, AdamW, clip 1.0"),
    prunable=("layers", "heads", "ffn"), layer_stack="layers", draft_vocab="target", student=student_config,
    speculators="dflash",
    detection=Detection(priority=20, architectures=(ARCHITECTURE,), fields=("dflash_config",)))
