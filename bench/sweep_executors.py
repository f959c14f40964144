"""Wall time of the tests' tiny sweep (base + 4 points, tiny random models) in-process, with --jobs 2 local
worker processes, and through a local 2-CPU Ray cluster (cold: fresh workers; warm: a second sweep on the
same workers), plus a no-op Ray task's round trip (the scheduling cost per point). Needs the ray extra.

    PYTHONPATH=. python bench/sweep_executors.py /tmp/sweep-exec
"""

from __future__ import annotations

import io
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    sys.path[:0] = ["tests", "tests/sweep"]
    import ray
    from rich.console import Console
    from test_sweep_end_to_end import write_setup

    from specpress.sweep.driver import Sweep
    from specpress.sweep.executors import ExecutorSpec
    from specpress.sweep.recipe import load_recipe

    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    recipe = write_setup(root)

    def timed(name: str, jobs: int, spec: ExecutorSpec) -> float:
        s = Sweep(load_recipe(recipe), root / name, Console(file=io.StringIO()), force=True)
        s.open()
        t = time.monotonic()
        s.run_all(jobs=jobs, executor=spec)
        dt = time.monotonic() - t
        print(f"{name}: run_all {dt:.1f} s", flush=True)
        return dt

    a = timed("inproc", 1, ExecutorSpec())
    timed("local2", 2, ExecutorSpec())
    t = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False)
    print(f"ray.init(num_cpus=2) {time.monotonic() - t:.1f} s", flush=True)
    c = timed("ray2", 2, ExecutorSpec(kind="ray"))
    d = timed("ray2-warm", 2, ExecutorSpec(kind="ray"))
    noop = ray.remote(num_cpus=1, max_calls=0)(lambda: 0)
    ray.get(noop.remote())
    rtt = []
    for _ in range(30):
        t = time.monotonic()
        ray.get(noop.remote())
        rtt.append(time.monotonic() - t)
    print(f"no-op task round trip: median {1000 * statistics.median(rtt):.1f} ms, max {1000 * max(rtt):.1f} ms")
    a2 = timed("inproc-again", 1, ExecutorSpec())
    print(f"ray/in-process wall ratio {c / a:.2f} cold, {d / a:.2f} warm (in-process twice: {a:.1f} s, {a2:.1f} s)")
    ray.shutdown()


if __name__ == "__main__":
    main()
