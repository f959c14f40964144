"""Prompt files: JSON lines, each {"prompt": "text"} or {"input_ids": [..]}."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpress.errors import DataError


@dataclass(frozen=True)
class Prompt:
    ids: tuple[int, ...]
    text: str | None = None


def encode(text: str, tokenizer: Any) -> tuple[int, ...]:
    ids = tuple(tokenizer.encode(text).ids)
    if not ids:
        raise DataError(f"prompt {text[:40]!r} encodes to no tokens")
    return ids


def load_prompts(path: str | Path, tokenizer: Any | None, vocab_size: int) -> list[Prompt]:
    """Read a .jsonl prompt file; errors name the file and line and say what a line must hold."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise DataError(f"prompts file {path} is a directory; give a .jsonl file with one prompt per line")
    if not path.is_file():
        raise DataError(f"prompts file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                        f"{exc.start}); save the prompts file as UTF-8") from None
    out: list[Prompt] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg}); each line must be "
                            f'{{"prompt": "text"}} or {{"input_ids": [..]}}') from None
        if not isinstance(obj, dict) or ("prompt" in obj) == ("input_ids" in obj):
            raise DataError(f'{where}: each line must hold exactly one of "prompt" or "input_ids"')
        if "prompt" in obj:
            if not isinstance(obj["prompt"], str) or not obj["prompt"]:
                raise DataError(f'{where}: "prompt" must be a non-empty string')
            if tokenizer is None:
                raise DataError(f'{where}: a text prompt, but the target has no tokenizer.json to encode it; add '
                                f'the tokenizer, or give token ids as {{"input_ids": [..]}}')
            out.append(Prompt(encode(obj["prompt"], tokenizer), obj["prompt"]))
        else:
            ids = obj["input_ids"]
            if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
                raise DataError(f'{where}: "input_ids" must be a non-empty list of integers')
            bad = [i for i in ids if not 0 <= i < vocab_size]
            if bad:
                raise DataError(f"{where}: token id {bad[0]} is outside the target's vocabulary (0..{vocab_size - 1})")
            out.append(Prompt(tuple(ids)))
    if not out:
        raise DataError(f"prompts file {path} holds no prompts")
    return out
