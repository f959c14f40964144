"""What this machine can take, and how busy it was.

Memory: what is free now (`available_bytes`) and rough lower bounds on what a step (`step_bytes`: logits,
attention scores and activations of one [batch, seq_len] step) and a KV cache (`kv_bytes`) hold, so a
refusal built on them is certain to be right while a pass promises nothing. The refusals themselves read the
target's config.json, so they live above models/: compress/guards.py's `check_seq_len` (a training or
regeneration window) and runtime/plain.py's `check_decode` (a prompt plus --max-new-tokens), both before
the work starts rather than leaving it to the kernel's OOM killer.

Load: how busy the machine was while a run was timed: other processes' share of the CPUs the run may use.

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
    own: float  # CPU-seconds this process (all its threads) used; reaped children are others


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
    own = int(own_fields[11]) + int(own_fields[12])  # utime + stime (fields 14, 15): every thread of ours
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


# ---------------------------------------------------------------------------------------------- memory


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


LARGE_BLOCK = 4 << 20  # bytes: blocks this large or larger are mapped on their own and unmapped when freed


def map_large_blocks() -> None:
    """Have glibc give every block of LARGE_BLOCK bytes or more its own mapping, returned to the system when
    freed. By default glibc raises its mmap threshold (up to 32 MiB) each time such a block is freed, so later
    activations, logits and gradients of a training step come from the heap, which only shrinks from its top:
    measured on a 2-step distill (8-layer 512-wide target, EAGLE-3 drafter), the peak resident memory was
    1.22-1.34 GiB over four runs without this and 0.96 GiB with it, at the same wall time (tests/test_plan.py
    checks plan's prediction against such peaks). Called once, at the CLI's start; elsewhere a no-op."""
    import ctypes

    try:  # M_MMAP_THRESHOLD is -3 in glibc's malloc.h; setting it also turns the dynamic threshold off
        ctypes.CDLL(None).mallopt(-3, LARGE_BLOCK)
    except (OSError, AttributeError):  # not glibc: its own allocator's policy stays
        pass


def release_memory() -> None:
    """Give memory freed by Python and torch back to the system: a garbage collection, then glibc's
    malloc_trim (freed blocks under glibc's mmap threshold, e.g. a target converted tensor by tensor, stay
    in its heap otherwise: measured, a released 0.8 GB fp32 target kept the process 0.8 GB larger)."""
    import ctypes
    import gc

    gc.collect()
    try:  # the process's own symbols (libc's among them): ctypes.util.find_library would spawn ldconfig
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        pass


def step_bytes(cfg: Any, batch: int, seq_len: int, training: bool) -> int:
    """A lower bound on the memory one [batch, seq_len] step of `cfg` (a TargetConfig) holds at its peak."""
    b, t, f = batch, seq_len, 4  # fp32 bytes
    logits = b * t * cfg.vocab_size * f * (4 if training else 2)  # target + drafter logits, softmax, grads
    scores = b * cfg.num_attention_heads * t * t * f * 2  # one layer's attention weights (+ its softmax)
    acts = b * t * cfg.hidden_size * f * (cfg.num_hidden_layers + 2) * (4 if training else 1)
    return logits + scores + acts


def fmt_bytes(n: float) -> str:
    """`n` bytes in B / KiB / MiB / GiB / TiB, one decimal (the refusals' unit)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def kv_bytes(cfg: Any, capacity: int, dtype_bytes: int = 4, batch: int = 1) -> int:
    """Bytes of the target's KV cache for `capacity` positions of `batch` rows (K and V, every layer), as
    models/kv.py allocates it up front."""
    return 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * capacity * cfg.head_dim * dtype_bytes
