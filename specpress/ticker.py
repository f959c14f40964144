"""Progress display: the columns every specpress progress bar shows (`bar_columns`), plain lines for logs
(rich's live bars draw nothing until they finish when stderr is not a terminal, `... > build.log 2>&1`, so
long jobs also print one plain line every so often there), and `count_bar`, the plain counting bar of long
loops."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console


def bar_columns(*fields: str, eta: bool = False, bar_width: int | None = 40) -> tuple[Any, ...]:
    """label, bar, done/total, then `fields` (TextColumn templates such as "loss {task.fields[loss]}"),
    elapsed, and with `eta` the estimated time left."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    cols: list[Any] = [TextColumn("{task.description}"), BarColumn(bar_width=bar_width), MofNCompleteColumn(),
                       *(TextColumn(f) for f in fields), TimeElapsedColumn()]
    if eta:
        cols += [TextColumn("eta"), TimeRemainingColumn()]
    return tuple(cols)


class LogTicker:
    """`tick(step, text)` prints `label step/total text (elapsed)` at most every `every_s` seconds, and
    only when `console` is not a terminal (a live bar shows the same there)."""

    def __init__(self, console: Console, label: str, total: int, every_s: float = 60.0) -> None:
        self.console, self.label, self.total, self.every_s = console, label, total, every_s
        self.enabled = not console.is_terminal
        self.t0 = self.last = time.monotonic()

    def tick(self, step: int, text: str) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < self.every_s:
            return
        self.last = now
        m, s = divmod(int(now - self.t0), 60)
        self.console.print(f"{self.label} {step}/{self.total} {text} ({m}:{s:02d} elapsed)", highlight=False)


@contextmanager
def count_bar(enabled: bool, label: str, total: int, every_s: float = 60.0) -> Iterator[Callable[[], None]]:
    """Yield `advance()` for a transient progress bar over `total` items, with the time left (a no-op when
    disabled). When stderr is not a terminal (a log file), a plain line every `every_s` seconds says the
    same, with the estimated time left."""
    if not enabled:
        yield lambda: None
        return
    from rich.progress import Progress

    console = Console(stderr=True)
    ticker = LogTicker(console, label, total, every_s)
    done = [0]
    t0 = time.monotonic()

    with Progress(*bar_columns(eta=True), console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)

        def advance() -> None:
            bar.advance(task)
            done[0] += 1
            left = (time.monotonic() - t0) / done[0] * (total - done[0])
            ticker.tick(done[0], f"(about {int(left) // 60}:{int(left) % 60:02d} left)")

        yield advance
