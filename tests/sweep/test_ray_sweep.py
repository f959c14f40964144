"""A tiny sweep through a local Ray cluster (2 CPUs, started once for the module): the same table as
in-process, a killed task retried and then recorded, --resume after the driver is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from test_executors import run_killing
from test_sweep_end_to_end import RECIPE, sweep, write_setup

from specpress.sweep.executors import ExecutorSpec
from specpress.sweep.results import read_results

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]  # ~3-4 min on a loaded 2-core machine: `pytest -m ray`

SAME = ("tau", "per_prompt_tau", "ar", "histogram", "bytes", "params", "bits_per_param", "agreement", "retention",
        "paired", "bytes_pct_base16", "lossless_mismatches", "status", "pareto")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray")
    write_setup(root)
    (root / "two.yaml").write_text(yaml.safe_dump({**RECIPE, "grid": RECIPE["grid"][:2]}))
    ray.init(num_cpus=2, include_dashboard=False)
    yield root, ray.get_runtime_context().gcs_address
    ray.shutdown()


def by_point(out):
    return {r["point"]: r for r in read_results(out)}


def test_ray_sweep_gives_the_in_process_table(cluster):
    root, _ = cluster
    local = sweep(root / "recipe.yaml", "--out", root / "local")
    assert local.exit_code == 0, (local.output, local.exception)
    res = sweep(root / "recipe.yaml", "--out", root / "viaray", "--executor", "ray")
    assert res.exit_code == 0, (res.output, res.exception)
    assert "as Ray tasks (1 CPU, 1 GPU if the cluster has GPUs per point; 2 retries)" in " ".join(res.output.split())
    a, b = by_point(root / "local"), by_point(root / "viaray")
    assert set(a) == set(b) == {"base", "int8", "int4-g8", "ffn20", "vocab10"}  # b in completion order
    for pid in a:
        for f in SAME:
            assert a[pid].get(f) == b[pid].get(f), (pid, f)
    assert b["ffn20"]["paired"]["resolved"] and b["vocab10"]["status"] == "failed"  # a failing point still records
    assert (root / "viaray" / "table.md").is_file() and not list((root / "viaray").glob(".ray-probe-*"))


def test_a_worker_that_cannot_see_out_fails_at_once(cluster, tmp_path):
    """The start probe: a worker reading another file at --out's path (a node without the shared
    filesystem) stops the sweep with the reason."""
    from specpress.errors import RequestError
    from specpress.sweep.ray_executor import RayExecutor

    ex = RayExecutor(ExecutorSpec(kind="ray"), None)
    (tmp_path / ".probe").write_text("another node's file")
    with pytest.raises(RequestError, match="every node mounts at the same path"):
        ex._check_shared(ray, ex._options(ray), str(tmp_path), ".probe", "the driver's token")
    (tmp_path / ".probe").write_text("the driver's token")
    ex._check_shared(ray, ex._options(ray), str(tmp_path), ".probe", "the driver's token")  # seen: no error


def test_a_killed_task_is_retried_then_recorded(cluster):
    """retries 1: int8's worker is killed on both attempts -> failed with Ray's reason; int4-g8's once ->
    retried and measured."""
    root, _ = cluster
    out = root / "killed"
    pids, recs = run_killing(root / "two.yaml", out, None, ExecutorSpec(kind="ray", retries=1),
                             {"int8": 2, "int4-g8": 1})
    by = {r["point"]: r for r in recs}
    assert len(pids["int8"]) == 2 and len(pids["int4-g8"]) == 2
    assert by["int8"]["status"] == "failed" and "2 attempt(s)" in by["int8"]["error"]
    assert "Worker" in by["int8"]["error"] or "died" in by["int8"]["error"], by["int8"]["error"]
    assert by["int4-g8"]["status"] == "ok" and by["int4-g8"]["paired"] is not None


def test_resume_after_the_driver_is_killed_redoes_only_missing_points(cluster):
    root, address = cluster
    out = root / "crash"
    code = "import sys; from specpress.cli import main; main(sys.argv[1:])"
    driver = subprocess.Popen([sys.executable, "-c", code, "sweep", str(root / "recipe.yaml"), "--out", str(out),
                               "--executor", "ray", "--address", address, "--jobs", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and driver.poll() is None:
        if len([ln for ln in (out / "results.jsonl").read_text().splitlines() if ln.endswith("}")]
               if (out / "results.jsonl").is_file() else []) >= 2:
            break
        time.sleep(0.05)
    assert driver.poll() is None, driver.stderr.read().decode()[-2000:]  # still running: kill it mid-sweep
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    before = {r["point"]: r for r in read_results(out)}
    assert "base" in before and 2 <= len(before) < 5
    res = sweep(root / "recipe.yaml", "--out", out, "--resume", "--executor", "ray")
    assert res.exit_code == 0, (res.output, res.exception)
    assert f"resuming: {len(before)} point(s) already measured" in " ".join(res.output.split())
    after = by_point(out)
    assert set(after) == {"base", "int8", "int4-g8", "ffn20", "vocab10"}
    for pid, rec in before.items():  # finished points were not redone: their records are the same lines
        assert after[pid]["time"] == rec["time"] and after[pid]["wall_s"] == rec["wall_s"]
    assert json.loads((out / "recipe.json").read_text())["hash"]


def test_ctrl_c_cancels_the_running_tasks(cluster):
    """A KeyboardInterrupt in the driver's loop (raised from the progress callback once both points' workers
    have started) force-cancels the tasks: their worker processes die, no result is delivered, and the
    interrupt propagates."""
    import io

    from rich.console import Console

    from specpress.sweep.driver import Sweep
    from specpress.sweep.executors import WorkerSetup
    from specpress.sweep.ray_executor import RayExecutor
    from specpress.sweep.recipe import load_recipe

    root, _ = cluster
    out = root / "ctrlc"
    s = Sweep(load_recipe(root / "two.yaml"), out, Console(file=io.StringIO()))
    s.open()
    ws = WorkerSetup(s.recipe, out, s.ctx.target_dir, s.ctx.base_dir, s.ctx.base_digest, 1)
    pids: list[int] = []

    def interrupt(running: int, failed: int) -> None:
        deadline = time.monotonic() + 300
        while len(pids) < 2 and time.monotonic() < deadline:
            pids[:] = [json.loads(f.read_text())["pid"] for f in (out / "running").glob("*.json")]
            time.sleep(0.05)
        assert len(pids) == 2, "both points' workers should have started"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        RayExecutor(ExecutorSpec(kind="ray"), 2).run(
            ws, [(p, [("chain:3", 0.0, "torch")]) for p in s.recipe.points[1:]],
            lambda *a: pytest.fail("no result expected after Ctrl-C"), interrupt)

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    deadline = time.monotonic() + 60
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), "a cancelled point's worker is still running"
