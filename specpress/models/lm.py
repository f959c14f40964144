"""An independent small causal LM drafter sharing the target's tokenizer.

It IS a TargetModel (Llama / Mistral / Qwen2 / Qwen3): same forward (input_ids, cache=, positions=,
mask=, taps=, logits=) -> TargetOutput, same cache, same checkpoint. Saved as a standalone HF directory
(config.json + model.safetensors) that transformers, HF assisted generation and vLLM's draft-model mode
load as is; the `specpress` block in config.json is ignored by them. It owns its embeddings and head.

`head_rank` R (config.json `head_rank`) factorises an untied head (models/heads.py: `lm_head.down.weight`,
`lm_head.up.weight`); such a directory is no longer a plain HF decoder (`export hf` refuses it or writes the
product back). A head tied to the embeddings costs no bytes of its own and is never factorised.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping

from torch import Tensor

from specpress.errors import ConfigError
from specpress.models import forced
from specpress.models.drafter import Drafter, DrafterConfig, register_family
from specpress.models.family import Detection, DistillDefaults, StudentSpec
from specpress.models.heads import check_rank, make_head
from specpress.models.io import load_into
from specpress.models.target import TargetConfig, TargetModel, target_state_dict


@dataclass(frozen=True)
class LMConfig(TargetConfig, DrafterConfig):
    """A TargetConfig registered as the `lm` drafter family (validated by TargetConfig)."""

    family: ClassVar[str] = "lm"
    head_rank: int | None = None  # a low-rank lm_head (models/heads.py); None = dense

    def __post_init__(self) -> None:
        super().__post_init__()
        check_rank(self.head_rank, self.hidden_size, self.vocab_size, "lm")
        if self.head_rank is not None and self.tie_word_embeddings:
            raise ConfigError("lm config: head_rank factorises the lm_head, but it is tied to the embeddings "
                              "(tie_word_embeddings), where it costs no bytes of its own")

    @classmethod
    def from_target_config(cls, cfg: TargetConfig, head_rank: int | None = None) -> "LMConfig":
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(TargetConfig)}, head_rank=head_rank)


class LMDrafter(TargetModel, Drafter):
    family: ClassVar[str] = "lm"

    def __init__(self, config: LMConfig) -> None:
        super().__init__(config)
        if config.head_rank is not None:
            self.lm_head = make_head(config.hidden_size, config.vocab_size, config.head_rank)

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
    return LMConfig.from_target_config(TargetConfig.from_hf(cfg, source=source), cfg.get("head_rank"))


def write_config(config: LMConfig) -> dict[str, Any]:
    out = config.to_hf()
    if config.head_rank is not None:
        out["head_rank"] = config.head_rank
    return out


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
    prunable=("layers", "heads", "ffn", "head_rank"), layer_stack="model.layers", draft_vocab="own",
    student=student_config,
    detection=Detection(priority=90, decoder=True))  # any plain decoder no other family claims: asked last
