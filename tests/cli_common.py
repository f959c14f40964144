"""Running the `specpress` entry point in-process, as a user's shell does: its exit code and what it printed."""

from __future__ import annotations

from dataclasses import dataclass

from click.testing import CliRunner


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str


def run_main(*args: object) -> Run:
    """`specpress ARGS...` through `specpress.cli.main` (error printing and exit codes included)."""
    from specpress.cli import main

    with CliRunner().isolation() as (out, err, _):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return Run(code, out.getvalue().decode(), err.getvalue().decode())
