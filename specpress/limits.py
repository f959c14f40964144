"""What specpress refuses as absurd before it allocates anything: model sizes, prompt lines, data files.

Config sizes: every size field of a model config (a target's config.json, a drafter's) must be a whole
number in 1..`DIM_BOUNDS[field]`. The bounds sit an order of magnitude or more above the largest public
models (vocabularies of 262k, hidden sizes of 16k, 126 layers, FFNs of 53k), so no real config meets them,
while a hand-edited `hidden_size: 1e9` or `num_hidden_layers: 1e9` is refused in one line instead of
overflowing torch's size arithmetic or building a billion layers (even on the meta device `inspect` uses).

Prompt lines: a line of a prompts file longer than `prompt_line_limit(context)` bytes cannot be a prompt
that fits the target (the bound allows 64 bytes per position of its context, and at least 1 MiB): it is
refused before it is tokenized. Data files: a special file (/dev/zero, a FIFO) is refused as not a
regular file, and text larger than a quarter of the memory free now is refused with its size (reading it
and holding its tokens needs more than that); `compress.guards.check_seq_len` / `runtime.plain.check_decode`
bound the windows.
"""

from __future__ import annotations

import math
from typing import Any

from specpress.errors import ConfigError

DIM_BOUNDS: dict[str, int] = {
    "vocab_size": 1 << 24,
    "draft_vocab_size": 1 << 24,
    "hidden_size": 1 << 17,
    "target_hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "num_hidden_layers": 1 << 10,
    "num_target_layers": 1 << 10,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 12,
    "max_position_embeddings": 1 << 31,
}
PROMPT_BYTES_PER_POSITION = 64
MIN_PROMPT_LINE = 1 << 20
DATA_SHARE_OF_MEMORY = 4  # text larger than free memory / this is refused


def whole(value: Any, name: str, source: str) -> int:
    """`value` of config field `name` as an int: an int, or a float with no fraction (JSON writers emit
    4096.0); a bool, a string or a fraction is a ConfigError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: {name} must be a whole number, found {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ConfigError(f"{source}: {name} must be a whole number, found {value!r}")
    return int(value)


def check_dim(name: str, value: Any, source: str) -> int:
    """`value` as a size within DIM_BOUNDS[name] (1.. the bound); else a ConfigError with the bound."""
    n = whole(value, name, source)
    bound = DIM_BOUNDS.get(name)
    if n < 1 or (bound is not None and n > bound):
        limit = f"1..{bound:,}" if bound is not None else "at least 1"
        raise ConfigError(f"{source}: {name} {n:,} is outside {limit}; no model specpress can build has that "
                          f"(a typo or an edited config?); fix the field")
    return n


def check_dims(values: dict[str, Any], source: str) -> None:
    """check_dim on every field of `values` that DIM_BOUNDS names and that is set (not None)."""
    for name, value in values.items():
        if name in DIM_BOUNDS and value is not None:
            check_dim(name, value, source)


def prompt_line_limit(context: int) -> int:
    """Bytes a prompt line may hold for a target of `context` positions (see the module docstring)."""
    return max(MIN_PROMPT_LINE, PROMPT_BYTES_PER_POSITION * context)


def check_data_size(size: int, what: str) -> None:
    """Refuse text of `size` bytes larger than free memory / DATA_SHARE_OF_MEMORY: reading it, decoding it
    and holding its tokens takes several times its size, so it would not fit (the kernel's OOM killer
    would say so later)."""
    from specpress.errors import DataError
    from specpress.machine import available_bytes
    from specpress.readback import fmt_bytes

    free = available_bytes()
    if free is not None and size > free // DATA_SHARE_OF_MEMORY:
        raise DataError(f"{what} is {fmt_bytes(size)}; specpress reads text into memory, and {fmt_bytes(free)} is "
                        f"free (at most {fmt_bytes(free // DATA_SHARE_OF_MEMORY)} of text fits): give a smaller file")
