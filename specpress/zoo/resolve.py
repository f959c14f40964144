"""A `--target` value (or a recipe's `target:`) as the model directory every command reads.

    resolve_target_path("model.gguf")     # converted once, cached by the file's sha256 (zoo/gguf.py)
    resolve_target_path("smollm2-135m")   # the real zoo target, converted from its wheel (zoo/real.py)
    resolve_target_path("zoo/small")      # a directory: returned as it is

No torch is imported unless a conversion runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from specpress.zoo.gguf import convert_gguf, is_gguf_path
from specpress.zoo.real import REAL_TARGETS, build_real

__all__ = ["is_gguf_path", "resolve_target_path", "REAL_TARGETS"]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def resolve_target_path(value: str | Path, say: Callable[[str], None] = _stderr) -> Path:
    """The model directory for `value`: a .gguf file's conversion, a real zoo target's, or `value` itself."""
    s = str(value)
    if s in REAL_TARGETS and not Path(s).exists():
        from specpress.zoo.build import default_zoo_dir
        from specpress.zoo.gguf import converted_from

        out = default_zoo_dir(s)
        src = converted_from(out)
        return out if src is not None and src.get("sha256") == REAL_TARGETS[s].sha256 else build_real(s, say=say)
    if is_gguf_path(s):
        return convert_gguf(Path(s).expanduser(), say=say)
    return Path(s).expanduser()
