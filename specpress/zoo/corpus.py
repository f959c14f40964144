"""The zoo corpus: the running interpreter's Python standard-library source, split by path hash.

Every `*.py` under `sysconfig.get_paths()["stdlib"]` counts, except test folders (any path component
named `test`, `tests`, `idle_test`, ...) and installed packages (`site-packages`, `dist-packages`).
A file goes to the validation split when the sha1 of its relative POSIX path falls in the lowest
`VAL_PERMILLE`/1000 of the hash range, so the split never depends on which other files exist.
"""

from __future__ import annotations

import hashlib
import io
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specpress.errors import DataError, UsageError

Split = Literal["train", "val"]
SPLITS: tuple[Split, ...] = ("train", "val")

#: Share of files (per mille, by path hash) that form the validation split.
VAL_PERMILLE = 50

#: Directory names whose whole subtree is left out.
EXCLUDED_DIRS = frozenset({
    "test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages",
})


@dataclass(frozen=True)
class CorpusFile:
    """One source file: `relpath` is POSIX, relative to the stdlib root; `path` is absolute."""

    relpath: str
    path: Path
    size: int
    split: Split

    def read_text(self) -> str:
        """The file decoded with its PEP 263 encoding (UTF-8 by default); newlines kept as stored."""
        raw = self.path.read_bytes()
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
            return raw.decode(encoding)
        except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
            raise DataError(f"cannot decode corpus file {self.path}: {exc}") from exc


@dataclass(frozen=True)
class SplitStats:
    """Size of one split: files and bytes on disk."""

    files: int
    bytes: int


def stdlib_root() -> Path:
    """The running interpreter's stdlib directory; DataError if it holds no Python source."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir() or not (root / "os.py").is_file():
        raise DataError(
            f"the Python standard library source was not found at {root} (expected os.py there); "
            "the zoo corpus needs an interpreter that ships its stdlib as .py files"
        )
    return root


def split_of(relpath: str) -> Split:
    """Stable split of a relative POSIX path: sha1 of the path, first 4 bytes, mod 1000."""
    digest = hashlib.sha1(relpath.encode("utf-8")).digest()
    return "val" if int.from_bytes(digest[:4], "big") % 1000 < VAL_PERMILLE else "train"


def _excluded(rel: Path) -> bool:
    return any(part in EXCLUDED_DIRS for part in rel.parts[:-1])


def corpus_files(split: Split | None = None, *, root: Path | None = None,
                 max_files: int | None = None) -> list[CorpusFile]:
    """Corpus files sorted by relative path, optionally of one split.

    `root` defaults to `stdlib_root()`; `max_files` keeps only the first N files *of each split*
    (tests use it to stay small). DataError when the selection is empty.
    """
    if split is not None and split not in SPLITS:
        raise UsageError(f"unknown corpus split {split!r}; choose one of {', '.join(SPLITS)}")
    if max_files is not None and max_files < 1:
        raise UsageError(f"max_files must be >= 1, got {max_files}")
    base = stdlib_root() if root is None else Path(root)
    if not base.is_dir():
        raise DataError(f"corpus root {base} is not a directory")
    files: list[CorpusFile] = []
    taken = {s: 0 for s in SPLITS}
    for path in sorted(base.rglob("*.py"), key=lambda p: p.relative_to(base).as_posix()):
        rel = path.relative_to(base)
        if _excluded(rel) or not path.is_file():
            continue
        relpath = rel.as_posix()
        which = split_of(relpath)
        if (split is not None and which != split) or (max_files is not None and taken[which] >= max_files):
            continue
        taken[which] += 1
        files.append(CorpusFile(relpath=relpath, path=path, size=path.stat().st_size, split=which))
    if not files:
        what = f"{split} split" if split else "corpus"
        raise DataError(f"the {what} under {base} holds no .py files outside test folders")
    return files


def load_split_text(split: Split, *, root: Path | None = None, max_files: int | None = None) -> list[str]:
    """The documents (one string per file, in path order) of one split."""
    return [f.read_text() for f in corpus_files(split, root=root, max_files=max_files)]


def split_stats(files: list[CorpusFile]) -> dict[Split, SplitStats]:
    """Files and bytes per split."""
    return {s: SplitStats(files=sum(1 for f in files if f.split == s),
                          bytes=sum(f.size for f in files if f.split == s)) for s in SPLITS}


def corpus_fingerprint(files: list[CorpusFile]) -> str:
    """sha1 over (relpath, content) of every file: identifies the exact corpus a zoo was built from."""
    h = hashlib.sha1()
    for f in files:
        h.update(f.relpath.encode("utf-8") + b"\0")
        h.update(hashlib.sha1(f.path.read_bytes()).digest())
    return h.hexdigest()
