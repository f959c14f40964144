"""Calibration data for a compression step: the target's token stream of --data, and the windows drawn from it.

    target = load_target(target_dir)
    cal = load_calibration(target, target_dir, data_path, seq_len=128, batch=8, seed=0)
    sampler, heldout = cal.sampler(), cal.heldout()  # training windows; held-out ones (or None)

distill, quantize, prune and the sweep prepare their data here. A command's stream is split as distill
splits it (`split_stream`: the last 5% held out when it holds >= 20 windows); calibration and training
windows come from the rest, seeded with `seed`, the held-out ones with `seed + 1`. A sweep's calibration
stream is not split (nothing is held out). `compress_target` calibrates a --target-quant on
--target-quant-data or else on the training tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specpress.compress.data import WindowSampler, data_stream
from specpress.errors import DataError

FRESH_WINDOWS = 10_000_019  # first sampler step of the final agreement when there is no held-out data
HELDOUT_FRACTION = 0.05  # of the token stream, when it holds at least 20 windows


def split_stream(stream: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(training tokens, held-out tokens): the last 5% are held out when the stream has >= 20 windows."""
    if len(stream) < 20 * (seq_len + 1):
        return stream, None
    n = max(seq_len + 1, int(len(stream) * HELDOUT_FRACTION))
    return stream[:-n], stream[-n:]


def target_stream(target: Any, target_dir: str | Path, data: str | Path) -> np.ndarray:
    """--data -> the loaded target's token stream ([N] int32): encoded by the tokenizer in `target_dir`, documents
    joined by the target's first EOS (compress/data.py's data_stream)."""
    from specpress.models.tokenizer import load_tokenizer

    return data_stream(data, load_tokenizer(target_dir), target.config.eos_ids, target.config.vocab_size, target_dir)


@dataclass(frozen=True)
class Calibration:
    """The tokens a compression step draws its [batch, seq_len] windows from."""

    train: np.ndarray  # [N] calibration / training tokens
    held: np.ndarray | None  # [M] held-out tokens for the agreement; None when nothing is held out
    seq_len: int
    batch: int
    seed: int
    data: str  # the data, as a step's provenance names it

    def sampler(self, seq_len: int | None = None, batch: int | None = None, seed: int | None = None
                ) -> WindowSampler:
        """Windows of the training tokens; another shape or seed for a step that trains on them (recovery)."""
        return WindowSampler(self.train, self.seq_len if seq_len is None else seq_len,
                             self.batch if batch is None else batch, self.seed if seed is None else seed)

    def heldout(self) -> WindowSampler | None:
        """Windows of the held-out tokens (seed + 1); None when nothing is held out, or less than one window."""
        if self.held is None or len(self.held) <= self.seq_len:
            return None
        return WindowSampler(self.held, self.seq_len, self.batch, self.seed + 1)

    def record(self, measured: Any, inputs: str, *, with_seq_len: bool = False) -> dict[str, Any]:
        """The provenance step's `calibration`: the data, the windows and tokens `measured` ran on, the seed."""
        return {"data": self.data, "windows": measured.windows, "tokens": measured.tokens,
                **({"seq_len": self.seq_len} if with_seq_len else {}), "seed": self.seed, "inputs": inputs}

    def compress_target(self, target: Any, target_dir: str | Path, tq: Any, tq_data: str | Path | None
                        ) -> dict[str, Any]:
        """Compress `target` in place per the TargetQuant `tq`, calibrated (when it needs data) on `tq_data`, else
        on the training tokens; returns the step's record of it (spec, label, calibration)."""
        from specpress.compress.quantize.target import calibration_stream, compress_in_place

        calib = calibration_stream(tq_data, target_dir, target) if tq_data else self.train
        summary = compress_in_place(target, tq, calib if tq.needs_data() else None, seed=self.seed)
        return {"spec": tq.text, "label": tq.label,
                **({"calibration": {"data": str(tq_data or self.data), **summary["calibration"]}}
                   if summary.get("calibration") else {})}


def load_calibration(target: Any, target_dir: str | Path, data: str | Path, seq_len: int, batch: int,
                     seed: int) -> Calibration:
    """--data as a command's calibration: the target's token stream, at least one window long, split
    (`split_stream`)."""
    stream = target_stream(target, target_dir, data)
    if len(stream) < seq_len + 1:
        raise DataError(f"{data} holds {len(stream)} tokens, fewer than one window of {seq_len + 1}; give more "
                        f"data or a smaller --seq-len")
    return Calibration(*split_stream(stream, seq_len), seq_len, batch, seed, str(data))
