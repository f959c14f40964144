"""The backend registry: where a drafter (and the target) can run. `run` / `bench --backend` and
`--target-backend`, the sweep recipe's `backends:` and the sweep's runs all read it.

Every subpackage of this package is one backend and registers one `Backend` in its `__init__.py`, which
imports neither torch nor the backend's library: `--help` lists the choices without loading any of them.
The descriptor names what `--drafter` must point at (`reads`), the module that loads runners (imported
when a runner is loaded; an ImportError then comes back with the backend's install hint), whether it
runs the target too, whether it runs the torch modules themselves (`modules`: what --compile and
--target-quant need), and how the drafter's bytes are counted (`size`). The runner module defines

    load_runner(path: Path, target: TargetModel, device: torch.device, **opts) -> a drafter runner
    target_runner(path: Path, model: TargetModel) -> TargetRunner      (runs_target; path: what it reads)

(runners: `base.FeatureDrafter` / `TokenDrafter` / `BlockDrafter`, `base.TargetRunner`). What a backend
reads is made from a drafter artifact or a target directory on demand by `specpress.export.ondemand`
(`runner_input`, `target_input`), keyed by `reads`: export/ validates through this runtime, so the
runtime never imports it. Modules here that are not subpackages (base, exported) are shared by the
backends and register nothing.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from specpress.errors import RequestError, UsageError

if TYPE_CHECKING:
    import torch

    from specpress.models.target import TargetModel
    from specpress.runtime.backends.base import AnyDrafter, TargetRunner

READS = {"drafter": "a drafter artifact directory", "onnx": "an `specpress export onnx` output directory",
         "engine": "an `specpress export trt` output directory"}
EXPORT = {"onnx": "specpress export onnx", "engine": "specpress export trt"}


def files_bytes(path: Path) -> int:
    """Bytes of every file under `path` (an exported directory as it is stored)."""
    return sum(p.stat().st_size for p in Path(path).expanduser().rglob("*") if p.is_file())


@dataclass(frozen=True)
class Backend:
    name: str
    module: str  # import path of the runner module: load_runner (and target_runner when runs_target)
    reads: str  # what --drafter must be: "drafter" | "onnx" | "engine" (READS)
    install_hint: str  # shown (with the ImportError) when the module or its library cannot be imported
    size: Callable[[Path], int] = files_bytes  # bytes of the drafter at `path` as this backend reads it
    runs_target: bool = False  # the module's target_runner runs the target (--target-backend)
    modules: bool = False  # runs specpress's torch modules themselves: --compile / --compile-target and an
    # emulated compressed target (--target-quant) apply to it; other backends run a graph of their own


_REGISTRY: dict[str, Backend] = {}
_DISCOVERED = False


def register(backend: Backend) -> Backend:
    """Add `backend` (called once by each backend subpackage); a second one under the same name raises."""
    if backend.name in _REGISTRY and _REGISTRY[backend.name] != backend:
        raise ValueError(f"backend {backend.name!r} is registered twice")
    if backend.reads not in READS:
        raise ValueError(f"backend {backend.name!r} reads {backend.reads!r}; known: {', '.join(READS)}")
    _REGISTRY[backend.name] = backend
    return backend


def backends() -> dict[str, Backend]:
    """Every registered backend by name, in package order (torch first). The first call imports each
    backend subpackage's descriptor (no torch, no backend library)."""
    global _DISCOVERED
    if not _DISCOVERED:
        order = sorted((m.name for m in pkgutil.iter_modules(__path__) if m.ispkg), key=lambda n: (n != "torch", n))
        for name in order:
            importlib.import_module(f"{__name__}.{name}")
            if name not in _REGISTRY:
                raise RuntimeError(f"{__name__}.{name} registers no backend named {name!r}")
        for name in order + sorted(set(_REGISTRY) - set(order)):  # one order, whatever was imported first
            _REGISTRY[name] = _REGISTRY.pop(name)
        _DISCOVERED = True
    return _REGISTRY


def names(*, runs_target: bool = False) -> list[str]:
    """Registered backend names (only those that also run the target, with `runs_target`)."""
    return [n for n, b in backends().items() if b.runs_target or not runs_target]


def get_backend(name: str) -> Backend:
    """The registered backend `name`; an unknown name lists the known ones."""
    known = backends()
    if name not in known:
        raise UsageError(f"unknown backend {name!r}; known backends: {', '.join(known)}")
    return known[name]


def runner_module(backend: Backend) -> Any:
    try:
        return importlib.import_module(backend.module)
    except ImportError as exc:
        raise RequestError(f"the {backend.name} backend cannot be loaded ({type(exc).__name__}: {exc}); "
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
        others = [b.name for b in backends().values() if b.reads == kind]
        run = f"pass --backend {' or '.join(others)} to run it" if others else "no registered backend runs it here"
        raise RequestError(f"--drafter {path} is {READS[kind]}, but --backend {backend.name} reads "
                           f"{READS[backend.reads]}: {run}, or give the drafter artifact it was exported from")
    if backend.reads != "drafter" and is_drafter_artifact(path):
        raise RequestError(f"--backend {backend.name} reads {READS[backend.reads]}, but {path} is a drafter "
                           f"artifact; export it first with `{EXPORT[backend.reads]} ...` and pass that directory")


def load_runner(name: str, path: Path, target: "TargetModel", device: "torch.device", **opts: Any) -> "AnyDrafter":
    """The drafter at `path` as backend `name` runs it, against `target` (on torch, on `device`); a drafter
    artifact given to a backend that reads an export is refused, saying how to make one."""
    backend = get_backend(name)
    check_reads(backend, path)
    return runner_module(backend).load_runner(Path(path).expanduser(), target, device, **opts)


def load_target_runner(name: str, path: Path, model: "TargetModel") -> "TargetRunner":
    """The target the loop calls when it runs on backend `name`: `path` is what the backend reads (the target
    directory, or its export), `model` the torch target, loaded."""
    backend = get_backend(name)
    if not backend.runs_target:
        raise UsageError(f"the {name} backend runs drafters only; targets run on "
                         f"{', '.join(names(runs_target=True))}")
    return runner_module(backend).target_runner(Path(path), model)


def drafter_bytes(name: str, path: Path) -> int:
    """Bytes of the drafter at `path` as backend `name` reads it (the artifact's own count, or the export's)."""
    return int(get_backend(name).size(Path(path)))
