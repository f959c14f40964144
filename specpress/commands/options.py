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
