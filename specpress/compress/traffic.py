"""Calibration data from a prompts file: the target's own greedy continuations of the user's prompts.

A draft vocabulary ranked on one kind of text covers another kind worse (runtime/coverage.py measures it);
`prune --vocab --data PROMPTS.jsonl` ranks on what the user serves instead. The prompts file is bench's format
(JSON lines of {"prompt": "text"} or {"input_ids": [...]}); each prompt is decoded greedily by the target for
`new_tokens` tokens (stopping at EOS) and prompt + continuation become one document of the calibration stream,
documents joined by the target's first EOS (if it has one), so the vocab stage counts the target's predictions
on exactly the text it produces for this traffic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specpress.models.target import TargetModel

CONTINUATION_TOKENS = 128  # greedy tokens the target generates per prompt of a prompts file given as --data


def is_prompts_file(path: str | Path) -> bool:
    """Whether `path` is a JSON-lines prompts file: its first non-blank line is an object with "prompt" or
    "input_ids" (a text .jsonl for calibration holds "text" or "messages" instead)."""
    p = Path(path).expanduser()
    if not p.is_file() or p.suffix not in (".jsonl", ".ndjson"):
        return False
    with p.open(encoding="utf-8", errors="replace") as f:
        first = next((ln for ln in f if ln.strip()), "")
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and ("prompt" in obj or "input_ids" in obj)


def traffic_stream(target: TargetModel, path: str | Path, tokenizer: Any | None, new_tokens: int = CONTINUATION_TOKENS,
                   on_prompt: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """The calibration stream [N] int32 of prompt + greedy continuation per prompt (joined by EOS), and a record
    for provenance: prompts, continuation_tokens (the budget), generated (tokens the target produced).
    on_prompt(i, n): called after each prompt."""
    import torch

    from specpress.runtime.plain import decode_plain
    from specpress.runtime.prompts import load_prompts

    prompts = load_prompts(path, tokenizer, target.config.vocab_size)
    sep = list(target.config.eos_ids)[:1]  # a target without eos_token_id: documents simply follow each other
    ids: list[int] = []
    generated = 0
    with torch.inference_mode():
        for i, p in enumerate(prompts):
            g = decode_plain(target, p.ids, new_tokens)  # greedy, to EOS or the budget, as bench decodes
            ids += list(p.ids) + list(g.tokens) + sep
            generated += len(g.tokens)
            if on_prompt:
                on_prompt(i, len(prompts))
    return np.asarray(ids, dtype=np.int32), {"prompts": len(prompts), "continuation_tokens": new_tokens,
                                             "generated": generated}


__all__ = ["CONTINUATION_TOKENS", "is_prompts_file", "traffic_stream"]
