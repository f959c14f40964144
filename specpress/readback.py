"""Reading back files: the one reader of JSON files and lines, and of torch checkpoints.

Every JSON file specpress reads (its own manifests, cards, states and results, a model's config.json,
prompt and data lines) goes through `read_json` / `parse_json`, so a hostile file gets the same one-line
error everywhere instead of a traceback: a file that is not a regular file (a device, a FIFO), one larger
than the bound its kind allows (`max_bytes`: a 16 GiB config.json is not one), bytes that are not UTF-8,
text that is not JSON, and JSON nested deeper than `MAX_DEPTH` levels (a real config or manifest is a
handful deep; deeper ones crash Python's own recursion in json or later in the code that walks them).
The error class and the fix are the caller's: a config is a CheckpointError, a prompt line a DataError.

`load_torch` reads a `.pt` checkpoint with `torch.load(weights_only=True)` only: a pickle that would run
code, a file that is not a checkpoint and one that holds the wrong objects are refused in one line with
the fix, never with torch's advice to load it with weights_only=False (specpress never unpickles code).

`artifact_kind` (`artifact_format`: as a key of ARTIFACTS) says what specpress wrote at a directory, from the
marker file each writer leaves (what `--force` may replace, when the command writes that kind). The checks
on an export's files (inside the artifact, sizes and sha256 as recorded, format and version) are `specpress.manifest.verify_files` / `member` / `open_export`, which read through
`read_json` too.
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specpress.errors import CheckpointError, SpecpressError

MAX_DEPTH = 64  # nesting of any JSON specpress reads (configs and manifests are < 10 deep)
MAX_JSON_BYTES = 64 << 20  # a config.json, manifest, card or state; a tokenizer.json is read by its library
MAX_LINE_BYTES = 16 << 20  # one JSON line of data or results (prompt lines have their own, smaller bound)

ErrorType = Callable[[str], SpecpressError]


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def regular_file(path: Path, error: ErrorType = CheckpointError, fix: str = "") -> int:
    """The size of `path`, refused unless it is a regular file (a directory, a device such as /dev/zero or
    a FIFO never ends or never was one). Symlinks are followed."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise error(f"{path} does not exist" + (f"; {fix}" if fix else "")) from None
    except OSError as exc:
        raise error(f"{path} cannot be read ({exc.strerror})" + (f"; {fix}" if fix else "")) from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{path} is a directory, not a file" + (f"; {fix}" if fix else ""))
    if not stat.S_ISREG(st.st_mode):
        kind = ("a character device" if stat.S_ISCHR(st.st_mode) else "a block device" if stat.S_ISBLK(st.st_mode)
                else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file")
        raise error(f"{path} is {kind}, not a regular file" + (f"; {fix}" if fix else ""))
    return st.st_size


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `obj` (parsed JSON) nests lists / objects more than `limit` levels (walked without recursion)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            if d > limit:
                return True
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return False


def parse_json(text: str | bytes, where: str, fix: str = "", error: ErrorType = CheckpointError) -> Any:
    """`text` (a file's or a line's) parsed as JSON, or `error` naming `where` and what is wrong with it."""
    tail = f"; {fix}" if fix else ""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{where}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}){tail}"
                        ) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        sep = ":" if re.search(r":\d+$", where) else " is"  # `file:line: not valid JSON`, `file is not valid JSON`
        raise error(f"{where}{sep} not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno}){tail}") from None
    except RecursionError:
        obj = None
    else:
        if not too_deep(obj):
            return obj
    raise error(f"{where}: JSON nested more than {MAX_DEPTH} levels deep (no file specpress reads is){tail}")


def read_json(path: str | Path, fix: str = "", *, error: ErrorType = CheckpointError,
              max_bytes: int = MAX_JSON_BYTES, what: str = "JSON file") -> Any:
    """The JSON value in the file `path` (see the module docstring for what is refused)."""
    path = Path(path).expanduser()
    size = regular_file(path, error, fix)
    if size > max_bytes:
        raise error(f"{path} is {fmt_bytes(size)}; a {what} is at most {fmt_bytes(max_bytes)}"
                    + (f"; {fix}" if fix else ""))
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"{path} cannot be read ({exc.strerror})" + (f"; {fix}" if fix else "")) from None
    return parse_json(raw, str(path), fix, error)


def read_json_object(path: str | Path, fix: str = "", *, error: ErrorType = CheckpointError,
                     max_bytes: int = MAX_JSON_BYTES, what: str = "JSON file") -> dict[str, Any]:
    """`read_json`, refusing anything but a JSON object."""
    obj = read_json(path, fix, error=error, max_bytes=max_bytes, what=what)
    if not isinstance(obj, dict):
        raise error(f"{path} must hold a JSON object, found {type(obj).__name__}" + (f"; {fix}" if fix else ""))
    return obj


def load_torch(path: Path, fix: str, what: str = "checkpoint", *, mmap: bool = False) -> Any:
    """`torch.load(path, weights_only=True)` on the CPU (`mmap`: its tensors memory-mapped, not read, when the
    file is in torch's zip format, the only one torch maps); anything it refuses or cannot read is a
    CheckpointError naming the file and `fix` (a pickle that needs code to load is refused as such: specpress
    never runs it)."""
    import pickle
    import zipfile

    import torch

    regular_file(path, CheckpointError, fix)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:  # torch's weights-only reader refused it: code, or not a pickle at all
        found = re.search(r"Unsupported (global|operand)[^\n]*", str(exc))
        detail = f" ({found.group(0).strip().rstrip('.')})" if found else ""
        raise CheckpointError(f"{path} is not a {what} of plain tensors: torch's weights-only reader refused it"
                              f"{detail}, and specpress never unpickles code; {fix}") from None
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile, KeyError, IndexError,
            AttributeError, TypeError, UnicodeDecodeError, MemoryError, OverflowError) as exc:
        why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path} is not a readable {what} ({why}); {fix}") from None


def type_problem(value: Any, hint: Any) -> str | None:
    """Why the JSON value `value` does not fit the annotation `hint` (None when it does): the strict loaders'
    type check, so a manifest or state whose field has the wrong type is refused where it is read, not met
    as a TypeError deep in the code that uses it. Knows Any, None, bool, int, float, str, unions,
    tuple[X, ...], list[X], Mapping / dict[str, X] and dataclasses (a JSON object, checked by their loader)."""
    import dataclasses
    import types
    import typing
    from collections.abc import Mapping as AbcMapping

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return None
    if origin in (typing.Union, types.UnionType):
        problems = [type_problem(value, a) for a in args]
        return None if any(p is None for p in problems) else f"{_name(hint)}, found {_short(value)}"
    if hint is type(None):
        return None if value is None else f"null, found {_short(value)}"
    if hint is bool:
        return None if isinstance(value, bool) else f"true or false, found {_short(value)}"
    if hint in (int, float):
        ok = isinstance(value, int) if hint is int else isinstance(value, (int, float))
        return None if ok and not isinstance(value, bool) else f"{hint.__name__}, found {_short(value)}"
    if hint is str:
        return None if isinstance(value, str) else f"a string, found {_short(value)}"
    if dataclasses.is_dataclass(hint):
        return None if isinstance(value, (dict, hint)) else f"an object, found {_short(value)}"
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return f"a list, found {_short(value)}"
        elem = args[0] if args else Any
        if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
            if len(value) != len(args):
                return f"a list of {len(args)}, found {_short(value)}"
            pairs = list(zip(value, args, strict=True))
        else:
            pairs = [(v, elem) for v in value]
        for i, (v, h) in enumerate(pairs):
            if (p := type_problem(v, h)) is not None:
                return f"[{i}]: {p}"
        return None
    if origin in (dict, AbcMapping) or hint in (dict, AbcMapping):
        if not isinstance(value, dict):
            return f"an object, found {_short(value)}"
        vhint = args[1] if len(args) == 2 else Any
        for k, v in value.items():
            if (p := type_problem(v, vhint)) is not None:
                return f"[{k!r}]: {p}"
        return None
    return None  # an annotation this checker does not know: left to the loader


def _name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("NoneType", "null")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_types(cls: type, d: Any, where: str, error: ErrorType = CheckpointError) -> None:
    """Every field of the dataclass `cls` present in the mapping `d` fits its annotation (`type_problem`)."""
    import typing

    hints = typing.get_type_hints(cls)
    for name, value in d.items():
        if name in hints and (p := type_problem(value, hints[name])) is not None:
            raise error(f"{where}: {name!r} must be {p}" if not p.startswith("[") else f"{where}: {name}{p}")


# ---------------------------------------------------------------------------------------------- what specpress wrote

# What specpress writes, by the file that marks it (the writers' constants, checked equal in the tests; kept
# here as literals so that this module imports nothing heavy): file -> the "format" values it may carry.
MARKERS: dict[str, tuple[str, ...]] = {
    "manifest.json": ("specpress-onnx", "specpress-tensorrt-engines"),  # export onnx, export trt
    "target_manifest.json": ("specpress-onnx-target",),                 # export target (and its caches)
    "zoo.json": ("specpress-zoo",),                                     # zoo build
}
_MARKER_BYTES = 1 << 24  # a marker is a small JSON file; anything larger is not one of ours


def _read_marker(path: Path) -> Any:
    """The JSON in `path`, or None when it is missing or not readable JSON (then it marks nothing)."""
    if not path.is_file():
        return None
    try:
        return read_json(path, max_bytes=_MARKER_BYTES)
    except CheckpointError:
        return None


# What each kind of artifact is, in words, by `artifact_format`'s key (and the command that writes it).
ARTIFACTS: dict[str, str] = {
    "drafter": "a drafter (distill, prune, quantize, export hf)",
    "specpress-onnx": "an ONNX export (export onnx)",
    "specpress-tensorrt-engines": "a TensorRT engine export (export trt)",
    "specpress-onnx-target": "a target's ONNX export (export target)",
    "specpress-zoo": "a zoo target (zoo build)",
    "sweep": "a sweep's outputs (sweep)",
}


def artifact_format(path: Path | str) -> str | None:
    """The kind of artifact specpress wrote at directory `path`, as a key of ARTIFACTS, or None when it does
    not recognise it: a config.json with a `specpress` block (drafters, export hf), an export manifest with
    specpress's format, a zoo target's zoo.json, or a sweep's recipe.json."""
    path = Path(path)
    cfg = _read_marker(path / "config.json")
    if isinstance(cfg, dict) and isinstance(cfg.get("specpress"), dict) and "format_version" in cfg["specpress"]:
        return "drafter"
    for name, formats in MARKERS.items():
        raw = _read_marker(path / name)
        if isinstance(raw, dict) and raw.get("format") in formats:
            return str(raw["format"])
    recipe = _read_marker(path / "recipe.json")
    if isinstance(recipe, dict) and {"hash", "recipe"} <= recipe.keys():
        return "sweep"
    return None


def artifact_kind(path: Path | str) -> str | None:
    """What specpress wrote at directory `path` ('a specpress drafter', 'a specpress specpress-onnx
    directory', …), or None when it does not recognise it (`artifact_format`). `--force` replaces only these,
    and only one of the kind the command writes."""
    fmt = artifact_format(path)
    if fmt is None:
        return None
    return {"drafter": "a specpress drafter", "sweep": "a specpress sweep"}.get(fmt, f"a specpress {fmt} directory")
