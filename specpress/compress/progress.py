"""Distill's training progress bar (rich, on stderr): step, loss and acc@k over the last batches. The plain
counting bar for long loops (prune's vocabulary counting, GPTQ's groups, an export's validation) is
specpress/ticker.py's `count_bar`."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:
    from specpress.ticker import LogTicker


class TrainProgress:
    """`with TrainProgress(enabled, total, label, k) as bar: bar.update(step, recent)`; silent when disabled.

    recent: [(loss, hits [k], counts [k])] of the last steps; the bar shows their means.
    """

    def __init__(self, enabled: bool, total: int, label: str, k: int) -> None:
        self.enabled, self.total, self.label, self.k = enabled, total, label, k
        self._bar = None
        self._task = None
        self._ticker: "LogTicker | None" = None

    def __enter__(self) -> "TrainProgress":
        if self.enabled:
            from rich.console import Console
            from rich.progress import Progress

            from specpress.ticker import LogTicker, bar_columns

            cols = bar_columns("loss {task.fields[loss]}", "acc@k {task.fields[acc]}", eta=True)
            console = Console(stderr=True)
            self._ticker = LogTicker(console, self.label, self.total)
            self._bar = Progress(*cols, console=console)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, loss="-", acc="-")
        return self

    def update(self, step: int, recent: Sequence[tuple[float, Tensor, Tensor]]) -> None:
        if self._bar is None or self._task is None:
            return
        fields = {"loss": "-", "acc": "-"}
        if recent:
            fields["loss"] = f"{sum(r[0] for r in recent) / len(recent):.3f}"
            hits = sum(r[1] for r in recent)
            counts = sum(r[2] for r in recent)
            acc = [float(h / max(c, 1)) for h, c in zip(hits, counts)]  # type: ignore[call-overload]
            fields["acc"] = " ".join(f"{a:.2f}" for a in acc)
        self._bar.update(self._task, completed=step, **fields)
        if self._ticker is not None:
            self._ticker.tick(step, f"loss {fields['loss']} acc@k {fields['acc']}")

    def set_total(self, total: int) -> None:
        self.total = total
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, total=total)
        if self._ticker is not None:
            self._ticker.total = total

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, exc, tb)
