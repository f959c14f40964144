"""Shared fixtures: tiny random HF-format targets (seconds), built with transformers as the reference."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)

from hf_common import TINY, make_hf_model  # noqa: E402,F401  (fixtures below and older imports)


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
