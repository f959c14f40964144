"""EAGLE-1 drafter (also run by the EAGLE-2 dynamic-tree policy).

feature g = layers(fc(cat(emb(next token), f))), where f is the target's final normed hidden state (what
its lm_head sees); `layers.0` has no input_layernorm and there is no final norm; logits = target
lm_head(g). Later draft steps feed back g in place of f. Public layout (SafeAILab/EAGLE `cnets1.py`):
`fc.{weight,bias}`, `layers.0.self_attn.*`, `layers.0.mlp.*`, `layers.0.post_attention_layernorm.weight`;
config.json is a plain LlamaForCausalLM with num_hidden_layers 1 plus `bias` (the fc bias).
The target's embed_tokens and lm_head are shared (attach_target), not stored unless asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch
from torch import Tensor, nn

from specpress.errors import ConfigError
from specpress.models import forced
from specpress.models.drafter import Drafter, LlamaDrafterConfig, register_family
from specpress.models.family import Detection, DistillDefaults, StudentSpec
from specpress.models.kv import KVCache
from specpress.models.layers import Rotary
from specpress.models.target import DecoderLayer, TargetConfig


@dataclass(frozen=True)
class EagleConfig(LlamaDrafterConfig):
    family: ClassVar[str] = "eagle"

    num_hidden_layers: int = 1
    bias: bool = True  # fc bias (EAGLE-1 config field `bias`)

    def validate(self) -> None:
        super().validate()
        if self.num_hidden_layers < 1:
            raise ConfigError(f"eagle config: num_hidden_layers must be >= 1, found {self.num_hidden_layers}")




class EagleDrafter(Drafter):
    family: ClassVar[str] = "eagle"

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        lc = config.layer_config(config.num_hidden_layers)
        self.fc = nn.Linear(2 * h, h, bias=config.bias)
        self.layers = nn.ModuleList(DecoderLayer(lc, input_norm=i > 0) for i in range(config.num_hidden_layers))
        assert config.head_dim is not None
        self.rotary = Rotary(config.rope, config.head_dim, config.max_position_embeddings)

    def check_target(self, target: TargetConfig) -> None:
        self._mismatch("hidden_size", self.config.hidden_size, target.hidden_size)
        self._mismatch("vocab_size", self.config.vocab_size, target.vocab_size)

    def cache_dims(self) -> tuple[int, int, int]:
        c = self.config
        return c.num_hidden_layers, c.num_key_value_heads, c.head_dim

    def shared_keys(self) -> dict[str, str]:
        return {"embed_tokens.weight": "embed_tokens", "lm_head.weight": "lm_head"}

    def forward(self, hidden_in: Tensor, input_ids: Tensor, *, cache: KVCache | None = None,
                positions: Tensor | None = None, mask: Tensor | None = None,
                logits: bool = True) -> tuple[Tensor | None, Tensor]:
        """One drafting pass over T new positions (prefill of accepted tokens, a chain step, a tree level).

        hidden_in [B, T, H]: the target's final normed hidden f at each position, or the drafter's own
        g from the previous step; input_ids [B, T]: the token that follows each position.
        positions [B, T] | [T] (default past..past+T-1); mask bool [T, past+T] | [B, T, past+T]
        (default causal); cache: written at slots [past, past+T) and advanced by T.
        Returns (logits [B, T, V] through the target's lm_head, or None when logits=False; g [B, T, H]).
        """
        b, t = input_ids.shape
        if tuple(hidden_in.shape) != (b, t, self.config.hidden_size):
            raise ValueError(f"hidden_in must be [B, T, H] = [{b}, {t}, {self.config.hidden_size}], "
                             f"got {tuple(hidden_in.shape)}")
        past, pos, mask4 = self.step_inputs(cache, b, t, positions, mask, input_ids.device)
        emb = self.embed(input_ids)
        x = self.fc(torch.cat([emb, hidden_in.to(emb.dtype)], dim=-1))
        cos, sin = self.rotary(pos, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask4, cache, i)
        if cache is not None:
            cache.length = past + t
        return (self.head(x) if logits else None), x


def read_config(cfg: Mapping[str, Any], source: str) -> EagleConfig:
    return EagleConfig(**LlamaDrafterConfig.llama_fields(cfg, source),
                       num_hidden_layers=int(cfg.get("num_hidden_layers", 1)), bias=bool(cfg.get("bias", True)))


def write_config(config: EagleConfig) -> dict[str, Any]:
    out = config.llama_hf(config.num_hidden_layers)
    out["bias"] = config.bias
    return out


def student_config(shape: Mapping[str, Any], spec: StudentSpec, target: TargetConfig, teacher: Any) -> EagleConfig:
    """A fresh student for distill: `spec.layers` layers (default 1)."""
    return EagleConfig(**shape, num_hidden_layers=spec.layers or 1)


register_family(
    "eagle", EagleConfig, EagleDrafter, read_config, write_config,
    session="feature", policies=("chain", "tree", "dynamic"), default_policy="chain:4",
    teacher_forced=forced.chain, loss="chain",
    distill=DistillDefaults(grad_clip=0.5, feature_regression=True, published="EAGLE-1: SmoothL1 on the next feature + 0.1 CE through the "
                            "target head, feature noise U(-0.1, 0.1), clip 0.5 (paper lr 3e-5 at 7B; 1e-3 here)"),
    prunable=("layers", "heads", "ffn"), layer_stack="layers", pinned_layers=(0,), draft_vocab="target",
    student=student_config,
    note="layer 0 has no input norm (it reads fc's output) and stays",
    # EAGLE-1's `fc` among the tensors (its `bias` config field, when the tensor names are not known)
    detection=Detection(priority=40, fields=("bias",), weights=("fc.weight",)))
