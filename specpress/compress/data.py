"""Training and calibration data: text files, JSON lines, or a directory of text/code files.

Everything becomes one token stream (documents joined by EOS); batches are windows drawn from it
by a seeded generator, so a run is deterministic for its seed and can resume at any step.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from specpress.errors import DataError, RequestError
from specpress.limits import check_data_size
from specpress.readback import parse_json, regular_file

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".c", ".h", ".js", ".ts", ".java", ".go", ".rs", ".json", ".toml",
                 ".yaml", ".yml", ".cfg", ".sh")


def _jsonl_texts(path: Path) -> Iterable[str]:
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        obj = parse_json(line, f"{path}:{n}", error=DataError)
        if isinstance(obj, dict) and isinstance(obj.get("text"), str):
            yield obj["text"]
        elif isinstance(obj, dict) and isinstance(obj.get("messages"), list):
            parts = [m.get("content", "") for m in obj["messages"] if isinstance(m, dict)]
            yield "\n".join(p for p in parts if isinstance(p, str))
        else:
            raise DataError(f'{path}:{n}: each line needs "text" (a string) or "messages" (chat turns)')


ZOO_SPLITS = ("zoo:train", "zoo:val")


def check_data(path: str | Path) -> list[Path]:
    """The files --data `path` reads, checked before anything is loaded: it exists, it is a regular file or
    a directory (a device such as /dev/zero or a FIFO never ends), and its text fits in memory
    (limits.check_data_size). `zoo:train` / `zoo:val` are the zoo's own: []."""
    if str(path) in ZOO_SPLITS:
        return []
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"data path {path} does not exist")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        check_data_size(sum(f.stat().st_size for f in files), f"--data {path} ({len(files)} text files)")
        return files
    check_data_size(regular_file(path, DataError, "give a text file, a .jsonl file or a directory"), f"--data {path}")
    return [path]


def read_texts(path: str | Path) -> list[str]:
    """Documents from a text file, a .jsonl file ("text" or chat "messages"), a directory (recursive),
    or `zoo:train` / `zoo:val`: the zoo's split of this interpreter's standard library."""
    if str(path) in ZOO_SPLITS:
        from specpress.zoo.corpus import load_split_text

        return load_split_text(str(path).split(":")[1])  # type: ignore[arg-type]
    path = Path(path).expanduser()
    files = check_data(path)
    if path.is_dir():
        texts = [f.read_text(errors="replace") for f in files]
    else:
        if path.suffix in (".jsonl", ".ndjson"):
            texts = list(_jsonl_texts(path))
        else:
            try:
                texts = [path.read_text()]
            except UnicodeDecodeError:
                raise DataError(f"{path} is not a UTF-8 text file; give text, .jsonl, or a directory of text") from None
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise DataError(f"{path} holds no text (empty files, or no {', '.join(TEXT_SUFFIXES[:4])}… files)")
    return texts


ENCODE_DOCS = 64  # documents encoded per batch: each Encoding holds ~100 bytes a token (ids, offsets, strings)


def encode_stream(texts: list[str], tokenizer: Any, eos_id: int) -> np.ndarray:
    """One int32 stream: doc0 EOS doc1 EOS … Encoded ENCODE_DOCS documents at a time into int32 arrays:
    encoding 4 MB of text in one batch into a Python list held ~450 MB after it returned (and 700 MB at
    its peak); a document's own Encoding is still made whole."""
    eos = np.asarray([eos_id], dtype=np.int32)
    parts: list[np.ndarray] = []
    for i in range(0, len(texts), ENCODE_DOCS):
        for enc in tokenizer.encode_batch(texts[i:i + ENCODE_DOCS], add_special_tokens=False):
            parts += [np.asarray(enc.ids, dtype=np.int32), eos]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


@dataclass(frozen=True)
class WindowSampler:
    """Deterministic [B, T] windows from a token stream: batch `step` depends only on (seed, step)."""

    stream: np.ndarray
    seq_len: int
    batch: int
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.stream) < self.seq_len + 1:
            raise DataError(f"data has {len(self.stream)} tokens, fewer than one window of {self.seq_len + 1}; "
                            f"give more data or a shorter sequence length")

    def batch_at(self, step: int) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, len(self.stream) - self.seq_len, size=self.batch)
        return torch.from_numpy(np.stack([self.stream[s:s + self.seq_len] for s in starts]).astype(np.int64))


def check_ids(stream: np.ndarray, vocab_size: int, source: str | Path) -> None:
    """Every id of `stream` must index the target's vocabulary (caught here, not as an IndexError later)."""
    if len(stream) and (int(stream.max()) >= vocab_size or int(stream.min()) < 0):
        bad = int(stream.max()) if int(stream.max()) >= vocab_size else int(stream.min())
        raise DataError(f"{source}: token id {bad} is outside the target's vocabulary (0..{vocab_size - 1}); "
                        f"was the data tokenized for another model?")


def data_stream(data: str | Path, tokenizer: Any | None, eos_ids: Iterable[int], vocab_size: int,
                target: str | Path) -> np.ndarray:
    """--data -> the target's token stream: documents encoded by its tokenizer, joined by its first EOS.

    The one path every command takes (distill, prune, quantize, regenerate, sweep), so each refuses the
    same inputs with the same words.  Returns: [N] int32.
    """
    if tokenizer is None:
        raise DataError(f"--data {data} is text, but the target {target} has no tokenizer.json to encode it; copy "
                        f"the model's tokenizer.json into {target}")
    eos = list(eos_ids)
    if not eos:
        raise RequestError(f"{target}/config.json has no eos_token_id, needed to join documents; add one")
    from specpress.machine import release_memory

    stream = encode_stream(read_texts(data), tokenizer, eos[0])
    release_memory()  # the tokenizer's freed Encodings: ~110 bytes per byte of one long text, kept otherwise
    check_ids(stream, vocab_size, data)
    return stream


ZOO_WORDS = {"zoo-train": "train", "zoo-val": "val", "zoo:train": "train", "zoo:val": "val"}  # recipe and CLI words


@dataclass(frozen=True)
class DataSource:
    """A zoo corpus split (`zoo-train` / `zoo-val`) or a file / directory path."""

    zoo_split: str | None = None
    path: Path | None = None
    drafter_data: bool = False  # a recipe's `drafter-data`: the chat data its base drafter was distilled on

    def to_json(self) -> str:
        if self.drafter_data:
            return "drafter-data"
        return f"zoo-{self.zoo_split}" if self.zoo_split else str(self.path)

    @classmethod
    def parse(cls, text: str) -> "DataSource":
        """`zoo:train`, `zoo-val`, ... or a path (a user's `~` expanded)."""
        return cls(zoo_split=ZOO_WORDS[text]) if text in ZOO_WORDS else cls(path=Path(text).expanduser())


def token_stream(source: DataSource, tokenizer: Any | None, eos_id: int | None, vocab_size: int,
                 cache_dir: Path | None = None, tokenizer_tag: str = "", target: str | Path = "the target"
                 ) -> np.ndarray:
    """The int32 token stream of a data source (documents joined by EOS), cached under cache_dir; every id
    is checked against the target's vocabulary here, when the sweep opens, not inside each point."""
    key = hashlib.sha256(json.dumps({"source": source.to_json(), "tokenizer": tokenizer_tag, "eos": eos_id},
                                    sort_keys=True, default=str).encode()).hexdigest()[:16]  # as sweeps keyed it
    cached = cache_dir / f"tokens-{key}.npy" if cache_dir is not None else None
    if cached is not None and cached.is_file():
        stream = np.load(cached, mmap_mode="r")
        check_ids(stream, vocab_size, source.to_json())
        return stream
    stream = _read_stream(source, tokenizer, eos_id, vocab_size, target)
    check_ids(stream, vocab_size, source.to_json())
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp.npy")
        np.save(tmp, stream)
        tmp.replace(cached)
    return stream


def _read_stream(source: DataSource, tokenizer: Any | None, eos_id: int | None, vocab_size: int,
                 target: str | Path) -> np.ndarray:
    if source.path is not None and not source.path.exists():
        raise DataError(f"data {source.path} does not exist; fix the recipe's path (relative paths start at the "
                        f"recipe's directory)")
    if source.path is not None and source.path.suffix == ".jsonl" and source.path.is_file():
        check_data_size(regular_file(source.path, DataError), f"data {source.path}")
        try:
            lines = source.path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise DataError(f"{source.path} is not UTF-8 text; save it as UTF-8 JSON lines") from None
        first = next((ln for ln in lines if ln.strip()), "")
        if '"input_ids"' in first:
            ids: list[int] = []
            for n, line in enumerate(lines, start=1):
                if line.strip():
                    obj = parse_json(line, f"{source.path}:{n}", error=DataError)
                    row = obj.get("input_ids") if isinstance(obj, dict) else None
                    if not isinstance(row, list) or not all(isinstance(i, int) for i in row):
                        raise DataError(f"{source.path}:{n}: \"input_ids\" must be a list of integers")
                    ids += row + ([eos_id] if eos_id is not None else [])
            return np.asarray(ids, dtype=np.int32)
    if tokenizer is None:
        raise DataError(f"data {source.to_json()} is text but the target has no tokenizer.json; give a .jsonl of "
                        f"{{\"input_ids\": [...]}} lines instead")
    data = f"zoo:{source.zoo_split}" if source.zoo_split is not None else source.path
    return data_stream(data, tokenizer, () if eos_id is None else (eos_id,), vocab_size, target)  # type: ignore
