"""Outputs: claimed before any work starts, held by one writer, written atomically, readable by all.

`claim_output` is the one check every command's --out (and bench --json) goes through, before loading
or training anything: the output must not be, contain or lie inside an input (refused even with
--force: a --force there would destroy the input); an existing output needs --force; its directory
must be writable; a `<out>.partial` left by an interrupted run needs --resume or --force. --force
replaces only what specpress wrote (`artifact_kind`: a drafter, an export, a zoo target, a sweep) or an
empty directory; any other existing directory is refused, --force or not. A single file (bench --json,
regenerate --out) is refused when it is or lies inside an input, like a directory. `check_output` runs
these checks alone (an output written at the end of the command); `claim_output` runs them, then
holds a lock (`.<name>.lock` beside the output, with the holder's pid) for the whole run, so a second
writer of the same output fails at once naming the first.

`atomic_dir` writes an artifact directory: a temp dir beside the target, then a rename; a failure
leaves the old artifact untouched. `write_file` / `write_json` write one file the same way (temp file
beside it, then os.replace). Files made through temp files get ordinary permissions (0644
under the usual umask), not the temp file's owner-only mode.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping

from specpress.errors import RequestError, UsageError

Kind = Literal["dir", "file"]


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_readable(path: Path) -> None:
    """Give `path` (and, for a directory, everything under it) the mode a plain open()/mkdir() would."""
    mask = umask()
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in paths:
        if not p.is_symlink():
            p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)


# ---------------------------------------------------------------------------------------------- locks

_HELD: dict[Path, list[Any]] = {}  # lock file -> [open file, depth]: reentrant within this process


def lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}.lock"


def _holder(f: Path) -> str:
    try:
        text = f.read_text().strip()
    except OSError:
        return "unknown"
    return text or "unknown"


@contextmanager
def hold_lock(out: Path | str) -> Iterator[None]:
    """Hold the writer's lock on `out` (reentrant here); another process holding it -> RequestError at once."""
    out = Path(out).expanduser().absolute()
    lf = lock_path(out)
    if lf in _HELD:
        _HELD[lf][1] += 1
        try:
            yield
        finally:
            _HELD[lf][1] -= 1
        return
    while True:
        try:
            fh = open(lf, "a+")
        except OSError as exc:
            raise RequestError(f"cannot write beside {out} ({exc.strerror}: {lf}); choose an --out in a writable "
                               f"directory") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise RequestError(f"{out} is being written by another specpress process ({_holder(lf)}); wait for "
                               f"it to finish or choose another --out") from None
        try:  # the holder may have removed the file between our open and our lock: lock the current one
            same = os.fstat(fh.fileno()).st_ino == os.stat(lf).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        fh.close()
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:300]}\n")
    fh.flush()
    _HELD[lf] = [fh, 1]
    try:
        yield
    finally:
        del _HELD[lf]
        try:
            lf.unlink()
        except OSError:
            pass
        fh.close()  # releases the lock after the file is gone: a waiter re-checks the inode


# ---------------------------------------------------------------------------------------------- claims


@dataclass
class OutputClaim:
    out: Path
    partial: Path | None = None
    notes: list[str] = field(default_factory=list)  # things the user should know (discarded partial, …)


def partial_path(out: Path) -> Path:
    """Where an interrupted run of `out` keeps its state (a directory or a file, by command)."""
    return out.with_name(out.name + ".partial")


def _relation(out: Path, inp: Path) -> str | None:
    if out == inp:
        return "is"
    if inp in out.parents:
        return "lies inside"
    if out in inp.parents:
        return "contains"
    return None


# What specpress writes, by the file that marks it (the writers' constants, checked equal in the tests; kept
# here as literals so that this module imports nothing heavy): file -> the "format" values it may carry.
MARKERS: dict[str, tuple[str, ...]] = {
    "manifest.json": ("specpress-onnx", "specpress-tensorrt-engines"),  # export onnx, export trt
    "target_manifest.json": ("specpress-onnx-target",),                 # export target (and its caches)
    "zoo.json": ("specpress-zoo",),                                     # zoo build
}
_MARKER_BYTES = 1 << 24  # a marker is a small JSON file; anything larger is not one of ours


def _read_marker(path: Path) -> Any:
    try:
        if not path.is_file() or path.stat().st_size > _MARKER_BYTES:
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON: not a specpress marker
        return None


def artifact_kind(path: Path | str) -> str | None:
    """What specpress wrote at directory `path` ('a drafter', 'an ONNX export', …), or None when it does not
    recognise it: a config.json with a `specpress` block (drafters, export hf), an export manifest with
    specpress's format, a zoo target's zoo.json, or a sweep's recipe.json."""
    path = Path(path)
    cfg = _read_marker(path / "config.json")
    if isinstance(cfg, dict) and isinstance(cfg.get("specpress"), dict) and "format_version" in cfg["specpress"]:
        return "a specpress drafter"
    for name, formats in MARKERS.items():
        raw = _read_marker(path / name)
        if isinstance(raw, dict) and raw.get("format") in formats:
            return f"a specpress {raw['format']} directory"
    recipe = _read_marker(path / "recipe.json")
    if isinstance(recipe, dict) and {"hash", "recipe"} <= recipe.keys():
        return "a specpress sweep"
    return None


def dir_listing(path: Path, shown: int = 3) -> str:
    try:
        names = sorted(p.name for p in path.iterdir())
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    more = f", … ({len(names)} entries)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_replaceable(out: Path | str, flag: str = "--out") -> None:
    """An existing directory may be replaced only when specpress wrote it or it is empty; refuse anything else
    (--force or not), naming a few of its entries."""
    out = Path(out).expanduser()
    if not out.is_dir() or artifact_kind(out) is not None or not any(out.iterdir()):
        return
    raise RequestError(f"{flag} {out} is a directory specpress did not write (it holds {dir_listing(out)}); --force "
                       f"replaces only a specpress artifact (drafter, export, zoo target, sweep) or an empty "
                       f"directory: remove it by hand or choose another {flag}")


def check_new(out: Path | str, force: bool, flag: str = "--out") -> None:
    """The one existence check: an existing output is replaced only when the user says --force, and only
    when specpress wrote it (a directory: `check_replaceable`)."""
    out = Path(out).expanduser()
    if out.exists():
        check_replaceable(out, flag)
        if not force:
            raise RequestError(f"{out} already exists; choose another {flag} or pass --force to replace it")


def check_inputs(out: Path, inputs: Mapping[str, Any], flag: str = "--out") -> None:
    """Refuse an output that is, lies inside, or contains an input (whatever --force says)."""
    ro = out.expanduser().resolve()
    for name, inp in inputs.items():
        if inp is None or str(inp).startswith("zoo:"):
            continue
        ri = Path(inp).expanduser().resolve()
        rel = _relation(ro, ri)
        if rel is not None:
            raise UsageError(f"{flag} {out} {rel} the input {name} {inp}: writing it would destroy the input "
                             f"(refused even with --force); choose another {flag}")


def check_writable(out: Path, flag: str = "--out") -> None:
    """The output's directory exists (or can be made) and takes new files: found now, not after the work."""
    out = Path(out).expanduser().absolute()
    anc = out.parent
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise RequestError(f"{flag} {out}: {anc} is a file, not a directory; choose another {flag}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.probe-")
        probe.close()
    except OSError as exc:
        raise RequestError(f"{flag} {out}: cannot write in {out.parent} ({exc.strerror}); choose a writable "
                           f"location") from None


def check_output(out: Path | str, *, force: bool = False, inputs: Mapping[str, Any] | None = None,
                 kind: Kind = "dir", flag: str = "--out") -> Path:
    """Every check on an output, in order, before any work: not an input (nor inside or around one), the
    kind it will be, new or replaceable with --force, writable. Returns the expanded path."""
    out = Path(out).expanduser()
    check_inputs(out, inputs or {}, flag)
    if out.exists() and (out.is_dir() != (kind == "dir")):
        raise RequestError(f"{flag} {out} exists and is {'a directory' if out.is_dir() else 'a file'}; "
                           f"a {kind} is written there; choose another {flag}")
    check_new(out, force, flag)
    check_writable(out, flag)
    return out


@contextmanager
def claim_output(out: Path | str, *, force: bool = False, inputs: Mapping[str, Any] | None = None,
                 kind: Kind = "dir", partial: bool = False, resume: bool = False,
                 flag: str = "--out") -> Iterator[OutputClaim]:
    """Check `out` as the module docstring says, then hold its lock while the caller works.

    partial: the command keeps `<out>.partial` for --resume; resume: the user asked to continue one.
    """
    out = check_output(out, force=force, inputs=inputs, kind=kind, flag=flag)
    claim = OutputClaim(out, partial_path(out) if partial else None)
    with hold_lock(out):
        part = claim.partial
        if part is not None and part.exists() and not resume:
            if not force:
                raise RequestError(f"an interrupted run left {part}; continue it with --resume, or pass --force to "
                                   f"discard it and start over")
            claim.notes.append(f"discarding the interrupted run's {part} (--force without --resume)")
        if part is not None and resume and not part.exists():
            claim.notes.append(f"--resume: no interrupted run at {part}; starting from the beginning")
        yield claim


# ---------------------------------------------------------------------------------------------- writing


@contextmanager
def atomic_dir(out: Path | str, *, force: bool = False) -> Iterator[Path]:
    """Yield a fresh temp dir; on success it replaces `out`, on error it is removed."""
    out = Path(out).expanduser()
    check_new(out, force)
    if out.exists() and not out.is_dir():
        raise RequestError(f"{out} exists and is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    with hold_lock(out):
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            yield tmp
            make_readable(tmp)  # mkdtemp and some writers (safetensors) make owner-only files
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


def write_file(path: Path | str, data: bytes | str) -> None:
    """Write one file atomically: a temp file beside it, flushed, then os.replace; readable like any other
    file. A failure (a full disk) leaves the old file as it was and no temp file behind."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        make_readable(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path | str, obj: Any) -> None:
    """Write JSON atomically (`write_file`)."""
    write_file(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")
