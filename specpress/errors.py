"""Typed errors. The CLI prints a SpecpressError as one line (no traceback) and exits non-zero.

Messages say what was expected, what was found, and how to fix it. Exit codes (README, "Exit codes"):
2 when the command line itself is wrong (`UsageError`, and Click's own parse errors), 1 for every other
error (inputs, the machine, a failed run), 130 when interrupted.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager


class SpecpressError(Exception):
    """Base class for errors caused by user input (files, flags, configs), not by bugs."""

    exit_code = 1


class ConfigError(SpecpressError):
    """A config file or field is missing, unknown, or has the wrong type or value."""


class CheckpointError(SpecpressError):
    """A model directory or weight file is missing, corrupt, or does not match its config."""


class DataError(SpecpressError):
    """Input data (prompts, corpora) is empty, unreadable, or malformed."""


class RequestError(SpecpressError):
    """A request that cannot be carried out on these inputs or on this machine: a prompt longer than the
    target's context, a policy the drafter cannot run, an output in the way, a library that is not installed."""


class UsageError(RequestError):
    """The command line itself is wrong, whatever the inputs and the machine: an option's value, two options
    that contradict each other, an option that needs another. Exit code 2, as Click's own parse errors."""

    exit_code = 2


@contextmanager
def command_line() -> Iterator[None]:
    """The one rule for exit codes of option values: a ConfigError raised while checking what the command line
    says (a scheme x method that does not exist, --group-size 7 for int4, --act-calibration fixed:nan,
    --target-quant int5), before any input is read, is a UsageError (exit 2). The same checks on a recipe's
    fields stay ConfigErrors (exit 1): there the file is wrong, not the command line."""
    try:
        yield
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


class Interrupted(SpecpressError):
    """The user stopped a run (Ctrl-C); the message says what was saved and how to continue."""

    exit_code = 130


class SweepFailed(SpecpressError):
    """A sweep finished but some of its points failed (and failures were not tolerated)."""


class WriteError(SpecpressError):
    """An output could not be written (a full disk, a quota); what was there before is left as it was."""


class Deprecated(FutureWarning):
    """An old spelling (an option, a value, a recipe key) that still works for one release; the CLI prints
    it as one `warning:` line on stderr, Python shows it as a FutureWarning."""


def deprecated(old: str, new: str) -> None:
    """Warn that `old` is deprecated; `new` says what to write instead."""
    warnings.warn(f"{old} is deprecated and will be removed in the next release; {new}", Deprecated, stacklevel=3)
