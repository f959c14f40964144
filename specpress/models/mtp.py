"""DeepSeek-V3-style multi-token-prediction (MTP) drafter, dense block.

h' = block(eh_proj(cat(enorm(emb(t_{i+1})), hnorm(h_i)))) (embedding FIRST); logits = shared head
(the target's lm_head) over shared_head.norm(h'). Chained for K steps by feeding h' back as h. The
block is a target-style decoder layer (Llama; Qwen3 q/k norms with qk_norm). h for the first step is
the target's final normed hidden (what vLLM passes). As in vLLM, the embedding at position 0 is zeroed.

Checkpoint keys use DeepSeek naming, `model.layers.{L + k}.{enorm, hnorm, eh_proj, shared_head.norm,
input_layernorm, self_attn.*, post_attention_layernorm, mlp.*}`, where L = the TARGET's layer count
(config `num_hidden_layers`) and k < `num_nextn_predict_layers`. `embed_tokens` and `shared_head.head`
are the target's (shared; dropped on load, written only when asked).
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
from specpress.models.layers import RMSNorm, Rotary
from specpress.models.target import DecoderLayer, TargetConfig

ARCHITECTURE = "LlamaForCausalLMMTP"  # no public runtime loads a dense-Llama MTP; the key names are DeepSeek's
UNSUPPORTED_KEYS = ("kv_lora_rank", "q_lora_rank", "n_routed_experts", "num_experts")


@dataclass(frozen=True)
class MTPConfig(LlamaDrafterConfig):
    family: ClassVar[str] = "mtp"

    num_target_layers: int = 32  # the target's num_hidden_layers: module k lives at model.layers.{L + k}
    num_nextn_predict_layers: int = 1
    qk_norm: bool = False  # Qwen3-style block (q_norm / k_norm)

    def validate(self) -> None:
        super().validate()
        for name in ("num_target_layers", "num_nextn_predict_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"mtp config: {name} must be >= 1, found {getattr(self, name)}")


class MTPLayer(DecoderLayer):
    """One MTP module: the decoder block plus enorm / hnorm / eh_proj / shared_head.norm."""

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__(cfg)
        h = cfg.hidden_size
        self.enorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(h, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(h, cfg.rms_norm_eps)

    def step(self, emb: Tensor, hidden: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
             cache: KVCache | None, layer: int) -> Tensor:
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(hidden)], dim=-1))
        return super().forward(x, cos, sin, mask, cache, layer)


class MTPDrafter(Drafter):
    family: ClassVar[str] = "mtp"

    def __init__(self, config: MTPConfig) -> None:
        super().__init__()
        self.config = config
        lc = config.layer_config(qk_norm=config.qk_norm)
        base = config.num_target_layers
        self.model = nn.Module()
        self.model.layers = nn.ModuleDict(
            {str(base + k): MTPLayer(lc) for k in range(config.num_nextn_predict_layers)})
        assert config.head_dim is not None
        self.rotary = Rotary(config.rope, config.head_dim, config.max_position_embeddings)

    def module(self, step: int) -> MTPLayer:
        """The MTP module used at chained step `step` (vLLM: step % num_nextn_predict_layers)."""
        k = step % self.config.num_nextn_predict_layers
        return self.model.layers[str(self.config.num_target_layers + k)]  # type: ignore[index,return-value]

    def draft_modules(self) -> int:
        return self.config.num_nextn_predict_layers

    def step_kwargs(self, step: int) -> dict[str, Any]:
        return {"step": step}

    def check_target(self, target: TargetConfig) -> None:
        self._mismatch("hidden_size", self.config.hidden_size, target.hidden_size)
        self._mismatch("vocab_size", self.config.vocab_size, target.vocab_size)
        self._mismatch("num_hidden_layers", self.config.num_target_layers, target.num_hidden_layers)

    def cache_dims(self) -> tuple[int, int, int]:
        c = self.config
        return c.num_nextn_predict_layers, c.num_key_value_heads, c.head_dim

    def shared_keys(self) -> dict[str, str]:
        out = {}
        for k in range(self.config.num_nextn_predict_layers):
            pre = f"model.layers.{self.config.num_target_layers + k}"
            out[f"{pre}.embed_tokens.weight"] = "embed_tokens"
            out[f"{pre}.shared_head.head.weight"] = "lm_head"
        return out

    def forward(self, hidden: Tensor, next_ids: Tensor, *, cache: KVCache | None = None,
                positions: Tensor | None = None, mask: Tensor | None = None, step: int = 0,
                logits: bool = True) -> tuple[Tensor | None, Tensor]:
        """One MTP pass over T positions.

        hidden [B, T, H]: the target's final normed hidden h_i (first step) or this drafter's previous
        h_out; next_ids [B, T]: token i+1 at each position i; positions [B, T] | [T] (default
        past..past+T-1) are the positions i of `hidden`; mask bool [T, past+T] | [B, T, past+T]
        (default causal); step selects the module (step % num_nextn_predict_layers), whose cache layer
        is written at [past, past+T) and advanced by T.
        Returns (logits [B, T, V] for token i+2 via the target head, or None; h_out [B, T, H]).
        """
        b, t = next_ids.shape
        if tuple(hidden.shape) != (b, t, self.config.hidden_size):
            raise ValueError(f"hidden must be [B, T, H] = [{b}, {t}, {self.config.hidden_size}], "
                             f"got {tuple(hidden.shape)}")
        past, pos, mask4 = self.step_inputs(cache, b, t, positions, mask, next_ids.device)
        emb = self.embed(next_ids).masked_fill((pos == 0)[..., None], 0.0)
        cos, sin = self.rotary(pos, emb.dtype)
        layer = self.module(step)
        h = layer.step(emb, hidden.to(emb.dtype), cos, sin, mask4, cache, step % self.config.num_nextn_predict_layers)
        if cache is not None:
            cache.length = past + t
        return (self.head(layer.shared_head.norm(h)) if logits else None), h


def read_config(cfg: Mapping[str, Any], source: str) -> MTPConfig:
    bad = [k for k in UNSUPPORTED_KEYS if cfg.get(k)]
    if bad:
        raise ConfigError(f"{source}: MTP modules with MLA/MoE blocks ({', '.join(bad)}) are not supported; "
                          f"specpress reads dense Llama/Qwen3-style MTP blocks only")
    qk_norm = cfg.get("model_type") == "qwen3" or bool(cfg.get("qk_norm", False))
    arch = "Qwen3ForCausalLM" if qk_norm else "LlamaForCausalLM"
    return MTPConfig(**LlamaDrafterConfig.llama_fields(cfg, source, arch=arch),
                     num_target_layers=int(cfg["num_hidden_layers"]),
                     num_nextn_predict_layers=int(cfg.get("num_nextn_predict_layers", 1)), qk_norm=qk_norm)


def write_config(config: MTPConfig) -> dict[str, Any]:
    out = config.llama_hf(config.num_target_layers, qk_norm=config.qk_norm)
    out["architectures"] = [ARCHITECTURE]
    out["num_nextn_predict_layers"] = config.num_nextn_predict_layers
    return out


def student_config(shape: Mapping[str, Any], spec: StudentSpec, target: TargetConfig, teacher: Any) -> MTPConfig:
    """A fresh student for distill: `spec.layers` MTP modules (default 1)."""
    return MTPConfig(**shape, num_target_layers=target.num_hidden_layers, num_nextn_predict_layers=spec.layers or 1,
                     qk_norm=target.qk_norm)


register_family(
    "mtp", MTPConfig, MTPDrafter, read_config, write_config,
    session="feature", policies=("mtp", "chain"), default_policy="mtp:3",
    teacher_forced=forced.chain, loss="chain",
    distill=DistillDefaults(grad_clip=0.5, ttt_steps=None, step_weights="mean",
                            published="DeepSeek-V3 MTP: the mean over depths of each module's cross-entropy"),
    prunable=("heads", "ffn"), draft_vocab="target", student=student_config, note="its modules are chained draft steps, not depth",
    detection=Detection(priority=30, fields=("num_nextn_predict_layers",)))
