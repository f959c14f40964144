"""Machine load beside the timings: other processes' share of the run's CPUs (issue 21, item 10)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from specpress.machine import LoadMeter, Snapshot, load_warning, other_share


def test_other_share_subtracts_the_runs_own_cpu_time():
    a = Snapshot(wall=0.0, busy=10.0, own=4.0)
    b = Snapshot(wall=2.0, busy=13.0, own=6.0)  # 3 CPU-s busy in 2 s on 2 CPUs, 2 of them ours
    assert other_share(a, b, 2) == pytest.approx(0.25)
    assert other_share(a, Snapshot(2.0, 12.0, 6.0), 2) == 0.0  # only our own work: nobody competes
    assert other_share(a, Snapshot(2.0, 30.0, 4.0), 2) == 1.0  # clipped to the CPUs we have


def test_warning_only_when_others_compete():
    quiet = {"cpus": 2, "other_cpu_share": 0.05, "loadavg_1m": 0.3}
    busy = {"cpus": 2, "other_cpu_share": 0.6, "loadavg_1m": 3.1}
    assert load_warning(quiet) is None and load_warning(None) is None
    assert "60% of the 2 CPU(s)" in load_warning(busy) and "not to be trusted" in load_warning(busy)


@pytest.mark.skipif(not os.path.exists("/proc/stat") or not hasattr(os, "sched_setaffinity"), reason="needs /proc")
def test_a_busy_process_on_our_cpu_is_seen():
    cpu = min(os.sched_getaffinity(0))
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        meter = LoadMeter()
        spin = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<1.5: pass"])
        os.sched_setaffinity(spin.pid, {cpu})
        spin.wait()
        m = meter.stop()
    finally:
        os.sched_setaffinity(0, old)
    assert m is not None and m["cpus"] == 1
    assert m["other_cpu_share"] >= 0.3 and m["own_cpu_s"] < 0.5  # the spinner was another process, not us


def test_bench_records_the_machine_load(tmp_path):
    from drafters_common import random_eos_target

    from specpress.cli import cli
    from specpress.models.target import save_target

    tdir = save_target(random_eos_target(), tmp_path / "t")
    (tmp_path / "p.jsonl").write_text('{"input_ids": [1, 2, 3]}\n')
    res = CliRunner().invoke(cli, ["bench", "--target", str(tdir), "--prompts", str(tmp_path / "p.jsonl"),
                                   "--max-new-tokens", "3", "--json", str(tmp_path / "m.json")])
    assert res.exit_code == 0, (res.output, res.exception)
    m = json.loads((tmp_path / "m.json").read_text())["machine"]
    assert m["cpus"] == len(os.sched_getaffinity(0)) and 0 <= m["other_cpu_share"] <= 1 and m["wall_s"] >= 0
    from specpress.artifacts import umask

    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o666 & ~umask()
