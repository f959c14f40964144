"""Where a sweep's points run: `local` (this process, or N spawned worker processes) or `ray` (one Ray task
per point). The driver (driver.py) measures the base itself, hands every other point to an executor, and
is the only writer of results.jsonl: an executor calls `on_result(point, runs, records)` in the driver's
thread as each point ends, in completion order.

Fault rule (both executors): a point whose worker dies (killed, out of memory, node lost) is retried up to
`retries` times, then recorded as failed with the reason; every other point goes on. Ctrl-C stops the
outstanding points (local: terminates the workers; ray: cancels the tasks) and re-raises.

A worker writes OUT/running/<point>.json (pid, host, attempt) as it starts a point, so a user (or a test)
sees where each point runs; the driver removes it when the point's records are written.

    spec = ExecutorSpec(kind="ray", address="auto", resources=PointResources(cpus=4, gpus=1))
    make_executor(spec, jobs=None).run(sweep, todo, on_result, on_status)
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from specpress.errors import ConfigError, RequestError
from specpress.sweep.grid import Point

KINDS = ("local", "ray")
RAY_INSTALL = "pip install 'specpress[ray]'"
Todo = list[tuple[Point, list[Any]]]  # (point, its missing runs)
OnResult = Callable[[Point, list[Any], list[dict[str, Any]]], None]
OnStatus = Callable[[int, int], None]  # (running, failed so far)


@dataclass(frozen=True)
class PointResources:
    """What one point's task reserves on a Ray cluster. gpus None: 1 when the cluster has GPUs, else 0."""

    cpus: float = 1.0
    gpus: float | None = None
    memory_gb: float | None = None  # None: no reservation

    def __post_init__(self) -> None:
        for name in ("cpus", "gpus", "memory_gb"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise ConfigError(f"executor.resources.{name} must be a number >= 0, found {v!r}")
        if self.cpus == 0 and not self.gpus:
            raise ConfigError("executor.resources: a point needs cpus > 0 or gpus > 0")


@dataclass(frozen=True)
class ExecutorSpec:
    """How points run; not part of the recipe's hash, so a sweep can be resumed under another executor."""

    kind: str = "local"
    address: str | None = None  # ray: None starts a local cluster; `auto`, `ray://host:10001`, or host:port
    resources: PointResources = field(default_factory=PointResources)
    retries: int = 2  # extra attempts for a point whose worker died

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"executor {self.kind!r} is not known; choose one of {', '.join(KINDS)}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError(f"executor.retries must be an integer >= 0, found {self.retries!r}")
        if self.address is not None and self.kind != "ray":
            raise ConfigError(f"an address ({self.address}) only applies to the ray executor, not {self.kind!r}")


def parse_executor(v: Any) -> ExecutorSpec:
    """The recipe's `executor:` value: `local`, `ray`, or {kind, address, retries, resources: {cpus, gpus,
    memory_gb}}."""
    if isinstance(v, str):
        return ExecutorSpec(kind=v)
    if not isinstance(v, dict):
        raise ConfigError(f"executor must be `local`, `ray` or a mapping {{kind: ray, resources: {{cpus: 2}}}}, "
                          f"found {v!r}")
    allowed = ("kind", "address", "retries", "resources")
    for k in v:
        if k not in allowed:
            raise ConfigError(f"unknown key {k!r} in executor; allowed: {', '.join(allowed)}")
    res = v.get("resources") or {}
    rallowed = ("cpus", "gpus", "memory_gb")
    if not isinstance(res, dict) or any(k not in rallowed for k in res):
        raise ConfigError(f"executor.resources must be a mapping with keys among {', '.join(rallowed)}, found {res!r}")
    return ExecutorSpec(kind=str(v.get("kind", "local")), address=v.get("address"),
                        retries=v.get("retries", 2), resources=PointResources(**res))


# ----------------------------------------------------------------------------------------------
# Worker side (shared by both executors)
# ----------------------------------------------------------------------------------------------


def running_dir(out: Path) -> Path:
    return Path(out) / "running"


def mark_running(out: Path, point: Point, attempt: int | None) -> None:
    d = running_dir(out)
    d.mkdir(parents=True, exist_ok=True)
    from specpress.artifacts import write_json

    write_json(d / f"{point.id}.json", {"point": point.id, "pid": os.getpid(), "host": socket.gethostname(),
                                        "attempt": attempt, "started": time.time()})


def clear_running(out: Path, point: Point) -> None:
    (running_dir(out) / f"{point.id}.json").unlink(missing_ok=True)


def died_records(point: Point, runs: list[Any], reason: str) -> list[dict[str, Any]]:
    """One failed record per run of a point that could not be measured (its worker died on every attempt,
    or could not open the sweep's context)."""
    return [{"point": point.id, "steps": [s.to_dict() for s in point.steps], "policy": r[0],
             "temperature": float(r[1]), "backend": r[2], "status": "failed", "error": reason, "traceback": []}
            for r in runs]


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs to open its own SweepContext (once per worker process)."""

    recipe: Any
    out: Path
    target_dir: Path
    base_dir: Path
    base_digest: str
    threads: int

    def key(self) -> tuple[str, str, str]:
        return (str(self.out), self.base_digest, self.recipe.hash())


_CTX: dict[tuple[str, str, str], Any] = {}


def worker_context(setup: WorkerSetup) -> Any:
    """This worker process's SweepContext (target, prompts, data streams): opened on its first point only."""
    if setup.key() not in _CTX:
        import torch

        from specpress.sweep.context import open_context

        torch.set_num_threads(max(1, setup.threads))
        _CTX.clear()
        _CTX[setup.key()] = open_context(setup.recipe, setup.out, setup.target_dir, setup.base_dir,
                                         setup.base_digest)
    return _CTX[setup.key()]


def measure_in_worker(setup: WorkerSetup, point: Point, runs: list[Any], attempt: int | None) -> list[dict[str, Any]]:
    from specpress.sweep.run import error_summary, measure_point

    mark_running(setup.out, point, attempt)
    try:
        ctx = worker_context(setup)
    except Exception as exc:  # e.g. the target unreadable on this node: recorded with the reason, not retried
        return [{**rec, **error_summary(exc)} for rec in died_records(point, runs, "")]
    return measure_point(ctx, point, runs)


# ----------------------------------------------------------------------------------------------
# Choosing one
# ----------------------------------------------------------------------------------------------


def make_executor(spec: ExecutorSpec, jobs: int | None) -> Any:
    if spec.kind == "ray":
        from specpress.sweep.ray_executor import RayExecutor

        return RayExecutor(spec, jobs)
    from specpress.sweep.local_executor import LocalExecutor

    return LocalExecutor(spec, jobs or 1)


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RequestError(f"--executor ray needs Ray, which is not installed; install it with {RAY_INSTALL} "
                           f"(or pip install ray), or use --executor local") from None
    return ray
