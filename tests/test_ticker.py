"""Progress lines in logs: printed when stderr is a file, not when a live bar is drawn on a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from specpress.ticker import LogTicker


def test_prints_periodic_lines_only_off_terminal():
    log = io.StringIO()
    ticker = LogTicker(Console(file=log, force_terminal=False), "train", 10, every_s=0.0)
    ticker.tick(3, "loss 4.000")
    ticker.tick(4, "loss 3.900")
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("train 3/10 loss 4.000 (0:00 elapsed")

    tty = io.StringIO()
    quiet = LogTicker(Console(file=tty, force_terminal=True), "train", 10, every_s=0.0)
    quiet.tick(3, "loss 4.000")
    assert "train 3/10" not in tty.getvalue()


def test_respects_the_interval():
    log = io.StringIO()
    ticker = LogTicker(Console(file=log, force_terminal=False), "distill", 100, every_s=3600.0)
    for step in range(1, 50):
        ticker.tick(step, "")
    assert log.getvalue() == ""
