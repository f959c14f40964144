"""Calibration data from a prompts file: the target's own greedy continuations of the user's prompts.

A draft vocabulary ranked on one kind of text covers another kind worse (runtime/coverage.py measures it);
`prune --vocab --data PROMPTS.jsonl` ranks on what the user serves instead. The prompts file is bench's format
(JSON lines of {"prompt": "text"} or {"input_ids": [...]}); each prompt is decoded greedily by the target for
`new_tokens` tokens (stopping before EOS) and prompt + continuation become one document of the calibration stream,
documents joined by the target's first EOS (if it has one), so the vocab stage counts the target's predictions
on exactly the text it produces for this traffic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from specpress.errors import CheckpointError
from specpress.models.target import TargetModel
from specpress.readback import parse_json

CONTINUATION_TOKENS = 128  # greedy tokens the target generates per prompt of a prompts file given as --data
BATCH = 64  # prompts of one length continued together


def is_prompts_file(path: str | Path) -> bool:
    """Whether `path` is a JSON-lines prompts file: its first non-blank line is an object with "prompt" or
    "input_ids" (a text .jsonl for calibration holds "text" or "messages" instead)."""
    p = Path(path).expanduser()
    if not p.is_file() or p.suffix not in (".jsonl", ".ndjson"):
        return False
    with p.open(encoding="utf-8", errors="replace") as f:
        first = next((ln for ln in f if ln.strip()), "")
    try:
        obj = parse_json(first, str(p))
    except CheckpointError:
        return False
    return isinstance(obj, dict) and ("prompt" in obj or "input_ids" in obj)


def traffic_stream(target: TargetModel, path: str | Path, tokenizer: Any | None, new_tokens: int = CONTINUATION_TOKENS,
                   on_prompt: Callable[[int, int], None] | None = None,
                   batch: int = BATCH) -> tuple[np.ndarray, dict[str, Any]]:
    """The calibration stream [N] int32 of prompt + greedy continuation per prompt (joined by EOS), and a record
    for provenance: prompts, continuation_tokens (the budget), generated (tokens the target produced).

    Prompts of equal length are continued together, `batch` rows at a time (one KV cache each batch), in
    the file's order in the stream; each continuation stops before its first EOS (the join puts one after
    it). on_prompt(i, n): called after each prompt is continued (i counts up to n - 1)."""
    import torch

    from specpress.compress.regen import continue_batch
    from specpress.runtime.prompts import load_prompts
    from specpress.runtime.sampling import SamplingParams

    prompts = load_prompts(path, tokenizer, target.config.vocab_size, target.config.max_context)
    eos = list(target.config.eos_ids)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p.ids), []).append(i)
    conts: dict[int, list[int]] = {}
    with torch.inference_mode():
        for idx in by_len.values():
            for k in range(0, len(idx), batch):
                rows = idx[k:k + batch]
                ids = torch.tensor([list(prompts[i].ids) for i in rows])
                for i, c in zip(rows, continue_batch(target, ids, new_tokens, SamplingParams(), None, eos)):
                    conts[i] = c
                    if on_prompt:
                        on_prompt(len(conts) - 1, len(prompts))
    out: list[int] = []
    for i, p in enumerate(prompts):  # a target without eos_token_id: documents simply follow each other
        out += list(p.ids) + conts[i] + eos[:1]
    return np.asarray(out, dtype=np.int32), {"prompts": len(prompts), "continuation_tokens": new_tokens,
                                             "generated": sum(len(c) for c in conts.values())}


__all__ = ["CONTINUATION_TOKENS", "is_prompts_file", "traffic_stream"]
