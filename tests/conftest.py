"""Shared fixtures: tiny random HF-format targets (seconds), built with transformers as the reference."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)

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


@pytest.fixture
def hf_dir_factory(tmp_path):
    """Save a random HF model to a temp dir; returns (hf_model, path)."""
    count = [0]

    def make(arch: str = "llama", **overrides):
        model = make_hf_model(arch, **overrides)
        count[0] += 1
        path = tmp_path / f"{arch}-{count[0]}"
        model.save_pretrained(path)
        return model, path

    return make
