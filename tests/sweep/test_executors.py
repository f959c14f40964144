"""The executor seam: recipe `executor:` (kept out of the hash), the local pool's dead-worker rule (a killed
worker fails only its own point, retried then recorded), and --executor ray without Ray installed."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from test_sweep_end_to_end import RECIPE, sweep, write_setup

from specpress.errors import ConfigError
from specpress.sweep.executors import ExecutorSpec, PointResources, parse_executor
from specpress.sweep.recipe import load_recipe
from specpress.sweep.results import read_results


def run_killing(recipe: Path, out: Path, jobs: int | None, executor: ExecutorSpec, kills: dict[str, int],
                timeout: float = 900) -> tuple[dict[str, set[int]], list[dict]]:
    """Run a sweep in a thread while SIGKILLing the worker of each point in `kills` that many times (as it
    shows up in OUT/running/); returns the pids each point ran in, and the final records."""
    from rich.console import Console

    from specpress.sweep.driver import Sweep

    error: list[BaseException] = []

    def go() -> None:
        try:
            s = Sweep(load_recipe(recipe), out, Console(file=io.StringIO()))
            s.open()
            s.run_all(jobs=jobs, executor=executor)
            s.finalize(show=False)
        except BaseException as exc:  # surfaced in the test thread
            error.append(exc)

    t = threading.Thread(target=go)
    t.start()
    pids: dict[str, set[int]] = {}
    deadline = time.monotonic() + timeout
    while t.is_alive() and time.monotonic() < deadline:
        for f in (out / "running").glob("*.json") if (out / "running").is_dir() else []:
            try:
                m = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            seen = pids.setdefault(m["point"], set())
            if m["pid"] not in seen:
                seen.add(m["pid"])
                if len(seen) <= kills.get(m["point"], 0):
                    try:
                        os.kill(m["pid"], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        time.sleep(0.02)
    t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not t.is_alive(), "the sweep did not finish"
    if error:
        raise error[0]
    return pids, read_results(out)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("exec")
    write_setup(root)
    (root / "two.yaml").write_text(yaml.safe_dump({**RECIPE, "grid": RECIPE["grid"][:2]}))
    return root


def test_executor_block_is_validated_and_kept_out_of_the_hash(setup):
    plain = load_recipe(setup / "two.yaml")
    (setup / "ray.yaml").write_text(yaml.safe_dump({**RECIPE, "grid": RECIPE["grid"][:2], "executor": {
        "kind": "ray", "address": "auto", "retries": 1, "resources": {"cpus": 2, "gpus": 0.5, "memory_gb": 4}}}))
    r = load_recipe(setup / "ray.yaml")
    assert r.executor == ExecutorSpec("ray", "auto", PointResources(2, 0.5, 4), 1)
    assert r.hash() == plain.hash() and plain.executor is None
    assert parse_executor("local") == ExecutorSpec()
    with pytest.raises(ConfigError, match="allowed: kind, address"):
        parse_executor({"kind": "ray", "gpu": 1})
    with pytest.raises(ConfigError, match="choose one of local, ray"):
        parse_executor("dask")
    with pytest.raises(ConfigError, match="resources.cpus must be a number >= 0"):
        parse_executor({"resources": {"cpus": -1}})


def test_executor_ray_without_ray_says_how_to_install(setup, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    res = sweep(setup / "two.yaml", "--out", setup / "noray", "--executor", "ray")
    assert res.exit_code != 0 and "pip install 'specpress[ray]'" in str(res.exception)
    assert not (setup / "noray").exists()  # refused before any work


@pytest.mark.slow  # ~50 s here: four worker processes each import torch and open the context
def test_local_pool_a_killed_worker_fails_only_its_point(setup):
    """int8's worker is killed on both its attempts (retries 1): recorded failed with the reason; int4-g8's
    is killed once: retried on a fresh worker and measured; the pool goes on throughout."""
    out = setup / "killed"
    pids, recs = run_killing(setup / "two.yaml", out, 2, ExecutorSpec(retries=1), {"int8": 2, "int4-g8": 1})
    by = {r["point"]: r for r in recs}
    assert len(pids["int8"]) == 2 and len(pids["int4-g8"]) == 2
    assert by["int8"]["status"] == "failed" and "killed by SIGKILL" in by["int8"]["error"]
    assert "2 attempt(s)" in by["int8"]["error"]
    assert by["int4-g8"]["status"] == "ok" and by["base"]["status"] == "ok"
    assert by["int4-g8"]["paired"] is not None and by["int4-g8"]["per_prompt_tau"]
    assert not list((out / "running").glob("*.json"))  # the driver clears a point's marker once recorded


def test_ctrl_c_stops_the_local_workers(setup):
    """A KeyboardInterrupt in the driver's loop (here raised from the progress callback) terminates every
    worker, busy or not, and propagates."""
    import multiprocessing as mp

    from specpress.sweep.executors import WorkerSetup
    from specpress.sweep.local_executor import LocalExecutor

    recipe = load_recipe(setup / "two.yaml")
    ws = WorkerSetup(recipe, setup / "ctrlc", setup / "target", setup / "drafter", "digest", 1)
    seen = []

    def interrupt(running: int, failed: int) -> None:
        seen.extend(p for p in mp.active_children() if p.is_alive())
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        LocalExecutor(ExecutorSpec(), 2).run(ws, [(p, [("chain:3", 0.0, "torch")]) for p in recipe.points[1:]],
                                             lambda *a: pytest.fail("no result expected"), interrupt)
    assert len(seen) == 2 and not any(p.is_alive() for p in seen)


def test_a_worker_that_cannot_open_the_context_records_why(setup, tmp_path):
    """What a worker returns when it cannot load the target (e.g. a node without it): failed records
    with the reason, one per run, rather than a worker exit that says nothing."""
    from specpress.sweep.executors import WorkerSetup, measure_in_worker

    recipe = load_recipe(setup / "two.yaml")
    ws = WorkerSetup(recipe, tmp_path, tmp_path / "no-target", setup / "drafter", "digest", 1)
    runs = [("chain:3", 0.0, "torch"), ("chain:3", 1.0, "torch")]
    recs = measure_in_worker(ws, recipe.points[1], runs, 1)
    assert [r["temperature"] for r in recs] == [0.0, 1.0] and all(r["status"] == "failed" for r in recs)
    assert "no-target" in recs[0]["error"] and recs[0]["traceback"]
    assert json.loads((tmp_path / "running" / "int8.json").read_text())["pid"] == os.getpid()
