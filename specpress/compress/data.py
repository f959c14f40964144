"""Training and calibration data: text files, JSON lines, or a directory of text/code files.

Everything becomes one token stream (documents joined by EOS); batches are windows drawn from it
by a seeded generator, so a run is deterministic for its seed and can resume at any step.
"""

from __future__ import annotations

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


def encode_stream(texts: list[str], tokenizer: Any, eos_id: int) -> np.ndarray:
    """One int32 stream: doc0 EOS doc1 EOS …"""
    ids: list[int] = []
    for enc in tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos_id)
    return np.asarray(ids, dtype=np.int32)


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
    stream = encode_stream(read_texts(data), tokenizer, eos[0])
    check_ids(stream, vocab_size, data)
    return stream
