"""Tiny random transformers models, the reference the target tests compare against (shared by conftest.py and
the helpers that write checkpoints, e.g. gguf_common.py)."""

from __future__ import annotations

import pytest
import torch

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def make_hf_model(arch: str = "llama", seed: int = 0, **overrides):
    """A random transformers model with weights large enough that numeric slips show."""
    transformers = pytest.importorskip("transformers")
    kw = {**TINY, "initializer_range": 0.15, **overrides}
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[arch]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0, 0.1)
    return model
