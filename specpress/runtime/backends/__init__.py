"""The backend registry: where a drafter can run. `run --backend`, `bench --backend`, the sweep recipe's
`backends:` and the sweep's run spec all read this one table.

A backend is a module that defines

    load_runner(path: Path, target: TargetModel, device: torch.device, **opts) -> DrafterRunner

(see `base.DrafterRunner`). `reads` says what `--drafter` must point at for it: "drafter" (a drafter
artifact directory), "onnx" (an `export onnx` output directory) or "engine" (an `export trt` output
directory). The target always runs on torch. Importing this package imports neither torch nor any
backend's library: a backend's module is imported when a runner is loaded, and an ImportError then
comes back as a UsageError carrying the backend's install hint.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specpress.errors import UsageError

if TYPE_CHECKING:
    import torch

    from specpress.models.target import TargetModel
    from specpress.runtime.backends.base import DrafterRunner


@dataclass(frozen=True)
class Backend:
    name: str
    module: str  # import path of the module that defines `load_runner`
    reads: str  # what --drafter must be: "drafter" | "onnx" | "engine"
    install_hint: str  # shown (with the ImportError) when the module or its library cannot be imported


BACKENDS: dict[str, Backend] = {
    "torch": Backend("torch", "specpress.runtime.backends.torch", "drafter",
                     "torch is a core dependency of specpress: reinstall it with `pip install specpress`"),
    "onnxruntime": Backend("onnxruntime", "specpress.runtime.backends.onnxruntime", "onnx", "pip install 'specpress[ort]'"),
}

READS = {"drafter": "a drafter artifact directory", "onnx": "an `specpress export onnx` output directory",
         "engine": "an `specpress export trt` output directory"}
EXPORT = {"onnx": "specpress export onnx", "engine": "specpress export trt"}


def backend_names() -> list[str]:
    return list(BACKENDS)


def get_backend(name: str) -> Backend:
    """The registered backend `name`; an unknown name lists the known ones."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise UsageError(f"unknown backend {name!r}; known backends: {', '.join(BACKENDS)}") from None


def _import(backend: Backend) -> Any:
    try:
        return importlib.import_module(backend.module)
    except ImportError as exc:
        raise UsageError(f"the {backend.name} backend cannot be loaded ({type(exc).__name__}: {exc}); "
                         f"{backend.install_hint}") from exc


def is_drafter_artifact(path: Path) -> bool:
    """A directory `load_drafter` reads: config.json next to safetensors weights."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def export_kind(path: Path) -> str | None:
    """"onnx" or "engine" when `path` holds an export's manifest.json of that kind (by its format tag),
    else None."""
    from specpress.artifacts import MARKERS, artifact_kind

    kind = artifact_kind(path) or ""
    onnx_format, engine_format = MARKERS["manifest.json"]
    return "onnx" if f"a specpress {onnx_format} " in kind else "engine" if engine_format in kind else None


def check_reads(backend: Backend, path: Path) -> None:
    """Refuse a --drafter directory the backend does not read, saying what it reads and how to make it."""
    path = Path(path).expanduser()
    kind = export_kind(path)
    if kind is not None and backend.reads != kind:
        others = [b.name for b in BACKENDS.values() if b.reads == kind]
        run = f"pass --backend {' or '.join(others)} to run it" if others else "no registered backend runs it here"
        raise UsageError(f"--drafter {path} is {READS[kind]}, but --backend {backend.name} reads "
                         f"{READS[backend.reads]}: {run}, or give the drafter artifact it was exported from")
    if backend.reads != "drafter" and is_drafter_artifact(path):
        raise UsageError(f"--backend {backend.name} reads {READS[backend.reads]}, but {path} is a drafter "
                         f"artifact; export it first with `{EXPORT[backend.reads]} ...` and pass that directory")


def load_runner(name: str, path: Path, target: "TargetModel", device: "torch.device", **opts: Any) -> "DrafterRunner":
    """The drafter at `path` as backend `name` runs it, against `target` (on torch, on `device`)."""
    backend = get_backend(name)
    check_reads(backend, path)
    return _import(backend).load_runner(Path(path), target, device, **opts)
