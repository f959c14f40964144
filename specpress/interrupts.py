"""Ctrl-C and SIGTERM as one interrupt, and training steps it cannot cut in half.

`cli.main` maps SIGTERM (what `kill`, Slurm and container runtimes send) onto the KeyboardInterrupt Ctrl-C raises,
so a terminated run saves its checkpoint as an interrupted one does. A training loop wraps each optimizer step in
`held_interrupts()`: an interrupt that arrives mid-step is held until the step is booked, so the checkpoint written
on the way out is the state after a whole step, never the weights of a half-applied one. A second interrupt inside
the same step raises at once (a step that hangs can still be stopped), and the caller then saves nothing newer than
its last checkpoint.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["held_interrupts", "raise_interrupt", "term_as_interrupt"]


def raise_interrupt(signum: int, frame: object) -> None:
    """The SIGTERM handler `term_as_interrupt` installs: the same exception Ctrl-C raises."""
    raise KeyboardInterrupt


def term_as_interrupt() -> Any:
    """Handle SIGTERM as Ctrl-C, only where it still has its default action and only in the main thread (handlers
    can be set nowhere else). Returns the handler to restore, or None when nothing was changed."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None
    return signal.signal(signal.SIGTERM, raise_interrupt)


def _raises(handler: Any) -> bool:
    return handler is signal.default_int_handler or handler is raise_interrupt


@contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold a Ctrl-C or SIGTERM that arrives inside the block until the block ends, then raise it
    (KeyboardInterrupt); a second one inside the block raises at once. Only signals that would raise
    KeyboardInterrupt anyway are held, and only in the main thread; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if held:
            raise KeyboardInterrupt
        held.append(signum)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    changed = {sig: old for sig, old in previous.items() if _raises(old)}
    for sig in changed:
        signal.signal(sig, hold)
    try:
        yield
    finally:
        for sig, old in changed.items():
            signal.signal(sig, old)
    if held:
        raise KeyboardInterrupt
