"""compress.distill_pipeline: the library path `specpress distill` runs writes what the command writes and reports
what it prints; its refusals are the command's, in the same order."""

from __future__ import annotations

import re

import pytest
from cli_common import run_main
from drafters_common import random_eos_target, save_with_tokenizer

from specpress.compress.distill_pipeline import distill_pipeline, distill_request, report_lines
from specpress.errors import ConfigError, Deprecated, UsageError


def _masked(text: str) -> str:
    return re.sub(r"  \d+ s$", "  N s", text, flags=re.MULTILINE)  # the run's wall time


def test_the_pipeline_writes_the_cli_artifact_and_reports_its_lines(tmp_path):
    tdir, data = save_with_tokenizer(random_eos_target(), tmp_path)
    cli = run_main("distill", "--target", tdir, "--family", "eagle3", "--data", data, "--out", tmp_path / "cli",
                   "--steps", "2", "--batch", "2", "--seq-len", "16", "--draft-vocab", "40")
    assert cli.exit_code == 0, cli.stderr
    req = distill_request("eagle3", steps=2, batch=2, seq_len=16, draft_vocab=40)
    run = distill_pipeline(req, tdir, data, tmp_path / "lib")
    for name in ("model.safetensors", "config.json"):  # a fixed seed and step count: the same bytes
        assert (tmp_path / "lib" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    assert run.report.out == tmp_path / "lib" and run.report.steps == 2 and run.report.drafter.family == "eagle3"
    lines = report_lines(run)
    assert _masked(cli.stdout.replace(str(tmp_path / "cli"), str(tmp_path / "lib"))) == \
        _masked("".join(f"{ln}\n" for ln in lines))
    assert lines[1].startswith("  steps 2/2 (steps)") and "acc@k held-out" in lines[1]


def test_the_request_refuses_what_the_command_refuses_in_its_order(tmp_path):
    with pytest.raises(UsageError, match="give a budget"):
        distill_request("medusa")  # the budget is checked before the family
    with pytest.warns(Deprecated, match="use --dtype fp32"), \
            pytest.raises(ConfigError, match="unknown drafter family 'medusa'"):  # the warning, then the family
        distill_request("medusa", steps=2, legacy_bf16=False)
    with pytest.raises(ConfigError, match="'tv_weight' applies to"):
        distill_request("eagle3", steps=2, tv_weight=0.5)
    cli = run_main("distill", "--target", tmp_path / "t", "--family", "medusa", "--data", tmp_path / "d",
                   "--out", tmp_path / "o")
    assert cli.exit_code == 2 and "give a budget" in cli.stderr
    assert not (tmp_path / "o").exists()


def test_dtype_auto_trains_in_bf16_only_where_the_device_computes_it_natively(monkeypatch):
    import specpress.device as device

    for native in (True, False):
        monkeypatch.setattr(device, "native_bf16", lambda dev="cpu", native=native: native)
        assert distill_request("eagle3", steps=2).config.bf16 is native  # auto, the default
        assert distill_request("eagle3", steps=2, dtype="bf16").config.bf16 is True
        assert distill_request("eagle3", steps=2, dtype="fp32").config.bf16 is False
    with pytest.raises(UsageError, match="choose auto, bf16 or fp32"):
        distill_request("eagle3", steps=2, dtype="fp8")


def test_native_bf16_reads_the_cpu_features(monkeypatch):
    import torch

    from specpress.device import native_bf16

    for avx512_bf16, amx, expected in ((False, False, False), (True, False, True), (False, True, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert native_bf16("cpu") is expected
    assert native_bf16("meta") is False
