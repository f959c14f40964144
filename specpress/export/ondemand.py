"""Export on demand: `--backend onnxruntime --drafter <drafter artifact>` runs the drafter's ONNX export,
made once into `$SPECPRESS_CACHE/onnx/<key>` and reused while the drafter, the target and the options
are unchanged (key: the drafter's config + weight bytes, the target's config + weight file sizes and
times, the export options and the specpress version). The command calls this, never the backend.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from specpress import __version__
from specpress.errors import SpecpressError
from specpress.export.onnx import ExportOptions, export_from_dirs
from specpress.manifest import load_manifest


def cache_root() -> Path:
    cache = os.environ.get("SPECPRESS_CACHE")
    return Path(cache).expanduser() if cache else Path.home() / ".cache" / "specpress"


def export_key(drafter_dir: Path, target_dir: Path, options: ExportOptions) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(drafter_dir).glob("*.json")) + sorted(Path(drafter_dir).glob("*.safetensors")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    for f in sorted(Path(target_dir).glob("*.json")) + sorted(Path(target_dir).glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    opts = {k: v for k, v in dataclasses.asdict(options).items() if k != "force"}
    h.update(json.dumps({"options": opts, "specpress": __version__}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def exported_dir_for(drafter_dir: str | Path, target_dir: str | Path, options: ExportOptions = ExportOptions(),
                     progress: Callable[[str], None] = lambda s: None) -> tuple[Path, bool]:
    """(the export directory of this drafter, whether it was exported now rather than reused)."""
    drafter_dir, target_dir = Path(drafter_dir).expanduser(), Path(target_dir).expanduser()
    out = cache_root() / "onnx" / export_key(drafter_dir, target_dir, options)
    if out.is_dir():
        try:
            load_manifest(out)
            progress(f"using the ONNX export of {drafter_dir} cached at {out}")
            return out, False
        except SpecpressError:
            pass  # a stale or foreign directory: export again over it
    progress(f"exporting {drafter_dir} to ONNX (once) into {out}")
    export_from_dirs(drafter_dir, target_dir, out, dataclasses.replace(options, force=True), progress)
    return out, True
