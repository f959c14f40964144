"""The ray executor: every point (build its drafter, measure acc@k, bench every run) is one Ray task that
reserves the recipe's executor.resources. The driver keeps the base, the pairing and results.jsonl.

Resources per point: `cpus` (default 1; also the task's torch threads), `gpus` (default: 1 when the
cluster reports GPUs, else 0), `memory_gb` (default: none reserved). Ray places each task on a node with
those free, so how many run at once follows from the cluster; --jobs caps it further.

Workers are reused across points (max_calls=0) and open the target and prompts once per worker process,
never per point. They write each point's artifact under OUT, so every node must see OUT at the same path
(a shared filesystem): a probe task checks that before any point is submitted, and each task checks again.
Ray retries a task whose worker died (`executor.retries` times, `max_retries`); after that the point is
recorded as failed with Ray's reason. Ctrl-C cancels the outstanding tasks.
"""

from __future__ import annotations

import socket
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from specpress.errors import RequestError
from specpress.sweep.executors import (ExecutorSpec, OnResult, OnStatus, Todo, WorkerSetup, died_records,
                                       measure_in_worker, require_ray)

PROBE_TIMEOUT_S = 600  # a fresh worker on a loaded node can take minutes to start
SHARED_FS = ("workers write each point under --out, so on a multi-node cluster --out must be on a filesystem "
             "that every node mounts at the same path (NFS, Lustre, a cloud file share); choose such an --out")


def _sees(out: str, probe: str, token: str) -> tuple[bool, str]:
    """(whether this worker reads `token` in OUT/probe, its host)."""
    p = Path(out) / probe
    try:
        ok = p.read_text() == token
    except OSError:
        ok = False
    return ok, socket.gethostname()


def _point_task(setup: WorkerSetup, probe: str, token: str, point: Any, runs: list[Any]) -> Any:
    ok, host = _sees(str(setup.out), probe, token)
    if not ok:
        return ("unseen", host)
    return measure_in_worker(setup, point, runs, None)


class RayExecutor:
    def __init__(self, spec: ExecutorSpec, jobs: int | None) -> None:
        self.spec, self.jobs = spec, jobs
        r = spec.resources
        gpu = "1 GPU if the cluster has GPUs" if r.gpus is None else f"{r.gpus:g} GPU"
        self._label = f"{r.cpus:g} CPU, {gpu}" + (f", {r.memory_gb:g} GiB" if r.memory_gb else "") + \
            f" per point; {spec.retries} retries"

    def threads(self, cores: int) -> int:
        return max(1, int(self.spec.resources.cpus))

    def describe(self, n: int, threads: int) -> str:
        cap = f"at most {self.jobs} at once" if self.jobs else "as many at once as the cluster's resources allow"
        return f"running {n} points as Ray tasks ({self._label}), {cap}, {threads} torch thread(s) each"

    def _options(self, ray: Any) -> dict[str, Any]:
        r = self.spec.resources
        have = ray.cluster_resources()
        gpus = r.gpus if r.gpus is not None else (1.0 if have.get("GPU", 0) > 0 else 0.0)
        for name, want, key in (("cpus", r.cpus, "CPU"), ("gpus", gpus, "GPU")):
            if want > have.get(key, 0):
                raise RequestError(f"executor.resources.{name} is {want:g} per point but the Ray cluster has "
                                   f"{have.get(key, 0):g} {key}(s) in all; lower it in the recipe or join a larger "
                                   f"cluster (--address)")
        opts: dict[str, Any] = {"num_cpus": r.cpus, "num_gpus": gpus, "max_retries": self.spec.retries,
                                "retry_exceptions": False, "max_calls": 0}
        if r.memory_gb:
            opts["memory"] = int(r.memory_gb * 2**30)
        return opts

    def run(self, setup: WorkerSetup, todo: Todo, on_result: OnResult, on_status: OnStatus) -> None:
        ray = require_ray()
        started = not ray.is_initialized()
        if started:
            ray.init(address=self.spec.address, include_dashboard=False)
        probe = f".ray-probe-{uuid.uuid4().hex[:12]}"
        token = uuid.uuid4().hex
        (setup.out / probe).write_text(token)
        inflight: dict[Any, tuple[Any, list[Any]]] = {}
        try:
            opts = self._options(ray)
            self._check_shared(ray, opts, str(setup.out), probe, token)
            task = ray.remote(**opts)(_point_task)
            setup_ref = ray.put(setup)
            pending = deque(todo)
            failed = 0
            while pending or inflight:
                while pending and (self.jobs is None or len(inflight) < self.jobs):
                    p, runs = pending.popleft()
                    inflight[task.remote(setup_ref, probe, token, p, runs)] = (p, runs)
                on_status(len(inflight), failed)
                ready, _ = ray.wait(list(inflight), num_returns=1)
                for ref in ready:
                    p, runs = inflight.pop(ref)
                    try:
                        recs = ray.get(ref)
                    except ray.exceptions.RayError as exc:  # worker died on every attempt, OOM, node lost
                        how = "raised" if isinstance(exc, ray.exceptions.RayTaskError) else \
                            f"failed on each of {self.spec.retries + 1} attempt(s)"
                        recs = died_records(p, runs, f"{type(exc).__name__}: the Ray task for this point {how}: "
                                                     f"{str(exc).strip().splitlines()[0][:300]}")
                    if isinstance(recs, tuple):
                        raise RequestError(f"a Ray worker on {recs[1]} cannot read {setup.out / probe}: {SHARED_FS}")
                    failed += any(r.get("status") != "ok" for r in recs)
                    on_result(p, runs, recs)
        except BaseException:  # Ctrl-C or an error: nothing keeps running for a driver that stopped
            for ref in inflight:
                ray.cancel(ref, force=True)
            raise
        finally:
            (setup.out / probe).unlink(missing_ok=True)
            if started:
                ray.shutdown()

    def _check_shared(self, ray: Any, opts: dict[str, Any], out: str, probe: str, token: str) -> None:
        """Fail at once when a worker cannot see --out (a multi-node cluster without a shared filesystem)."""
        ref = ray.remote(_sees).options(num_cpus=opts["num_cpus"], num_gpus=opts["num_gpus"]).remote(
            out, probe, token)
        try:
            ok, host = ray.get(ref, timeout=PROBE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise RequestError(f"no Ray worker with {self._label} started within {PROBE_TIMEOUT_S} s; check the "
                               f"cluster (`ray status`) or lower executor.resources") from None
        if not ok:
            raise RequestError(f"a Ray worker on {host} cannot read {out}/{probe}: {SHARED_FS}")
