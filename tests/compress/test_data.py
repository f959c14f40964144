"""Training/calibration data: every input form, clear errors, deterministic windows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specpress.compress.data import WindowSampler, read_texts
from specpress.errors import DataError


def test_text_jsonl_and_directory(tmp_path):
    (tmp_path / "a.txt").write_text("hello world")
    assert read_texts(tmp_path / "a.txt") == ["hello world"]
    j = tmp_path / "d.jsonl"
    j.write_text(json.dumps({"text": "one"}) + "\n" + json.dumps({"messages": [{"content": "q"}, {"content": "a"}]}))
    assert read_texts(j) == ["one", "q\na"]
    d = tmp_path / "code"
    (d / "pkg").mkdir(parents=True)
    (d / "pkg" / "m.py").write_text("x = 1\n")
    (d / "blob.bin").write_bytes(b"\x00\x01")
    assert read_texts(d) == ["x = 1\n"]


def test_bad_data_is_clear(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_texts(tmp_path / "nope")
    j = tmp_path / "bad.jsonl"
    j.write_text('{"text": "ok"}\n{"other": 1}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2"):
        read_texts(j)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no text"):
        read_texts(tmp_path / "empty")


def test_zoo_split_is_stdlib_text():
    texts = read_texts("zoo:val")
    assert texts and all(isinstance(t, str) for t in texts)
    assert 0 < len(texts) < len(read_texts("zoo:train")) / 5  # ~5 % of files are held out


def test_windows_depend_only_on_seed_and_step():
    stream = np.arange(1000, dtype=np.int32)
    a, b = WindowSampler(stream, 16, 4, seed=3), WindowSampler(stream, 16, 4, seed=3)
    assert (a.batch_at(7) == b.batch_at(7)).all()
    assert not (a.batch_at(7) == a.batch_at(8)).all()
    with pytest.raises(DataError, match="fewer than one window"):
        WindowSampler(stream[:10], 16, 4)
