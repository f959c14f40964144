"""Prompt files: JSON lines, each {"prompt": "text"} or {"input_ids": [..]}."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpress.errors import DataError


@dataclass(frozen=True)
class Prompt:
    ids: tuple[int, ...]
    text: str | None = None


def encode(text: str, tokenizer: Any, max_bytes: int | None = None, where: str = "--prompt") -> tuple[int, ...]:
    """`text`'s token ids; a text over `max_bytes` (limits.prompt_line_limit of the target's context) is
    refused before it is tokenized."""
    if max_bytes is not None and len(text) > max_bytes // 4 and len(text.encode()) > max_bytes:
        raise DataError(f"{where}: the prompt is {len(text.encode()):,} bytes, more than the {max_bytes:,} a prompt "
                        f"for this target may hold (64 bytes per position of its context, at least 1 MiB): it cannot "
                        f"fit the context; shorten it")
    ids = tuple(tokenizer.encode(text).ids)
    if not ids:
        raise DataError(f"prompt {text[:40]!r} encodes to no tokens")
    return ids


def max_context(target_dir: str | Path) -> int:
    """The context of the target in `target_dir`, from its config.json (nothing loaded)."""
    from specpress.models.io import read_config
    from specpress.models.target import TargetConfig

    return TargetConfig.from_hf(read_config(target_dir), source=str(Path(target_dir) / "config.json")).max_context


def load_prompts(path: str | Path, tokenizer: Any | None, vocab_size: int, context: int | None = None) -> list[Prompt]:
    """Read a .jsonl prompt file; errors name the file and line and say what a line must hold. With
    `context` (the target's), a line too long to be a prompt that fits it is refused before it is
    tokenized (limits.prompt_line_limit), and a file larger than a quarter of the free memory at once."""
    from specpress.limits import check_data_size, prompt_line_limit
    from specpress.readback import parse_json, regular_file

    path = Path(path).expanduser()
    size = regular_file(path, DataError, "give a .jsonl file with one prompt per line")
    check_data_size(size, f"prompts file {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                        f"{exc.start}); save the prompts file as UTF-8") from None
    limit = prompt_line_limit(context) if context is not None else None
    out: list[Prompt] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        if limit is not None and len(line) > limit // 4 and len(line.encode()) > limit:
            raise DataError(f"{where}: the line is {len(line.encode()):,} bytes, more than the {limit:,} a prompt "
                            f"for this target may hold (64 bytes per position of its {context:,}-position context, "
                            f"at least 1 MiB): it cannot fit the context; shorten it")
        shape = '; each line must be {"prompt": "text"} or {"input_ids": [..]}'
        obj = parse_json(line, where, shape.removeprefix("; "), error=DataError)
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
            if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                              for i in ids):
                raise DataError(f'{where}: "input_ids" must be a non-empty list of integers')
            bad = [i for i in ids if not 0 <= i < vocab_size]
            if bad:
                raise DataError(f"{where}: token id {bad[0]} is outside the target's vocabulary (0..{vocab_size - 1})")
            out.append(Prompt(tuple(ids)))
    if not out:
        raise DataError(f"prompts file {path} holds no prompts")
    return out
