"""The one place that decides the compute device and default dtype."""

from __future__ import annotations

import time

import torch

from specpress.errors import RequestError, UsageError

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def pick_device(requested: str | None = None) -> torch.device:
    """`cuda` when present, else `cpu`; an explicit request is honoured or refused clearly."""
    if requested in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(requested)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RequestError(f"device {requested!r} requested but CUDA is not available here; pass device='cpu', or no "
                           f"device (CUDA when present, else the CPU)")
    return dev


def wall_ms(device: torch.device) -> float:
    """A wall-clock reading in ms taken after `device` has finished its queued work (CUDA is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1e3


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise UsageError(f"unknown dtype {name!r}; choose one of fp32, bf16, fp16") from None
