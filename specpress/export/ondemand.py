"""Export on demand: what a backend reads, made from what the user gave. `--backend onnxruntime --drafter
<drafter artifact>` runs the drafter's ONNX export, made once into `$SPECPRESS_CACHE/onnx/<key>` and reused
while the drafter, the target and the options are unchanged (key: the drafter's config + weight bytes, the
target's config + weight file sizes and times, the export options and the specpress version).
`--target-backend onnxruntime` likewise runs the target's `export target`, made once into
`$SPECPRESS_CACHE/onnx-target/<key>`. `runner_input` / `target_input` decide it from the backend's `reads`
(runtime/backends registry); the commands and the sweep call them, never the backend (export/ validates
through the runtime, so the runtime does not import export/).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

from specpress import __version__
from specpress.artifacts import artifact_kind, claim_cache
from specpress.errors import SpecpressError, UsageError
from specpress.export.onnx import ExportOptions, export_from_dirs
from specpress.export.target import TargetExportOptions, export_target_from_dir
from specpress.manifest import open_export, open_target_export


def cache_root() -> Path:
    cache = os.environ.get("SPECPRESS_CACHE")
    return Path(cache).expanduser() if cache else Path.home() / ".cache" / "specpress"


def _hash_target(h: "hashlib._Hash", target_dir: Path) -> None:
    for f in sorted(Path(target_dir).glob("*.json")) + sorted(Path(target_dir).glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())


def _hash_options(h: "hashlib._Hash", options: object) -> str:
    opts = {k: v for k, v in dataclasses.asdict(options).items() if k != "force"}  # type: ignore[call-overload]
    h.update(json.dumps({"options": opts, "specpress": __version__}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def export_key(drafter_dir: Path, target_dir: Path, options: ExportOptions) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(drafter_dir).glob("*.json")) + sorted(Path(drafter_dir).glob("*.safetensors")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    _hash_target(h, target_dir)
    return _hash_options(h, options)


def exported_dir_for(drafter_dir: str | Path, target_dir: str | Path, options: ExportOptions = ExportOptions(),
                     progress: Callable[[str], None] = lambda s: None) -> tuple[Path, bool]:
    """(the export directory of this drafter, whether it was exported now rather than reused)."""
    drafter_dir, target_dir = Path(drafter_dir).expanduser(), Path(target_dir).expanduser()
    out = cache_root() / "onnx" / export_key(drafter_dir, target_dir, options)
    forced = dataclasses.replace(options, force=True)
    return _reuse_or_export(out, str(drafter_dir), lambda o: open_export(o, cache_fix(o)),
                            lambda o: export_from_dirs(drafter_dir, target_dir, o, forced, progress), progress)


def exported_target_for(target_dir: str | Path, options: TargetExportOptions = TargetExportOptions(),
                        progress: Callable[[str], None] = lambda s: None) -> tuple[Path, bool]:
    """(the `export target` directory of this target, whether it was exported now rather than reused), in
    `$SPECPRESS_CACHE/onnx-target/<key>` (key: the target's file names, sizes and times, options, version)."""
    target_dir = Path(target_dir).expanduser()
    h = hashlib.sha256()
    _hash_target(h, target_dir)
    out = cache_root() / "onnx-target" / _hash_options(h, options)
    forced = dataclasses.replace(options, force=True)
    return _reuse_or_export(out, f"target {target_dir}", lambda o: open_target_export(o, cache_fix(o)),
                            lambda o: export_target_from_dir(target_dir, o, forced, progress), progress)


def cache_fix(entry: Path) -> str:
    """What a refusal of the cache entry `entry` tells the user (the user gave no --out to export again)."""
    return f"delete {entry} and run the command again: specpress exports it anew into the cache"


def runner_input(backend: str, drafter_dir: str | Path, target_dir: str | Path,
                 progress: Callable[[str], None] = lambda s: None) -> Path:
    """What `--backend` reads for `--drafter drafter_dir`: a drafter artifact given to a backend that reads an
    ONNX export is exported first (once, cached); any other directory as it is (the backend checks it)."""
    from specpress.runtime.backends import get_backend, is_drafter_artifact

    path = Path(drafter_dir).expanduser()
    if get_backend(backend).reads == "onnx" and is_drafter_artifact(path):
        return exported_dir_for(path, target_dir, progress=progress)[0]
    return path


def target_input(backend: str, target_dir: str | Path, dtype: str,
                 progress: Callable[[str], None] = lambda s: None) -> Path:
    """What `--target-backend` reads for the target: the directory itself, or for a backend that reads ONNX
    the target's `export target` in `dtype` (once, cached; fp32 or fp16)."""
    from specpress.runtime.backends import get_backend

    if get_backend(backend).reads != "onnx":
        return Path(target_dir)
    if dtype == "bf16":
        raise UsageError(f"--target-backend {backend} runs an fp32 or fp16 export (onnxruntime's CPU kernels have no "
                         f"bf16); pass --dtype fp32 or fp16")
    return exported_target_for(target_dir, TargetExportOptions(dtype=dtype), progress=progress)[0]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def _reuse_or_export(out: Path, what: str, load: Callable[[Path], object], export: Callable[[Path], object],
                     progress: Callable[[str], None], warn: Callable[[str], None] = _stderr) -> tuple[Path, bool]:
    """(out, False) when `out` holds an export that `load` accepts (its files checked against their sha256);
    else export into it, the cache entry claimed (`claim_cache`: locked, leftovers of a killed export
    removed): (out, True). A cached export that fails the check is never run: it is exported again, and
    `warn` (stderr) says why."""
    if _reusable(out, what, load, progress, warn):
        return out, False
    with claim_cache(out) as removed:
        for leftover in removed:
            warn(f"note: {leftover}")
        if _reusable(out, what, load, progress, lambda m: None):  # another process exported it meanwhile
            return out, False
        if out.is_dir() and artifact_kind(out) is None and not out.is_symlink():
            shutil.rmtree(out)  # our cache entry, its manifest unreadable: atomic_dir would not replace it
        progress(f"exporting {what} to ONNX (once) into {out}")
        export(out)
    return out, True


def _reusable(out: Path, what: str, load: Callable[[Path], object], progress: Callable[[str], None],
              warn: Callable[[str], None]) -> bool:
    if not out.is_dir():
        return False
    try:
        load(out)
    except SpecpressError as exc:
        why = str(exc).removesuffix(f"; {cache_fix(out)}")
        warn(f"warning: the cached ONNX export of {what} at {out} failed its check ({why}); exporting it again")
        return False
    progress(f"using the ONNX export of {what} cached at {out}")
    return True
