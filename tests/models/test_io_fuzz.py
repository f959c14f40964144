"""Hostile weight files: whatever the bytes, the loaders raise CheckpointError naming the file, never
another exception; a truncated file is caught from its header before anything is loaded."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specpress.errors import CheckpointError
from specpress.models.io import read_weights, save_weights, tensor_index

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _valid(tmp_path) -> bytes:
    f = tmp_path / "src.safetensors"
    save_weights({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.int64)}, f)
    return f.read_bytes()


def _load_both(path) -> None:
    """Both loaders either succeed or raise CheckpointError naming the file."""
    for fn in (read_weights, tensor_index):
        try:
            fn(path)
        except CheckpointError as exc:
            assert "model.safetensors" in str(exc)


def _write(tmp_path, data: bytes):
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "model.safetensors").write_bytes(data)
    return d


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_give_a_typed_error(tmp_path, data):
    _load_both(_write(tmp_path, data))


@FUZZ
@given(header=st.recursive(st.none() | st.booleans() | st.integers(-2, 2 ** 70) | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                           max_leaves=10),
       name=st.sampled_from(["a", "b", "__metadata__"]), key=st.sampled_from(["dtype", "shape", "data_offsets", None]))
def test_mutated_headers_give_a_typed_error(tmp_path, header, name, key):
    raw = _valid(tmp_path)
    n = struct.unpack("<Q", raw[:8])[0]
    obj = json.loads(raw[8:8 + n])
    if key is None:
        obj[name] = header
    elif isinstance(obj.get(name), dict):
        obj[name][key] = header
    else:
        obj = header
    h = json.dumps(obj).encode()
    _load_both(_write(tmp_path, struct.pack("<Q", len(h)) + h + raw[8 + n:]))


@FUZZ
@given(st.data())
def test_truncated_or_flipped_files_give_a_typed_error(tmp_path, data):
    raw = bytearray(_valid(tmp_path))
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    else:
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    _load_both(_write(tmp_path, bytes(raw)))


@pytest.mark.parametrize("case, expect", [
    ("huge_length", "header length field says"), ("list_header", "JSON list, not an object"),
    ("no_offsets", "data_offsets must be"), ("truncated", "truncated"), ("short", "shorter than"),
])
def test_malformed_files_are_named_and_explained(tmp_path, case, expect):
    raw = _valid(tmp_path)
    n = struct.unpack("<Q", raw[:8])[0]
    obj = json.loads(raw[8:8 + n])

    def pack(o) -> bytes:
        h = json.dumps(o).encode()
        return struct.pack("<Q", len(h)) + h + raw[8 + n:]

    data = {"huge_length": struct.pack("<Q", 2 ** 60) + raw[8:], "list_header": pack([obj]),
            "no_offsets": pack({**obj, "a": {k: v for k, v in obj["a"].items() if k != "data_offsets"}}),
            "truncated": raw[:-5], "short": raw[:5]}[case]
    d = _write(tmp_path, data)
    for fn in (read_weights, tensor_index):  # tensor_index is what `inspect` reports from
        with pytest.raises(CheckpointError, match=expect) as info:
            fn(d)
        assert str(d / "model.safetensors") in str(info.value)


def test_saved_weights_are_readable_by_everyone(tmp_path):
    f = tmp_path / "w.safetensors"
    save_weights({"a": torch.zeros(2)}, f)
    from specpress.artifacts import umask

    assert f.stat().st_mode & 0o777 == 0o666 & ~umask()  # 0644 under the usual umask, not the temp file's 0600
