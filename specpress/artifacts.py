"""Outputs: claimed before any work starts, held by one writer, written atomically, readable by all.

`claim_output` is the one check every command's --out (and bench --json) goes through, before loading
or training anything: the output must not be, contain or lie inside an input (refused even with
--force: a --force there would destroy the input); an existing output needs --force; its directory
must be writable; a `<out>.partial` left by an interrupted run needs --resume or --force. --force
replaces only what specpress wrote (`artifact_kind`: a drafter, an export, a zoo target, a sweep), and only
an artifact of the kind the command writes (`writes`: a drafter over a drafter, never over a zoo target), or
an empty directory; any other existing directory is refused, --force or not, and left untouched. A
directory output that is a symbolic link is refused up front (its lock, its temp dir and the rename that
replaces it would act on the link, not on what it points to): the message names the link's target. A
single file (bench --json, regenerate --out) is refused when it is or lies inside an input, like a
directory. A Ctrl-C inside a claim says what was kept (`interrupted_claim`) unless the command says more.
`check_output` runs these checks alone (an output written at the end of the command); `claim_output` runs
them, then holds a lock (`.<name>.lock` beside the output, with the holder's pid) for the whole run, so a
second writer of the same output fails at once naming the first.

`atomic_dir` writes an artifact directory: a temp dir beside the target, then a rename; a failure
leaves the old artifact untouched. `write_file` / `write_json` / `save_torch` write one file the same way
(temp file beside it, then os.replace). Files made through temp files get ordinary permissions (0644
under the usual umask), not the temp file's owner-only mode. A full disk (ENOSPC, a quota) anywhere in
these writes, the lock's included, is a `WriteError` that names the output and says the old one stands;
the temp files are removed. Temp files carry the writer's pid: what a killed writer left beside an output
(`.<name>.tmp-<pid>-*`, `.<name>.old-<pid>`, a `.state.pt.tmp-<pid>` in its partial) is removed by the
next writer that claims it, and said so.

Every path a command writes lies under an output it claimed (`claimed_roots`; a cache directory claims
its entry the same way): tests/test_write_paths.py runs every command under an audit hook and fails on a
write anywhere else.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping

from specpress.errors import Interrupted, RequestError, UsageError, WriteError
from specpress.readback import (ARTIFACTS, MARKERS, artifact_format,  # noqa: F401 - MARKERS: checked in tests
                                artifact_kind)

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


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_error(exc: BaseException) -> OSError | None:
    """The full-disk OSError behind `exc` (itself, or its cause / context: torch.save wraps the one its file
    object raised in a RuntimeError), or None."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in DISK_FULL:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def full_disk(path: Path, err: OSError, kept: str) -> WriteError:
    """The one message for a full disk while writing `path`: what failed, what is free, what was kept."""
    try:
        free = f"{shutil.disk_usage(path.parent if not path.is_dir() else path).free:,} bytes free"
    except OSError:
        free = "free space unknown"
    return WriteError(f"cannot write {path}: {err.strerror or os.strerror(err.errno)} ({free} on that filesystem); "
                      f"{kept}; free some space or choose another location, then run again")


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
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:300]}\n")
        fh.flush()
    except OSError as exc:
        fh.close()
        lf.unlink(missing_ok=True)
        if exc.errno in DISK_FULL:
            raise full_disk(lf, exc, f"nothing was written to {out}") from None
        raise
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _writer_pid(name: str, marker: str) -> int | None:
    """The pid in a temp name `<anything><marker><pid>[-<random>]` (None when it carries none)."""
    digits = name.rpartition(marker)[2].split("-")[0].split(".")[0]
    return int(digits) if digits.isdigit() else None


def clean_leftovers(out: Path) -> list[str]:
    """Remove what a killed writer of `out` left (the caller holds `out`'s lock, so no live writer of `out`
    is using them): temp dirs / files `.<name>.tmp-<pid>*` and `.<name>.old-<pid>` beside it, and temp
    files `.*.tmp-<pid>*` inside `<out>.partial/`, each only when its pid is not a live process. An
    `.old-<pid>` with no `out` beside it is the previous artifact of a replace killed between its two
    renames: it is renamed back to `out`, not removed. Returns what was done, as notes for the user."""
    out = Path(out).expanduser().absolute()
    found: list[Path] = []
    for pattern in (".tmp-*", ".old-*", ".partial*.tmp-*"):
        found += out.parent.glob(f".{glob_escape(out.name)}{pattern}")
    part = partial_path(out)
    if part.is_dir():
        found += part.glob(".*.tmp-*")
    removed = []
    for p in sorted(found):
        old = ".tmp-" not in p.name
        pid = _writer_pid(p.name, ".old-" if old else ".tmp-")
        if pid is None or pid == os.getpid() or _pid_alive(pid):
            continue
        if old and not out.exists() and p.is_dir() and not p.is_symlink():
            p.rename(out)  # killed between atomic_dir's two renames: the previous artifact comes back
            removed.append(f"restored {out} from {p}, where a replace interrupted between its two renames left it")
            continue
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(f"removed {p} ({size:,} bytes), left by an interrupted run")
    return removed


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


# ---------------------------------------------------------------------------------------------- claims


@dataclass
class OutputClaim:
    out: Path
    partial: Path | None = None
    notes: list[str] = field(default_factory=list)  # told the user on stderr (discarded partial, leftovers, …)


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


def dir_listing(path: Path, shown: int = 3) -> str:
    try:
        names = sorted(p.name for p in path.iterdir())
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    more = f", … ({len(names)} entries)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_replaceable(out: Path | str, flag: str = "--out", writes: str | None = None) -> None:
    """An existing directory may be replaced only when it is empty or specpress wrote it, and (`writes`: the
    ARTIFACTS key of what the command writes) only by an artifact of its own kind; refuse anything else
    (--force or not), naming a few of its entries or what it is."""
    out = Path(out).expanduser()
    if not out.is_dir():
        return
    found = artifact_format(out)
    if found is not None:
        if writes is not None and found != writes:
            raise RequestError(f"{flag} {out} is {ARTIFACTS[found]}, not {ARTIFACTS[writes]}: it was left untouched "
                               f"(--force replaces only an artifact of the kind this command writes); choose another "
                               f"{flag}, or remove it by hand first")
        return
    if not any(out.iterdir()):
        return
    raise RequestError(f"{flag} {out} is a directory specpress did not write (it holds {dir_listing(out)}); --force "
                       f"replaces only a specpress artifact (drafter, export, zoo target, sweep) or an empty "
                       f"directory: remove it by hand or choose another {flag}")


def check_new(out: Path | str, force: bool, flag: str = "--out", writes: str | None = None) -> None:
    """The one existence check: an existing output is replaced only when the user says --force, and only
    when specpress wrote it as the kind `writes` (a directory: `check_replaceable`)."""
    out = Path(out).expanduser()
    if out.exists():
        check_replaceable(out, flag, writes)
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


def check_space(out: Path, need: int, what: str, flag: str = "--out") -> None:
    """At least `need` bytes free where `out` goes (`what` says why it needs them); else a RequestError now."""
    out = Path(out).expanduser().absolute()
    anc = out.parent
    while not anc.exists():
        anc = anc.parent
    free = shutil.disk_usage(anc).free
    if need > free:
        raise RequestError(f"{flag} {out} needs at least {need:,} bytes ({what}); {free:,} are free on that "
                           f"filesystem: free some space or choose another {flag}")


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
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.probe-") as probe:
            probe.write(bytes(4096))  # a full disk fails here, not after the work
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        free = ""
        if exc.errno in DISK_FULL:
            free = f", {shutil.disk_usage(anc).free:,} bytes free"
        raise RequestError(f"{flag} {out}: cannot write in {out.parent} ({exc.strerror}{free}); choose a writable "
                           f"location") from None


def check_symlink(out: Path, flag: str = "--out") -> None:
    """Refuse a directory output that is a symbolic link (dangling or not), saying where it points."""
    if out.is_symlink():
        target = Path(os.path.realpath(out))
        there = "what it points to" if target.exists() else "where it points (nothing is there yet)"
        raise RequestError(f"{flag} {out} is a symbolic link to {target}; specpress does not write an output through "
                           f"a link (it would replace the link, not {there}): pass {flag} {target} (with --force to "
                           f"replace what is there), or remove the link")


def check_output(out: Path | str, *, force: bool = False, inputs: Mapping[str, Any] | None = None,
                 kind: Kind = "dir", flag: str = "--out", in_place: bool = False, writes: str | None = None) -> Path:
    """Every check on an output, in order, before any work: not an input (nor inside or around one), not a
    symbolic link (a directory), the kind it will be, new or replaceable with --force by an artifact of kind
    `writes` (unless `in_place`: the command updates an existing output and checks it itself, as a sweep
    does), writable. Returns the expanded path."""
    out = Path(out).expanduser()
    check_inputs(out, inputs or {}, flag)
    if kind == "dir":
        check_symlink(out, flag)
    if out.exists() and (out.is_dir() != (kind == "dir")):
        raise RequestError(f"{flag} {out} exists and is {'a directory' if out.is_dir() else 'a file'}; "
                           f"a {kind} is written there; choose another {flag}")
    if not in_place:
        check_new(out, force, flag, writes)
    check_writable(out / ".probe" if in_place and kind == "dir" else out, flag)
    return out


@contextmanager
def claim_output(out: Path | str, *, force: bool = False, inputs: Mapping[str, Any] | None = None,
                 kind: Kind = "dir", partial: bool = False, resume: bool = False,
                 flag: str = "--out", companions: tuple[Path, ...] = (),
                 in_place: bool = False, writes: str | None = None) -> Iterator[OutputClaim]:
    """Check `out` as the module docstring says, then hold its lock while the caller works.

    writes: what the command writes there, a key of ARTIFACTS ("drafter", "specpress-onnx", …): required for
    a directory not updated in place, so that --force replaces only an artifact of that kind.
    partial: the command keeps `<out>.partial` for --resume; resume: the user asked to continue one.
    companions: files the command writes beside `out` (regenerate's card), checked like it (not an input).
    in_place: the command updates an existing directory and checks what is in it itself (sweep).
    """
    assert kind == "file" or in_place or writes in ARTIFACTS, f"claim_output({out}): writes={writes!r}"
    with ExitStack() as stack:
        for c in (Path(out).expanduser(), *companions):
            stack.enter_context(claimed(c))
            check_inputs(Path(c), inputs or {}, flag)
        out = check_output(out, force=force, inputs=inputs, kind=kind, flag=flag, in_place=in_place, writes=writes)
        claim = OutputClaim(out, partial_path(out) if partial else None)
        with hold_lock(out):
            claim.notes += clean_leftovers(out)
            if claim.notes and not in_place:
                check_new(out, force, flag, writes)  # a restored previous artifact is an existing output like any other
            part = claim.partial
            if part is not None and part.exists() and not resume:
                if not force:
                    raise RequestError(f"an interrupted run left {part}; continue it with --resume, or pass --force "
                                       f"to discard it and start over")
                claim.notes.append(f"discarding the interrupted run's {part} (--force without --resume)")
            if part is not None and resume and not part.exists():
                claim.notes.append(f"--resume: no interrupted run at {part}; starting from the beginning")
            for note in claim.notes:  # every command says what its claim found, in the same words
                print(f"note: {note}", file=sys.stderr)
            try:
                yield claim
            except KeyboardInterrupt:  # a command that keeps more says so itself (an Interrupted of its own)
                raise interrupted_claim(claim, in_place) from None
            finally:
                if part is not None and part.is_dir() and not part.is_symlink() and not any(part.iterdir()):
                    part.rmdir()  # an empty partial holds nothing to resume: it must not ask for --resume


def interrupted_claim(claim: OutputClaim, in_place: bool = False) -> Interrupted:
    """What a Ctrl-C inside a claim left, for a command that says nothing more itself: its partial (to resume),
    what an in-place output keeps, or that nothing was written to the output (and what was there stands)."""
    out, part = claim.out, claim.partial
    if part is not None and part.exists() and (part.is_file() or any(part.iterdir())):
        return Interrupted(f"interrupted: the work so far is kept in {part}; to continue, run the same command "
                           f"again with --resume")
    if in_place:
        return Interrupted(f"interrupted: what was finished is kept in {out}; to continue, run the same command "
                           f"again with --resume")
    stands = f"; the {out} that was there is untouched" if out.exists() else ""
    return Interrupted(f"interrupted: nothing was written to {out} (it is written only when the command "
                       f"finishes){stands}; run the same command again to start over")


_CLAIMED: list[Path] = []  # the outputs (and cache entries) claimed in this process, while they are held


def claimed_roots() -> list[Path]:
    """What this process may write under now: each claimed output (with its partial, lock and temp files
    beside it, `.<name>.*`) and cache entry."""
    return list(_CLAIMED)


@contextmanager
def claimed(out: Path) -> Iterator[None]:
    """Record `out` as claimed while the block runs (`claim_output` and `claim_cache` call it)."""
    root = Path(out).expanduser().absolute()
    _CLAIMED.append(root)
    try:
        yield
    finally:
        _CLAIMED.remove(root)


@contextmanager
def claim_cache(entry: Path | str) -> Iterator[list[str]]:
    """Claim a cache entry specpress owns (an on-demand export, the teacher's cache): its lock held while the
    block runs, leftovers of killed writers removed (yielded, for the caller to say), writes recorded."""
    entry = Path(entry).expanduser()
    with claimed(entry):
        check_writable(entry, "the cache")
        with hold_lock(entry):
            yield clean_leftovers(entry)


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A claimed temporary directory (the system's temp dir), removed when the block ends."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    with claimed(d):
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- writing


@contextmanager
def atomic_dir(out: Path | str, *, force: bool = False) -> Iterator[Path]:
    """Yield a fresh temp dir; on success it replaces `out`, on error it is removed. An existing `out` is
    replaced only by an artifact of its own kind (what the writer left in the temp dir): a caller that did
    not claim `out` for that kind is refused here, before the rename, with `out` untouched."""
    out = Path(out).expanduser()
    check_symlink(out)
    check_new(out, force)
    if out.exists() and not out.is_dir():
        raise RequestError(f"{out} exists and is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    with hold_lock(out):
        clean_leftovers(out)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
        except OSError as exc:
            if exc.errno in DISK_FULL:
                raise full_disk(out, exc, "nothing was written") from None
            raise
        try:
            yield tmp
            make_readable(tmp)  # mkdtemp and some writers (safetensors) make owner-only files
            found, made = (artifact_format(out), artifact_format(tmp)) if out.exists() else (None, None)
            if found is not None and found != made:  # an empty `out` (found None) takes anything
                raise RequestError(f"{out} is {ARTIFACTS[found]}, not "
                                   f"{ARTIFACTS[made] if made else 'a directory specpress marks as its own'}: it was "
                                   f"left untouched (--force replaces only an artifact of the kind written); choose "
                                   f"another output, or remove it by hand first")
            if out.exists():
                old = out.with_name(f".{out.name}.old-{os.getpid()}")
                out.rename(old)
                tmp.rename(out)
                shutil.rmtree(old)
            else:
                tmp.rename(out)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if (err := disk_error(exc)) is not None:
                kept = f"the old {out} is untouched" if out.exists() else f"nothing was left at {out}"
                raise full_disk(out, err, kept + " and the partial write was removed") from None
            raise


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A temp path beside `path` (named with this pid) that replaces `path` when the block succeeds; on any
    failure it is removed and the old `path` stands (a full disk: `WriteError`)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        make_readable(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if (err := disk_error(exc)) is not None:
            raise full_disk(path, err, f"the old {path.name} is untouched" if path.exists() else
                            "nothing was left behind") from None
        raise


def write_file(path: Path | str, data: bytes | str) -> None:
    """Write one file atomically: a temp file beside it, flushed, then os.replace; readable like any other
    file. A failure (a full disk) leaves the old file as it was and no temp file behind."""
    with atomic_file(Path(path)) as tmp, open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


def save_torch(path: Path | str, obj: Any) -> None:
    """torch.save `obj` atomically (as write_file); the file object is ours, so a full disk surfaces as
    the OSError it is rather than torch's 'unexpected pos' RuntimeError."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def write_json(path: Path | str, obj: Any) -> None:
    """Write JSON atomically (`write_file`)."""
    write_file(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")
