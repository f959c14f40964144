"""runtime.bench_pipeline: the library path `specpress bench` runs, called directly, gives what the CLI gives."""

from __future__ import annotations

import io
import json
import re

import pytest
import torch
from cli_common import run_main
from drafters_common import make, tiny_target
from rich.console import Console

from specpress.errors import UsageError
from specpress.models.drafter_io import save_drafter
from specpress.models.target import save_target
from specpress.decode.bench_pipeline import (
    bench_from_dirs,
    bench_request,
    summary_lines,
)


def _timings_masked(text: str) -> str:
    """Whitespace collapsed (rich wraps stderr), every decimal and the overhead percentage masked."""
    text = re.sub(r"\d+\.\d+", "X", " ".join(text.split()))
    return re.sub(r"overhead \d+%", "overhead X%", text)


def test_bench_from_dirs_equals_the_cli(tmp_path):
    target = tiny_target()
    with torch.no_grad():
        target.lm_head.weight[1] *= 25.0  # so a random drafter gets drafts accepted
    tdir = save_target(target, tmp_path / "target")
    ddir = save_drafter(make("eagle3", target), tmp_path / "eagle3")
    cdir = save_drafter(make("lm", target), tmp_path / "lm")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"input_ids": p}) for p in ([5, 9, 13, 2], [30, 31, 32], [7, 7])))
    opts = {"drafter_dir": ddir, "compare_dir": cdir, "policy": "dynamic:depth=3,topk=3,budget=8"}

    result = bench_from_dirs(tdir, prompts, 10, console=Console(file=io.StringIO()), **opts)
    out = tmp_path / "res.json"
    run = run_main("bench", "--target", tdir, "--prompts", prompts, "--max-new-tokens", 10, "--drafter", ddir,
                   "--compare-drafter", cdir, "--policy", "dynamic:depth=3,topk=3,budget=8", "--json", out)
    assert run.exit_code == 0, run.stderr
    cli = json.loads(out.read_text())

    assert result["tau"] == cli["tau"] and result["tau"] > 1.0
    assert result["lossless_mismatches"] == cli["lossless_mismatches"] == 0
    assert result["outputs"] == cli["outputs"] and result["compare"]["tau"] == cli["compare"]["tau"]
    lines = summary_lines(result)
    assert len(lines) == 3 and lines[2].startswith(f"compare {cdir} (torch): tau ")  # summary, coverage, compare
    assert _timings_masked("\n".join(lines)) in _timings_masked(run.stderr)
    assert _timings_masked("\n".join(lines)) == _timings_masked("\n".join(summary_lines(cli)))


def test_bench_request_refuses_as_the_cli(tmp_path):
    with pytest.raises(UsageError, match="--compare-drafter compares against --drafter; pass --drafter too"):
        bench_request(tmp_path, tmp_path / "p.jsonl", 8, compare_dir=tmp_path)
    with pytest.raises(UsageError, match="--compile compiles the drafter; pass --drafter too"):
        bench_request(tmp_path, tmp_path / "p.jsonl", 8, compile_drafter=True)
