"""The local executor's process pool: N spawned workers, one point each at a time, each opening its
SweepContext once. Unlike concurrent.futures' pool, a worker that dies (killed, out of memory) fails only
the point it held: that point is retried on a fresh worker up to `retries` times, then recorded as failed
with the exit code, and the other workers go on.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from specpress.sweep.executors import ExecutorSpec, OnResult, OnStatus, Todo, WorkerSetup, died_records


def _serve(conn: Connection, setup: WorkerSetup) -> None:
    """A worker's loop: receive (point, runs, attempt), send back its records; None ends it."""
    from specpress.sweep.executors import measure_in_worker

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send(measure_in_worker(setup, *msg))


@dataclass
class _Worker:
    proc: Any
    conn: Connection
    job: tuple[Any, list[Any], int] | None = None  # (point, runs, attempt)


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class LocalExecutor:
    def __init__(self, spec: ExecutorSpec, jobs: int) -> None:
        self.spec, self.jobs = spec, max(1, jobs)

    def threads(self, cores: int) -> int:
        return max(1, cores // self.jobs)

    def describe(self, n: int, threads: int) -> str:
        return f"running {n} points in {self.jobs} processes, {threads} torch thread(s) each"

    def run(self, setup: WorkerSetup, todo: Todo, on_result: OnResult, on_status: OnStatus) -> None:
        ctx = mp.get_context("spawn")
        queue = deque((p, runs, 1) for p, runs in todo)
        workers: list[_Worker] = []
        failed = 0

        def spawn() -> _Worker:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, setup), daemon=True)
            proc.start()
            child.close()
            return _Worker(proc, parent)

        try:
            while queue or any(w.job for w in workers):
                workers = [w for w in workers if w.proc.is_alive() or w.job]
                while queue and sum(1 for w in workers if w.job) < self.jobs:
                    w = next((w for w in workers if w.job is None and w.proc.is_alive()), None)
                    if w is None:
                        w = spawn()
                        workers.append(w)
                    w.job = queue.popleft()
                    w.conn.send(w.job)
                busy = [w for w in workers if w.job]
                on_status(len(busy), failed)
                ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy])
                for w in busy:
                    if w.conn not in ready and w.proc.sentinel not in ready:
                        continue
                    point, runs, attempt = w.job  # type: ignore[misc]
                    recs = None
                    if w.conn.poll():
                        try:
                            recs = w.conn.recv()
                        except (EOFError, OSError):
                            recs = None
                    if recs is not None:
                        w.job = None
                        failed += any(r.get("status") != "ok" for r in recs)
                        on_result(point, runs, recs)
                        continue
                    w.proc.join()
                    reason = _exit_reason(w.proc.exitcode)
                    w.job = None
                    w.conn.close()
                    if attempt <= self.spec.retries:
                        queue.appendleft((point, runs, attempt + 1))
                        continue
                    failed += 1
                    on_result(point, runs, died_records(
                        point, runs, f"WorkerDied: the worker process measuring this point died ({reason}) on "
                        f"each of {attempt} attempt(s)"))
        finally:  # normal end, Ctrl-C or an error: no worker outlives the sweep
            for w in workers:
                if w.proc.is_alive():
                    if w.job is None:
                        try:
                            w.conn.send(None)
                        except OSError:
                            pass
                    else:
                        w.proc.terminate()
            for w in workers:
                w.proc.join(timeout=10)
                if w.proc.is_alive():
                    w.proc.kill()
                    w.proc.join()
