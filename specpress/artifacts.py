"""Artifact directories are written atomically: a temp dir beside the target, then a rename.

An existing artifact is never clobbered unless the caller says `force`; a failure leaves it untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from specpress.errors import UsageError


@contextmanager
def atomic_dir(out: Path | str, *, force: bool = False) -> Iterator[Path]:
    """Yield a fresh temp dir; on success it replaces `out`, on error it is removed."""
    out = Path(out).expanduser()
    if out.exists() and not force:
        raise UsageError(f"{out} already exists; choose another --out or pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it owner-only; an artifact is an ordinary directory
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
