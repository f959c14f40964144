"""Progress bars of the compress stages (rich, on stderr): distill's training bar (step, loss and acc@k over
the last batches) and a plain counting bar for long loops such as prune's vocabulary counting."""

from __future__ import annotations

from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

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


@contextmanager
def count_bar(enabled: bool, label: str, total: int, every_s: float = 60.0) -> Iterator[Callable[[], None]]:
    """Yield `advance()` for a transient progress bar over `total` items, with the time left (a no-op when
    disabled). When stderr is not a terminal (a log file), a plain line every `every_s` seconds says the
    same, with the estimated time left."""
    if not enabled:
        yield lambda: None
        return
    import time

    from rich.console import Console
    from rich.progress import Progress

    from specpress.ticker import LogTicker, bar_columns

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
