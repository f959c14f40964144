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


def native_bf16(device: torch.device | str = "cpu") -> bool:
    """Whether `device` computes bfloat16 matmuls natively: a CUDA GPU that supports bf16, or a CPU with
    AVX512-BF16 or AMX. Without them a CPU emulates bf16, and bf16 autocast makes training slower, not faster
    (the small zoo build: 4.7 s a step in bf16 against 1.8 s in fp32 on an AVX-512 Xeon without either)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if dev.type != "cpu":
        return False
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def train_dtype(word: str, device: torch.device | str = "cpu") -> str:
    """The dtype ("bf16" or "fp32") that training forwards run in for a --dtype of `word`: auto picks bf16
    where `device` computes it natively (native_bf16), fp32 elsewhere; bf16 and fp32 are taken as given."""
    if word == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if word not in ("bf16", "fp32"):
        raise UsageError(f"unknown training dtype {word!r}; choose auto, bf16 or fp32")
    return word
