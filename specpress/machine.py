"""How busy the machine was while a run was timed: other processes' share of the CPUs the run may use.

Timings taken while another job competes for the same cores are not to be trusted (a τ = 1.00 drafter
once measured 1.96x). `LoadMeter` reads /proc/stat for the run's CPUs (sched_getaffinity) and
/proc/self/stat for the run's own CPU time, and reports the difference: what *others* used, not the
run's own threads. Where /proc is missing (macOS) it reports nothing rather than a guess.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMPETING_SHARE = 0.2  # others busy on >= 20 % of the run's cores on average: say so


@dataclass(frozen=True)
class Snapshot:
    wall: float  # seconds (monotonic)
    busy: float  # CPU-seconds the run's CPUs spent busy, all processes together
    own: float  # CPU-seconds this process (all its threads, waited-for children) used


def _ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def run_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def snapshot(cpus: list[int]) -> Snapshot | None:
    """Busy and own CPU time now (None where /proc cannot be read)."""
    try:
        stat = Path("/proc/stat").read_text().splitlines()
        own_fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    wanted = {f"cpu{i}" for i in cpus}
    busy = 0
    for line in stat:
        parts = line.split()
        if parts and parts[0] in wanted:
            vals = [int(v) for v in parts[1:9]]  # user nice system idle iowait irq softirq steal
            busy += sum(vals) - vals[3] - vals[4]
    own = sum(int(v) for v in own_fields[11:15])  # utime stime cutime cstime (fields 14-17)
    return Snapshot(time.monotonic(), busy / _ticks(), own / _ticks())


def other_share(before: Snapshot, after: Snapshot, ncpus: int) -> float:
    """Mean share (0..1) of the run's `ncpus` CPUs that other processes kept busy between two snapshots."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    others = (after.busy - before.busy) - (after.own - before.own)
    return min(1.0, max(0.0, others / (wall * ncpus)))


class LoadMeter:
    """Start before the timed work, `stop()` after: the machine's load to record beside the timings."""

    def __init__(self) -> None:
        self.cpus = run_cpus()
        self.start = snapshot(self.cpus)

    def stop(self) -> dict[str, Any] | None:
        end = snapshot(self.cpus)
        if self.start is None or end is None:
            return None
        share = other_share(self.start, end, len(self.cpus))
        return {"cpus": len(self.cpus), "other_cpu_share": round(share, 3),
                "own_cpu_s": round(end.own - self.start.own, 2), "wall_s": round(end.wall - self.start.wall, 2),
                "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def load_warning(machine: dict[str, Any] | None) -> str | None:
    """The warning to print when other processes competed for the run's cores (None when they did not)."""
    if not machine or machine["other_cpu_share"] < COMPETING_SHARE:
        return None
    return (f"warning: other processes kept {100 * machine['other_cpu_share']:.0f}% of the {machine['cpus']} CPU(s) "
            f"this run uses busy (load average {machine['loadavg_1m']}); tokens/s and speedup are not to be "
            f"trusted: rerun on a quiet machine")
