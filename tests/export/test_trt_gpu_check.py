"""bench/gpu_check.sh --dry-run: the GPU check's steps on CPU at tiny sizes, so the script is known to work up
to its CUDA calls (target built here, drafter distilled, torch bench, the serving engines' exports and the engine
calls bench/serve_check.py would make, TensorRT probe build when installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "SKIP_TESTS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), str(tmp_path / "out"), "--dry-run"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = tmp_path / "out"
    steps = dict(line.split("\t")[:2] for line in (out / "steps.tsv").read_text().splitlines())
    assert proc.returncode == 0, (steps, proc.stdout[-3000:], proc.stderr[-3000:])
    for name in ("env", "target", "drafter", "prompts", "bench_torch"):
        assert steps[name] == "ok", (name, steps)
    assert steps["tests"] == "SKIPPED"  # this suite runs those tests itself
    summary = (out / "summary.md").read_text()
    assert summary.startswith("| step | status |") and "| bench_torch | ok |" in summary
    assert (out / "bench_torch.json").is_file() and (out / "gpu_check.log").is_file()
    assert steps["quantize_fp8"] == "ok"
    for eng in ("vllm", "sglang", "trtllm"):  # exported for each engine; loading it there needs a GPU
        assert steps[f"export_hf_{eng}"] == "ok" and steps[f"serve_plan_{eng}"] == "ok", (eng, steps)
        assert steps[f"serve_{eng}"] == "SKIPPED", (eng, steps)
        plan = json.loads((out / f"serve_plan_{eng}.log").read_text())
        assert plan["engine"] == eng and str(out / f"served-{eng}") in json.dumps(plan["arguments"])
    assert json.loads((out / "served-vllm" / "config.json").read_text())["quantization_config"]["quant_method"] == \
        "compressed-tensors"
    assert (out / "served-trtllm" / "hf_quant_config.json").is_file()
    trt_steps = [n for n in steps if n.startswith("export_trt")]
    assert trt_steps and all(steps[n] in ("ok", "SKIPPED") for n in trt_steps)
