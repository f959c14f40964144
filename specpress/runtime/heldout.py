"""Held-out evaluation prompts: Python code that is not in the standard library.

The zoo target and its drafters train on the stdlib; acceptance is measured on the source of
installed third-party packages (click, rich, yaml, …), which neither has seen.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from specpress.errors import DataError
from specpress.runtime.prompts import Prompt

DEFAULT_PACKAGES = ("click", "rich", "yaml", "safetensors", "tokenizers", "onnx", "numpy")


def package_files(packages: Sequence[str] = DEFAULT_PACKAGES) -> list[Path]:
    files: list[Path] = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for root in spec.submodule_search_locations:
            files.extend(p for p in sorted(Path(root).rglob("*.py"))
                         if not any(part in ("tests", "test", "testing") for part in p.parts))
    return files


def heldout_code_prompts(tokenizer: Any, n: int = 100, prompt_tokens: int = 64, seed: int = 0,
                         packages: Sequence[str] = DEFAULT_PACKAGES) -> list[Prompt]:
    """`n` prompts of `prompt_tokens` tokens, each from a different file when possible (deterministic)."""
    files = package_files(packages)
    if not files:
        raise DataError(f"none of the packages {', '.join(packages)} is installed; cannot build held-out prompts")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(files))
    prompts: list[Prompt] = []
    for idx in order:
        ids = tokenizer.encode(files[idx].read_text(errors="replace")).ids
        if len(ids) < prompt_tokens + 32:
            continue
        start = int(rng.integers(0, len(ids) - prompt_tokens - 32))
        prompts.append(Prompt(tuple(ids[start:start + prompt_tokens])))
        if len(prompts) == n:
            break
    if len(prompts) < n:
        raise DataError(f"only {len(prompts)} held-out prompts of {prompt_tokens} tokens could be built, {n} asked")
    return prompts
