"""bench/gpu_check.sh --dry-run: every command the GPU check runs for real, run on CPU at tiny sizes, so the
script is known to work up to its CUDA calls: target built here, drafter distilled, prompts, the torch and
onnxruntime benches, the drafter quantized and exported `--for` each serving engine with bench/serve_check.py's
engine call planned and run up to the GPU, the plugin export, its engines built ahead of time by TensorRT for RTX,
and the tensorrt bench; the serve checks and the tensorrt bench must take the command and stop with "needs a
GPU"; commands the dry run swaps for smaller ones are parsed by the CLI exactly as the real run gives them."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def test_gpu_check_dry_run(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "SKIP_TESTS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), "--dry-run"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = tmp_path / "out"
    steps = dict(line.split("\t")[:2] for line in (out / "steps.tsv").read_text().splitlines())
    assert proc.returncode == 0, (steps, proc.stdout[-3000:], proc.stderr[-3000:])
    for name in ("env", "target", "drafter", "prompts", "bench_torch", "export_onnx", "bench_onnxruntime", "cli"):
        assert steps[name] == "ok", (name, steps)
    assert steps["tests"] == "SKIPPED"  # this suite runs those tests itself
    summary = (out / "summary.md").read_text()
    assert summary.startswith("| step | status |") and "| bench_torch | ok |" in summary
    assert (out / "bench_torch.json").is_file() and (out / "gpu_check.log").is_file()
    assert steps["quantize_fp8"] == "ok"
    for eng in ("vllm", "sglang", "trtllm"):  # exported for each engine; loading it there needs a GPU
        assert steps[f"export_hf_{eng}"] == "ok" and steps[f"serve_plan_{eng}"] == "ok", (eng, steps)
        assert steps[f"serve_{eng}"] == "NEEDS-GPU", (eng, steps)
        plan = json.loads((out / f"serve_plan_{eng}.log").read_text())
        assert plan["engine"] == eng and str(out / f"served-{eng}") in json.dumps(plan["arguments"])
        log = (out / f"serve_{eng}.log").read_text()
        assert f"error: loading the export in {eng} needs a GPU" in log and "Traceback" not in log, log
    assert json.loads((out / "served-vllm" / "config.json").read_text())["quantization_config"]["quant_method"] == \
        "compressed-tensors"
    assert (out / "served-trtllm" / "hf_quant_config.json").is_file()
    accepted = (out / "cli.log").read_text()
    for real in ("zoo build --minutes 3", "distill --target", "export trt --onnx"):
        assert f"accepted: specpress {real}" in accepted, accepted
    if importlib.util.find_spec("tensorrt_rtx") is None:  # CI installs it: this branch is for bare machines
        assert steps["export_trt"] == "SKIPPED"
        return
    assert steps["export_onnx_plugin"] == steps["export_trt"] == steps["export_trt_probe"] == "ok", steps
    assert steps["bench_tensorrt"] == "NEEDS-GPU", steps
    log = (out / "bench_tensorrt.log").read_text()
    assert "error: the tensorrt backend needs a GPU" in log and "Usage" not in log and "Try '" not in log, log


def test_the_dry_runs_cli_check_refuses_a_command_the_cli_does_not_take():
    """Step `cli` parses with the script's own program; it must fail on what Click refuses."""
    program = re.search(r"export ACCEPTS='(.*?)'\n", SCRIPT.read_text(), re.S).group(1)
    ok = subprocess.run([sys.executable, "-c", program, "export", "trt", "--onnx", "x", "--out", "y"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("accepted: specpress export trt"), ok.stderr
    for bad in (["bench", "--backend", "tensorrt"], ["export", "trt", "--onnx", "x", "--nope"],
                ["zoo", "build", "--minutes", "0"], ["nope"]):
        res = subprocess.run([sys.executable, "-c", program, *bad], capture_output=True, text=True)
        assert res.returncode != 0 and res.stderr.startswith("error: "), (bad, res.stdout, res.stderr)
