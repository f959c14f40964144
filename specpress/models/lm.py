"""An independent small causal LM drafter sharing the target's tokenizer.

It IS a TargetModel (Llama / Mistral / Qwen2 / Qwen3): same forward (input_ids, cache=, positions=,
mask=, taps=, logits=) -> TargetOutput, same cache, same checkpoint. Saved as a standalone HF directory
(config.json + model.safetensors) that transformers, HF assisted generation and vLLM's draft-model mode
load as is; the `specpress` block in config.json is ignored by them. It owns its embeddings and head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping

from torch import Tensor

from specpress.models import forced
from specpress.models.drafter import Drafter, DrafterConfig, register_family
from specpress.models.family import DistillDefaults, StudentSpec
from specpress.models.io import load_into
from specpress.models.target import TargetConfig, TargetModel, target_state_dict


@dataclass(frozen=True)
class LMConfig(TargetConfig, DrafterConfig):
    """A TargetConfig registered as the `lm` drafter family (validated by TargetConfig)."""

    family: ClassVar[str] = "lm"

    @classmethod
    def from_target_config(cls, cfg: TargetConfig) -> "LMConfig":
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(TargetConfig)})


class LMDrafter(TargetModel, Drafter):
    family: ClassVar[str] = "lm"

    def __init__(self, config: LMConfig) -> None:
        super().__init__(config)

    def check_target(self, target: TargetConfig) -> None:
        self._mismatch("vocab_size", self.config.vocab_size, target.vocab_size)

    def public_state_dict(self) -> dict[str, Tensor]:
        return target_state_dict(self)

    def load_public(self, weights: Mapping[str, Tensor], source: str) -> None:
        tied = self.config.tie_word_embeddings
        w = {k: v for k, v in weights.items() if not (tied and k == "lm_head.weight")}
        load_into(self, w, source, optional=("lm_head.weight",) if tied else ())
        if tied:
            self.lm_head.weight = self.model.embed_tokens.weight


def read_config(cfg: Mapping[str, Any], source: str) -> LMConfig:
    return LMConfig.from_target_config(TargetConfig.from_hf(cfg, source=source))


def write_config(config: LMConfig) -> dict[str, Any]:
    return config.to_hf()


def student_config(shape: Mapping[str, Any], spec: StudentSpec, target: TargetConfig, teacher: Any) -> LMConfig:
    """A fresh student for distill: the target's architecture in the given shape, `spec.layers` layers
    (default a quarter of the target's, at least 1)."""
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    base = dataclasses.replace(target, **{k: shape[k] for k in keys},
                               num_hidden_layers=spec.layers or max(1, target.num_hidden_layers // 4))
    return LMConfig.from_target_config(base)


register_family(
    "lm", LMConfig, LMDrafter, read_config, write_config,
    session="lm", policies=("chain", "tree", "dynamic"), default_policy="chain:4",
    teacher_forced=forced.lm, loss="lm",
    distill=DistillDefaults(published="a small LM distilled by forward KL to the target's distribution"),
    prunable=("layers", "heads", "ffn"), layer_stack="model.layers", draft_vocab="own", student=student_config)
