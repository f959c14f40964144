"""The `specpress` command line: a root Click group that loads each command lazily.

`specpress --help` imports no torch: commands live in `specpress.commands.*` and are imported
only when invoked (or when their own --help is asked for).
"""

from __future__ import annotations

import importlib
import sys

import click

from specpress import __version__

# name -> (module, attribute, one-line help). Only commands that exist are listed.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "zoo": ("specpress.commands.zoo", "zoo", "Build the built-in tiny target (trained here on the Python stdlib)."),
    "inspect": ("specpress.commands.inspect", "inspect_cmd",
                "Show family, parameters, bytes and provenance of a model or drafter."),
    "regenerate": ("specpress.commands.regenerate", "regenerate",
                   "Continue corpus prompts with the target: distillation data that says what it emits."),
    "distill": ("specpress.commands.distill", "distill", "Train a drafter against a target (or shrink a drafter)."),
    "prune": ("specpress.commands.prune", "prune",
              "Prune FFN channels, KV groups, layers or draft vocabulary: a smaller dense drafter."),
    "run": ("specpress.commands.decode", "run", "Decode one prompt and print the text."),
    "bench": ("specpress.commands.decode", "bench", "Decode a prompt file and write the metrics JSON."),
    "quantize": ("specpress.commands.quantize", "quantize",
                 "Quantize a drafter's weights (int8/int4, nf4/fp4, fp8): bytes and acc@k before/after."),
    "export": ("specpress.commands.export", "export", "Export a drafter to ONNX graphs, validated against torch."),
    "plan": ("specpress.commands.plan", "plan",
             "Before running a command: its peak memory and work (target forwards, tokens), from configs alone."),
    "sweep": ("specpress.commands.sweep", "sweep",
              "Run a recipe: a grid of compressed drafters, each benched against the base (table, plots, Pareto)."),
}


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


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one line on stderr and a non-zero exit code."""
    from specpress.errors import SpecpressError

    try:
        cli.main(args=argv, prog_name="specpress", standalone_mode=False)
    except SpecpressError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
