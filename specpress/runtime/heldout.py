"""Held-out evaluation prompts: Python code that is not in the standard library.

The zoo target and its drafters train on the stdlib; acceptance is measured on the source of
installed third-party packages (click, rich, yaml, …), which neither has seen. `write_heldout_prompts` is
`specpress prompts`: them written as the JSON-lines file `bench --prompts` reads.
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
    return document_prompts([f.read_text(errors="replace") for f in files], tokenizer, n, prompt_tokens, seed)


def write_heldout_prompts(target_dir: str | Path, out: str | Path, n: int = 100, prompt_tokens: int = 64,
                          seed: int = 0, *, force: bool = False) -> list[Prompt]:
    """heldout_code_prompts encoded by `target_dir`'s tokenizer, written to `out` as JSON lines of
    {"input_ids": [...]} (claimed first; force: replace it). Returns the prompts written."""
    import json

    from specpress.artifacts import claim_output, write_file
    from specpress.models.tokenizer import load_tokenizer

    with claim_output(out, force=force, kind="file", inputs={"--target": target_dir}) as claim:
        made = heldout_code_prompts(load_tokenizer(target_dir), n, prompt_tokens, seed)
        write_file(claim.out, "".join(json.dumps({"input_ids": list(p.ids)}) + "\n" for p in made))
    return made


def document_prompts(texts: Sequence[str], tokenizer: Any, n: int, prompt_tokens: int = 64,
                     seed: int = 0) -> list[Prompt]:
    """`n` prompts of `prompt_tokens` tokens cut at random places of `texts` (deterministic in `seed`).

    One pass over the documents in a seeded order takes one prompt from each long enough; only when
    that gives fewer than `n` do further passes take more from the same documents (other places, no
    prompt repeated).
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(texts))
    encoded: dict[int, list[int]] = {}
    prompts: list[Prompt] = []
    seen: set[tuple[int, ...]] = set()
    for rep in range(8):
        for idx in order.tolist():
            if idx not in encoded:
                encoded[idx] = tokenizer.encode(texts[idx]).ids
            ids = encoded[idx]
            if len(ids) <= prompt_tokens + 32:
                continue
            start = int(rng.integers(0, len(ids) - prompt_tokens - 32))
            cut = tuple(ids[start:start + prompt_tokens])
            if rep == 0 or cut not in seen:  # later passes must not repeat a prompt
                seen.add(cut)
                prompts.append(Prompt(cut))
            if len(prompts) == n:
                return prompts
    raise DataError(f"only {len(prompts)} distinct prompts of {prompt_tokens} tokens could be cut from "
                    f"{len(texts)} documents, {n} asked; give more or longer documents, or ask fewer")
