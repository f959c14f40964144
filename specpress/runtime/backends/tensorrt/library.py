"""Finding a TensorRT builder: standard TensorRT first, else TensorRT for RTX; every import guarded.

Nothing here touches a device: `tensorrt_lean` (runtime only) crashes the process when used without a
CUDA device, so it is never imported. A missing builder is a `TensorRTUnavailable` naming what is
missing and how to install it, never a bare ImportError.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from specpress.errors import SpecpressError

INSTALL_HINT = ("install a TensorRT builder: `pip install 'specpress[trt]'` (standard TensorRT; its libraries come "
                "from NVIDIA's index, add `--extra-index-url https://pypi.nvidia.com`) or "
                "`pip install 'specpress[trt-rtx]'` (TensorRT for RTX from PyPI: builds ahead-of-time engines on any "
                "machine; running them needs an RTX-class GPU)")

FLAVOURS = ("tensorrt", "tensorrt_rtx")


class TensorRTUnavailable(SpecpressError):
    """No usable TensorRT builder (or runtime) is installed, or no device to run one."""


@dataclass(frozen=True)
class TensorRT:
    """An imported TensorRT flavour: `module` is `tensorrt` or `tensorrt_rtx` (same Python API)."""

    module: ModuleType
    flavour: str  # "tensorrt" | "tensorrt_rtx"
    version: str

    @property
    def aot(self) -> bool:
        """True when the builder compiles ahead of time for chosen compute capabilities (TensorRT for RTX)."""
        return self.flavour == "tensorrt_rtx"


def load_tensorrt(flavour: str | None = None) -> TensorRT:
    """Import a TensorRT builder: `flavour` if given, else standard TensorRT, else TensorRT for RTX."""
    if flavour is not None and flavour not in FLAVOURS:
        raise TensorRTUnavailable(f"unknown TensorRT flavour {flavour!r}; expected one of {', '.join(FLAVOURS)}")
    errors = []
    for name in (flavour,) if flavour else FLAVOURS:
        try:
            mod = importlib.import_module(name)
            if not hasattr(mod, "Builder") or not hasattr(mod, "OnnxParser"):
                raise ImportError(f"`{name}` has no Builder/OnnxParser (a runtime-only package?)")
        except (ImportError, OSError) as exc:  # OSError: a library the bindings need is missing
            errors.append(f"{name}: {exc}")
            continue
        lib = TensorRT(mod, name, str(getattr(mod, "__version__", "unknown")))
        if lib.aot:
            ensure_rtx_plugin_loading(mod)
        return lib
    raise TensorRTUnavailable(f"no TensorRT builder could be imported ({'; '.join(errors)}); {INSTALL_HINT}")


def ensure_rtx_plugin_loading(mod: ModuleType) -> None:
    """Make TensorRT for RTX's ONNX parser able to import plugin nodes.

    Found here (tensorrt-rtx-cu12 1.7.1.116): once a plugin creator returns, the parser dlopen()s the
    unversioned `libtensorrt_rtx.so`, which the wheel does not ship (only `libtensorrt_rtx.so.1`); the
    resulting exception escapes a static initialiser and the process aborts with "terminate called without
    an active exception". The parser's RPATH is `$ORIGIN`, so a link beside it is found. We create that link
    when the directory is writable, else raise with the command that does it.
    """
    try:
        libs = importlib.import_module(f"{mod.__name__}_libs")
    except ImportError:
        return  # a system install (not the PyPI wheel): its library layout is the system's business
    if libs.__file__ is None:
        return
    libdir = Path(libs.__file__).parent
    versioned = sorted(libdir.glob("libtensorrt_rtx.so.*"))
    link = libdir / "libtensorrt_rtx.so"
    if link.exists() or not versioned:
        return
    try:
        os.symlink(versioned[0].name, link)
    except OSError as exc:
        raise TensorRTUnavailable(
            f"TensorRT for RTX's ONNX parser needs {link} to import plugin nodes and the wheel lacks it "
            f"({exc}); create it with `ln -s {versioned[0].name} {link}`") from exc
