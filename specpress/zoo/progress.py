"""Progress output of a zoo build (rich, on stderr): one-line notes and a training bar with loss and tok/s."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import Progress

from specpress.ticker import LogTicker, bar_columns

OnStep = Callable[[int, float, float], None]


class Reporter:
    """Prints to stderr when enabled; silent otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.console = Console(stderr=True)

    def note(self, text: str) -> None:
        if self.enabled:
            self.console.print(f"[dim]zoo:[/dim] {text}", highlight=False)

    @contextmanager
    def training(self, total: int, label: str) -> Iterator[OnStep | None]:
        """Yield an `on_step(step, loss, tokens_per_s)` callback driving a progress bar (None when silent)."""
        if not self.enabled:
            yield None
            return
        columns = bar_columns("loss {task.fields[loss]:.3f}", "{task.fields[tps]:,.0f} tok/s", eta=True,
                              bar_width=20)
        with Progress(*columns, console=self.console) as bar:
            task = bar.add_task(label, total=total, loss=float("nan"), tps=0.0)
            ema: list[float] = []  # [loss ema, tok/s ema]
            ticker = LogTicker(self.console, label, total)

            def on_step(step: int, loss: float, tps: float) -> None:
                if not ema:
                    ema.extend([loss, tps])
                else:
                    ema[0] = 0.9 * ema[0] + 0.1 * loss
                    ema[1] = 0.9 * ema[1] + 0.1 * tps
                bar.update(task, completed=step, loss=ema[0], tps=ema[1])
                ticker.tick(step, f"loss {ema[0]:.3f} {ema[1]:,.0f} tok/s")

            yield on_step
