"""Calibration data for a compression step: the held-out split, the windows' seeds, the provenance record."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from specpress.compress.calibration import Calibration, split_stream
from specpress.compress.data import WindowSampler


def test_split_holds_out_the_last_tokens_only_of_a_long_stream():
    short = np.arange(20 * 9 - 1, dtype=np.int32)  # one token short of 20 windows of 8 (+1)
    train, held = split_stream(short, 8)
    assert held is None and train is short
    stream = np.arange(1000, dtype=np.int32)
    train, held = split_stream(stream, 8)
    assert held is not None and len(held) == 50  # 5 %
    assert np.array_equal(np.concatenate([train, held]), stream)
    _, held = split_stream(np.arange(20 * 9, dtype=np.int32), 8)  # 20 windows: one is held out
    assert held is not None and len(held) == 9


def test_windows_come_from_the_training_tokens_with_the_seed_and_the_heldout_with_the_next():
    train, held = split_stream(np.arange(1000, dtype=np.int32) % 97, 8)
    cal = Calibration(train, held, 8, 4, 3, "data.txt")
    assert torch.equal(cal.sampler().batch_at(5), WindowSampler(train, 8, 4, 3).batch_at(5))
    assert torch.equal(cal.sampler(16, 2, 7).batch_at(1), WindowSampler(train, 16, 2, 7).batch_at(1))
    heldout = cal.heldout()
    assert heldout is not None and torch.equal(heldout.batch_at(0), WindowSampler(held, 8, 4, 4).batch_at(0))
    assert Calibration(train, None, 8, 4, 3, "d").heldout() is None
    assert Calibration(train, held[:8], 8, 4, 3, "d").heldout() is None  # less than one window


def test_record_names_the_data_windows_and_seed():
    cal = Calibration(np.zeros(10, dtype=np.int32), None, 8, 4, 3, "zoo-train")
    measured = SimpleNamespace(windows=8, tokens=64)
    assert list(cal.record(measured, "first-step").items()) == [
        ("data", "zoo-train"), ("windows", 8), ("tokens", 64), ("seed", 3), ("inputs", "first-step")]
    assert list(cal.record(measured, "rounds", with_seq_len=True)) == [
        "data", "windows", "tokens", "seq_len", "seed", "inputs"]
