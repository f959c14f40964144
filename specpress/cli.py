"""The `specpress` command line: a root Click group that loads each command lazily.

`specpress --help` imports no torch: commands live in `specpress.commands.*` and are imported
only when invoked (or when their own --help is asked for).
"""

from __future__ import annotations

import importlib
import signal
import sys
import warnings
from typing import NoReturn

import click

from specpress import __version__
from specpress.commands import COMMANDS
from specpress.interrupts import term_as_interrupt


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, _, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specpress")
def cli() -> None:
    """specpress: how far can a speculative-decoding drafter be compressed before acceptance falls?

    Artifacts (models, drafters) are directories of config.json + model.safetensors, written atomically.
    Built-in models and caches live under ~/.cache/specpress (override with SPECPRESS_CACHE).
    Start with `specpress sweep quickstart --out runs/quickstart`; each command's --help has examples.
    """


def command_path(args: list[str]) -> str:
    """`specpress`, `specpress bench`, `specpress export onnx`: the command `args` names (for the help hint)."""
    path, group = ["specpress"], cli
    for arg in args:
        if arg.startswith("-") or not isinstance(group, click.Group):
            break
        try:
            cmd = group.get_command(click.Context(group), arg)
        except ImportError:  # a command module whose library is missing: the hint stays at the group
            cmd = None
        if cmd is None:
            break
        path.append(arg)
        group = cmd
    return " ".join(path)


def fail(message: str, exit_code: int, command: str) -> NoReturn:
    """The one way an error is printed: `error: ...` on stderr, then for a usage error (exit 2) where the
    options are explained."""
    click.echo(f"error: {message}", err=True)
    if exit_code == 2:
        click.echo(f"Try '{command} --help' for help.", err=True)
    sys.exit(exit_code)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: errors become `error: ...` on stderr and an exit code: 2 when the command line is
    wrong (specpress's UsageError and Click's own parse errors alike), 1 for any other error, 130 when
    interrupted by Ctrl-C or SIGTERM (README, "Exit codes")."""
    from specpress.errors import Deprecated, SpecpressError
    from specpress.machine import map_large_blocks

    map_large_blocks()
    args = sys.argv[1:] if argv is None else list(argv)
    warnings.simplefilter("always", Deprecated)
    show = warnings.showwarning
    warnings.showwarning = lambda message, category, *rest: (  # type: ignore[assignment]
        click.echo(f"warning: {message}", err=True) if issubclass(category, Deprecated)
        else show(message, category, *rest))
    previous = term_as_interrupt()
    try:
        cli.main(args=args, prog_name="specpress", standalone_mode=False)
    except SpecpressError as exc:
        fail(str(exc), exc.exit_code, command_path(args))
    except (click.exceptions.Abort, KeyboardInterrupt):  # Click turns a Ctrl-C in a command into Abort
        # a command that writes an output says what it kept (artifacts.claim_output, or its own Interrupted);
        # one that reaches here claimed nothing, so nothing was written
        fail("interrupted: nothing was written; run the same command again to start over", 130, command_path(args))
    except click.UsageError as exc:  # Click's parse errors: an unknown option, a bad value, a missing one
        fail(exc.format_message(), 2, exc.ctx.command_path if exc.ctx else command_path(args))
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code, command_path(args))
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    finally:
        warnings.showwarning = show
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    main()
