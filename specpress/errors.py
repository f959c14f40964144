"""Typed errors. The CLI prints a SpecpressError as one line (no traceback) and exits non-zero.

Messages say what was expected, what was found, and how to fix it.
"""

from __future__ import annotations


class SpecpressError(Exception):
    """Base class for errors caused by user input (files, flags, configs), not by bugs."""

    exit_code = 1


class ConfigError(SpecpressError):
    """A config file or field is missing, unknown, or has the wrong type or value."""


class CheckpointError(SpecpressError):
    """A model directory or weight file is missing, corrupt, or does not match its config."""


class DataError(SpecpressError):
    """Input data (prompts, corpora) is empty, unreadable, or malformed."""


class UsageError(SpecpressError):
    """A request that cannot be carried out as asked (e.g. a prompt longer than the context)."""

    exit_code = 2


class Interrupted(SpecpressError):
    """The user stopped a run (Ctrl-C); the message says what was saved and how to continue."""

    exit_code = 130


class SweepFailed(SpecpressError):
    """A sweep finished but some of its points failed (and failures were not tolerated)."""


class WriteError(SpecpressError):
    """An output could not be written (a full disk, a quota); what was there before is left as it was."""
