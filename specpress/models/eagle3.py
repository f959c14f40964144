"""EAGLE-3 drafter.

g0 = fc(cat(target taps)) fuses the residual stream entering target layers {2, L//2, L-3} (HF
hidden_states indices; 3·H_t -> H, no bias). The midlayer reads cat(input_layernorm(emb), hidden_norm(g))
(2H) for q/k/v, keeps the raw g as its residual, then post_attention_layernorm + SwiGLU; its output g
(pre-norm) is fed back by later draft steps in place of fc(taps). logits = lm_head(norm(g)) over a
reduced draft vocabulary; target id = draft id + d2t[draft id]; t2d = bool[V] draft-vocab membership.
Public layout: `fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`
(+ optional `embed_tokens.weight`, shared with the target and dropped on load).

The draft head (models/heads.py) is dense by default; `head_rank` R factorises it (`lm_head.down.weight`
[R, H], `lm_head.up.weight` [Vd, R]; config.json `head_rank`), and `shared_head` drops it: the logits are
the target's lm_head rows of the draft vocabulary, borrowed at attach_target (config.json
`shared_head: true`). Neither is a public EAGLE-3 layout: `export hf` refuses them or writes a dense head.

`target_hidden_size` is written only when it differs from hidden_size (see write_config): EAGLE's
reference loader reads it as "this checkpoint stores its own embed_tokens".

Tap ids in config.json: `eagle_config.eagle_aux_hidden_state_layer_ids` follows SGLang/ModelOpt (id j =
output of layer j = tap j+1); a top-level `eagle_aux_hidden_state_layer_ids` follows vLLM (id j = the
residual entering layer j = tap j). Both are written, each in its own convention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Mapping

import torch
from torch import Tensor, nn

from specpress.errors import CheckpointError, ConfigError, RequestError
from specpress.models import forced
from specpress.models.drafter import Drafter, LlamaDrafterConfig, as_int_tuple, register_family, taps_option
from specpress.models.family import Detection, DistillDefaults, DistillOptions, StudentSpec
from specpress.models.heads import check_rank, make_head, shared_head_logits
from specpress.models.io import load_into
from specpress.models.kv import KVCache
from specpress.models.layers import MLP, RMSNorm, Rotary
from specpress.models.target import TargetAttention, TargetConfig

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


def default_taps(num_target_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low/mid/high taps: the residual entering layers 2, L//2, L-3."""
    n = num_target_layers
    return (2, n // 2, n - 3)


@dataclass(frozen=True)
class Eagle3Config(LlamaDrafterConfig):
    family: ClassVar[str] = "eagle3"

    draft_vocab_size: int = 32000
    target_hidden_size: int | None = None  # default: hidden_size
    # Taps in HF hidden_states indexing; None = default_taps(L) of the target it is attached to.
    target_layer_ids: tuple[int, ...] | None = None
    # The target's layer count the taps were taken from; None (public checkpoints) = not recorded.
    num_target_layers: int | None = None
    head_rank: int | None = None  # a low-rank draft head (models/heads.py); None = dense
    shared_head: bool = False  # no head of its own: the target's lm_head rows of the draft vocabulary

    def validate(self) -> None:
        super().validate()
        put = object.__setattr__
        if self.target_hidden_size is None:
            put(self, "target_hidden_size", self.hidden_size)
        put(self, "target_layer_ids", as_int_tuple(self.target_layer_ids, "target_layer_ids"))
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ConfigError(f"eagle3 config: draft_vocab_size must be in 1..vocab_size ({self.vocab_size}), "
                              f"found {self.draft_vocab_size}")
        if self.target_layer_ids is not None and not self.target_layer_ids:
            raise ConfigError("eagle3 config: target_layer_ids must name at least one tap (or be null)")
        if self.num_taps * self.target_hidden_size == self.hidden_size:  # type: ignore[operator]
            raise ConfigError("eagle3 config: num_taps * target_hidden_size equals hidden_size, so fused "
                              "target features and fed-back drafter features could not be told apart")
        check_rank(self.head_rank, self.hidden_size, self.draft_vocab_size, "eagle3")
        if self.shared_head and self.head_rank is not None:
            raise ConfigError("eagle3 config: shared_head (the target's head rows) and head_rank (a low-rank head of "
                              "its own) exclude each other; set one")

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids) if self.target_layer_ids else 3


class Eagle3Layer(nn.Module):
    """The `midlayer`: attention over cat(input_layernorm(emb), hidden_norm(g)), residual = g."""

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = TargetAttention(cfg, in_dim=2 * h)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size)

    def forward(self, emb: Tensor, g: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                cache: KVCache | None) -> Tensor:
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(g)], dim=-1)
        x = g + self.self_attn(x, cos, sin, mask, cache, 0)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Drafter(Drafter):
    family: ClassVar[str] = "eagle3"

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.config = config
        h, vd = config.hidden_size, config.draft_vocab_size
        assert config.target_hidden_size is not None and config.head_dim is not None
        self.fc = nn.Linear(config.num_taps * config.target_hidden_size, h, bias=False)
        self.midlayer = Eagle3Layer(config.layer_config())
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head: nn.Module | None = None if config.shared_head else make_head(h, vd, config.head_rank)
        self.register_buffer("d2t", torch.zeros(vd, dtype=torch.long))
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[:vd] = True
        self.register_buffer("t2d", t2d)
        self.rotary = Rotary(config.rope, config.head_dim, config.max_position_embeddings)

    # -- target -----------------------------------------------------------------------------------

    @property
    def taps(self) -> tuple[int, ...]:
        if self.config.target_layer_ids is not None:
            return self.config.target_layer_ids
        if self._shared is None:
            raise RequestError("this eagle3 drafter uses the default taps (2, L//2, L-3) of its target: "
                               "attach_target(target) first")
        return default_taps(self._shared.target_config.num_hidden_layers)

    def check_target(self, target: TargetConfig) -> None:
        c = self.config
        self._mismatch("hidden_size", c.hidden_size, target.hidden_size)
        self._mismatch("hidden_size (target_hidden_size)", c.target_hidden_size, target.hidden_size)
        self._mismatch("vocab_size", c.vocab_size, target.vocab_size)
        if c.num_target_layers is not None:  # like MTP / DFlash: taps of another depth mean other features
            self._mismatch("num_hidden_layers (num_target_layers)", c.num_target_layers, target.num_hidden_layers)
        taps = c.target_layer_ids or default_taps(target.num_hidden_layers)
        bad = [i for i in taps if not 0 <= i <= target.num_hidden_layers]
        if bad:
            raise CheckpointError(f"eagle3 drafter taps {list(taps)} include {bad}, outside the target's "
                                  f"hidden states 0..{target.num_hidden_layers}")

    def attach_target(self, target: Any) -> "Eagle3Drafter":
        """Attach, then record the taps used and the target's depth in the config (saved with the artifact)."""
        super().attach_target(target)
        c, n = self.config, target.config.num_hidden_layers
        if c.target_layer_ids is None or c.num_target_layers is None:
            self.config = replace(c, target_layer_ids=c.target_layer_ids or default_taps(n), num_target_layers=n)
        return self

    def cache_dims(self) -> tuple[int, int, int]:
        return 1, self.config.num_key_value_heads, self.config.head_dim

    # -- vocabulary -------------------------------------------------------------------------------

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        """Draft-vocab ids [...] -> target ids [...] (id + d2t[id])."""
        return draft_ids + self.d2t[draft_ids]

    def head_logits(self, x: Tensor) -> Tensor:
        """Normed features [B, T, H] -> draft-vocab logits [B, T, Vd]: its own head (dense or low rank), or the
        target's lm_head rows of the draft vocabulary (shared_head; needs attach_target)."""
        if self.lm_head is None:
            ids = self.to_target_ids(torch.arange(self.config.draft_vocab_size, device=self.d2t.device))
            head = self.shared.lm_head  # a head borrowed in another dtype (export validation) keeps its rows in .source
            return shared_head_logits(x, getattr(head, "source", head.weight), ids)
        return self.lm_head(x)

    def shared_head_params(self) -> int:
        c = self.config
        return c.draft_vocab_size * c.hidden_size if c.shared_head else 0

    def full_vocab_logits(self, logits: Tensor) -> Tensor:
        """Draft-vocab logits [..., Vd] -> target-vocab logits [..., V], -inf outside the draft vocab."""
        out = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        idx = self.to_target_ids(torch.arange(logits.shape[-1], device=logits.device))
        return out.index_copy(-1, idx, logits)

    @torch.no_grad()
    def set_draft_vocab(self, target_ids: Tensor) -> None:
        """Use target ids [Vd] (distinct, ascending) as the draft vocabulary: sets d2t and t2d."""
        ids = torch.as_tensor(target_ids, dtype=torch.long, device=self.d2t.device)
        if ids.shape != self.d2t.shape or (ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all())):
            raise RequestError(f"draft vocab must be {self.config.draft_vocab_size} distinct ascending target ids")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    # -- checkpoint -------------------------------------------------------------------------------

    def shared_keys(self) -> dict[str, str]:
        return {"embed_tokens.weight": "embed_tokens"}

    def load_public(self, weights: Mapping[str, Tensor], source: str) -> None:
        """`t2d` may be missing (ModelOpt, vLLM skip it): derived from d2t. `d2t` may be missing only
        when the draft vocab is the full vocab."""
        w = dict(weights)
        c = self.config
        if "d2t" not in w:
            if c.draft_vocab_size != c.vocab_size:
                raise CheckpointError(f"{source}: missing tensor 'd2t' (needed: draft_vocab_size "
                                      f"{c.draft_vocab_size} < vocab_size {c.vocab_size})")
            w["d2t"] = torch.zeros(c.draft_vocab_size, dtype=torch.long)
        w["d2t"] = w["d2t"].long()
        if "t2d" not in w and tuple(w["d2t"].shape) == (c.draft_vocab_size,):
            t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
            ids = w["d2t"] + torch.arange(c.draft_vocab_size)
            if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
                raise CheckpointError(f"{source}: d2t maps draft ids outside the vocabulary 0..{c.vocab_size - 1}")
            t2d[ids] = True
            w["t2d"] = t2d
        w["t2d"] = w["t2d"].bool()
        load_into(self, w, source)

    # -- forward ----------------------------------------------------------------------------------

    def forward(self, hidden_in: Tensor, input_ids: Tensor, *, cache: KVCache | None = None,
                positions: Tensor | None = None, mask: Tensor | None = None,
                logits: bool = True) -> tuple[Tensor | None, Tensor]:
        """One drafting pass over T new positions (prefill of accepted tokens, a chain step, a tree level).

        hidden_in: fused target taps [B, T, n·H_t] (fuse_taps(out.taps); fc is applied) or the drafter's
        own g [B, T, H] from the previous step; input_ids [B, T]: the token that follows each position.
        positions [B, T] | [T] (default past..past+T-1); mask bool [T, past+T] | [B, T, past+T]
        (default causal); cache: written at slots [past, past+T) and advanced by T.
        Returns (draft-vocab logits [B, T, Vd] or None when logits=False; g [B, T, H] pre-norm).
        """
        c = self.config
        b, t = input_ids.shape
        fused = c.num_taps * c.target_hidden_size  # type: ignore[operator]
        if tuple(hidden_in.shape[:2]) != (b, t) or hidden_in.shape[-1] not in (fused, c.hidden_size):
            raise ValueError(f"hidden_in must be [B, T, {fused}] (fused taps) or [B, T, {c.hidden_size}] "
                             f"(fed-back g) with B, T = {b}, {t}; got {tuple(hidden_in.shape)}")
        past, pos, mask4 = self.step_inputs(cache, b, t, positions, mask, input_ids.device)
        emb = self.embed(input_ids)
        g = hidden_in.to(emb.dtype)
        if g.shape[-1] == fused:
            g = self.fc(g)
        cos, sin = self.rotary(pos, g.dtype)
        g = self.midlayer(emb, g, cos, sin, mask4, cache)
        if cache is not None:
            cache.length = past + t
        return (self.head_logits(self.norm(g)) if logits else None), g


def read_config(cfg: Mapping[str, Any], source: str) -> Eagle3Config:
    fields = LlamaDrafterConfig.llama_fields({**cfg, "num_hidden_layers": 1}, source)
    nested = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    taps_nested = None if nested is None else tuple(int(j) + 1 for j in nested)
    taps_top = None if top is None else tuple(int(j) for j in top)
    if taps_nested is not None and taps_top is not None and taps_nested != taps_top:
        raise ConfigError(f"{source}: eagle_config.eagle_aux_hidden_state_layer_ids {list(nested)} (output of "
                          f"layer j) and eagle_aux_hidden_state_layer_ids {list(top)} (input of layer j) disagree")
    return Eagle3Config(**fields, draft_vocab_size=int(cfg.get("draft_vocab_size") or fields["vocab_size"]),
                        target_hidden_size=cfg.get("target_hidden_size") or fields["hidden_size"],
                        target_layer_ids=taps_nested or taps_top,
                        num_target_layers=int(cfg["num_target_layers"]) if cfg.get("num_target_layers") else None,
                        head_rank=cfg.get("head_rank"), shared_head=cfg.get("shared_head", False))


def write_config(config: Eagle3Config) -> dict[str, Any]:
    out = config.llama_hf(1)
    out["architectures"] = ["LlamaForCausalLMEagle3"]
    out["draft_vocab_size"] = config.draft_vocab_size
    if config.target_hidden_size != config.hidden_size:
        # Only when it differs: EAGLE's own loader (cnets.Model) copies the target's embedding into the
        # drafter only for configs WITHOUT target_hidden_size; with it, it expects embed_tokens.weight in
        # the checkpoint, so ours (which shares, not stores, the embedding) would run on random rows.
        out["target_hidden_size"] = config.target_hidden_size
    eagle: dict[str, Any] = {"use_aux_hidden_state": True, "use_input_layernorm_in_first_layer": True,
                             "use_last_layernorm": True}
    if config.target_layer_ids is not None:
        eagle["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in config.target_layer_ids]
        out["eagle_aux_hidden_state_layer_ids"] = list(config.target_layer_ids)
    out["eagle_config"] = eagle
    if config.num_target_layers is not None:
        out["num_target_layers"] = config.num_target_layers
    if config.head_rank is not None:
        out["head_rank"] = config.head_rank
    if config.shared_head:
        out["shared_head"] = True
    return out


MAX_DRAFT_VOCAB = 32000  # a fresh student's default draft vocabulary: min(target vocabulary, this)


def student_config(shape: Mapping[str, Any], spec: StudentSpec, target: TargetConfig,
                   teacher: Eagle3Config | None) -> Eagle3Config:
    """A fresh student for distill: one layer, `spec.draft_vocab` draft tokens (default the --from drafter's,
    else min(V, 32000)) within the teacher's, reading `spec.taps`."""
    if spec.layers not in (None, 1):
        raise RequestError(f"eagle3 drafters have exactly one layer (midlayer); --layers {spec.layers} is not possible")
    n = spec.draft_vocab
    if n is None:
        n = teacher.draft_vocab_size if teacher is not None else min(target.vocab_size, MAX_DRAFT_VOCAB)
    if teacher is not None and n > teacher.draft_vocab_size:
        raise RequestError(f"--draft-vocab {n} is larger than the --from drafter's draft vocabulary "
                           f"({teacher.draft_vocab_size}); the student's must be a subset of it")
    if n > target.vocab_size:
        raise RequestError(f"--draft-vocab {n} is larger than the target's vocabulary ({target.vocab_size})")
    return Eagle3Config(**shape, draft_vocab_size=n, target_layer_ids=spec.taps)


@dataclass(frozen=True)
class Eagle3Options(DistillOptions):
    """eagle3's distill options. taps: the target taps the student fuses (HF hidden_states indices, L = the
    final normed hidden; None = the published 2, L//2, L-3)."""

    taps: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "taps", taps_option(self.taps))


register_family(
    "eagle3", Eagle3Config, Eagle3Drafter, read_config, write_config,
    session="feature", policies=("chain", "tree", "dynamic"), default_policy="chain:4",
    teacher_forced=forced.chain, loss="chain",
    # lr 2e-3 with Muon were measured here (chain:4 tau 3.32 / 3.34 against 3.05 with AdamW 1e-3, BENCHMARKS.md)
    distill=DistillDefaults(lr=2e-3, optimizer="muon", grad_clip=0.5, ttt_steps=3, options=Eagle3Options,
                            published="EAGLE-3: training-time test, step weights 0.8^i, clip 0.5 (paper: 7 steps, "
                                      "AdamW lr 5e-5); the lr 2e-3 / Muon defaults were measured better here"),
    prunable=("heads", "ffn", "vocab", "head_rank", "share_head"), draft_vocab="reduced", student=student_config,
    speculators="eagle3",
    # draft_vocab_size marks an EAGLE-3 head only on a Llama-style (or unnamed) architecture: an unknown name
    # with it is some other model, refused rather than loaded as eagle3
    detection=Detection(priority=10, architectures=ARCHITECTURES, fields=("draft_vocab_size",),
                        fields_need_decoder=True))
