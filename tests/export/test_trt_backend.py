"""runtime/backends/tensorrt/runner.py on CPU: everything before a device is needed (no engine runs here)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from specpress.errors import CheckpointError, RequestError
from specpress.manifest import file_records
from specpress.runtime.backends.tensorrt import runner as backend
from specpress.runtime.backends.tensorrt.runner import (EngineSession, TensorRTRuntimeUnavailable, check_device,
                                                 load_runner, read_engine_manifest)


def _engine_dir(tmp_path, flavour="tensorrt_rtx", aot=True, ccs=("sm86",)):
    d = tmp_path / "engines"
    d.mkdir()
    (d / "level_step.engine").write_bytes(b"not a real engine")
    prof = {"q": {"min": [1, 4, 1, 64], "opt": [1, 4, 16, 64], "max": [1, 4, 64, 64]}}
    manifest = {"format": backend.ENGINE_FORMAT, "tensorrt": {"flavour": flavour, "version": "x", "ahead_of_time": aot},
                "compute_capabilities": list(ccs),
                "engines": {"level_step": {"file": "level_step.engine", "profiles": {"draft": prof}}},
                "files": file_records(d, ["level_step.engine"])}
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d, manifest


def test_manifest_errors(tmp_path):
    with pytest.raises(RequestError, match="not an `specpress export trt` output"):
        read_engine_manifest(tmp_path)
    d, m = _engine_dir(tmp_path)
    assert read_engine_manifest(d) == m
    (d / "level_step.engine").write_bytes(b"not a real engin!")  # same size, one byte changed
    with pytest.raises(CheckpointError, match=r"level_step.engine does not match its sha256 .*export trt"):
        read_engine_manifest(d)
    (d / "level_step.engine").unlink()
    with pytest.raises(CheckpointError, match="level_step.engine is missing from the export"):
        read_engine_manifest(d)
    (d / "manifest.json").write_text(json.dumps({**m, "engines": {"x": {"file": "../x.engine"}}}))
    with pytest.raises(CheckpointError, match=r"names the file '../x.engine', which is not a path inside"):
        read_engine_manifest(d)
    (d / "manifest.json").write_text(json.dumps({k: v for k, v in m.items() if k != "files"}))
    with pytest.raises(CheckpointError, match="records no sizes or sha256 .* older specpress"):
        read_engine_manifest(d)
    (d / "manifest.json").write_text(json.dumps({"format": "specpress-onnx"}))
    with pytest.raises(RequestError, match="expected 'specpress-tensorrt-engines'"):
        read_engine_manifest(d)


def test_no_cuda_is_a_clear_error_and_touches_no_tensorrt(tmp_path, monkeypatch):
    d, _ = _engine_dir(tmp_path)
    for name in ("tensorrt", "tensorrt_lean", "tensorrt_rtx"):
        monkeypatch.setitem(sys.modules, name, None)  # any import attempt would raise ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TensorRTRuntimeUnavailable, match="needs a GPU: it runs engines on a CUDA device"):
        load_runner(d, target=None, device=torch.device("cpu"))


def test_wrong_compute_capability_names_the_rebuild(tmp_path, monkeypatch):
    _, m = _engine_dir(tmp_path, ccs=("sm86", "sm89"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    with pytest.raises(TensorRTRuntimeUnavailable, match="--target-gpu sm90"):
        check_device(m, torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    check_device(m, torch.device("cuda", 0))  # built for it: no error
    m["tensorrt"]["ahead_of_time"] = False  # standard TensorRT: built on the GPU it runs on, no list check
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_device(m, torch.device("cuda", 0))


def test_missing_runtime_says_how_to_install(monkeypatch):
    for name in ("tensorrt", "tensorrt_lean"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(TensorRTRuntimeUnavailable, match=r"specpress\[trt\]"):
        backend.import_runtime("tensorrt")


def test_profile_choice():
    s = EngineSession.__new__(EngineSession)
    s.entry = {"file": "x.engine"}
    s.profiles = [{"q": {"min": [1, 1], "max": [1, 64]}}, {"q": {"min": [1, 1], "max": [1, 2048]}}]
    assert s._profile({"q": (1, 64)}) == 0
    assert s._profile({"q": (1, 65)}) == 1
    with pytest.raises(RequestError, match="outside every optimization profile"):
        s._profile({"q": (1, 4096)})
