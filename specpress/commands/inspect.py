"""`specpress inspect`: what a model or drafter artifact holds (the options parsed, then
specpress.models.inspect_report's inspect_to and inspect_lines)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("inspect")
@click.argument("path", type=click.Path(path_type=Path), required=False)
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              type=click.Path(path_type=Path, allow_dash=True),
              help="Write every field as one JSON object to FILE; bare --json (or -) prints it on stdout.")
@click.option("--force", is_flag=True, help="Replace an existing --json file.")
def inspect_cmd(path: Path | None, json_out: Path | None, force: bool) -> None:
    """Show family, architecture, parameters, bytes as stored, dtype and provenance of PATH.

    PATH is an artifact directory or a bare config.json. Without weights the model is built on the
    meta device, so even an 8B-scale drafter config is counted in seconds. `params` counts what the
    drafter stores itself (embeddings and heads shared with the target are not counted).

    \b
    Examples:
      specpress inspect ~/.cache/specpress/zoo/small
      specpress inspect ./eagle3-drafter --json
      specpress inspect ./eagle3-drafter --json eagle3.json
      specpress inspect ./EAGLE3-LLaMA3.1-Instruct-8B/config.json
    """
    from specpress.errors import UsageError
    from specpress.models.inspect_report import inspect_json, inspect_lines, inspect_to

    if path is None and json_out not in (None, Path("-")):  # `inspect --json PATH`: the flag, then the artifact
        path, json_out = json_out, Path("-")
    if path is None:
        raise UsageError("give the artifact to inspect: specpress inspect PATH")
    info = inspect_to(path, None if json_out == Path("-") else json_out, force=force)
    if json_out == Path("-"):
        click.echo(inspect_json(info))
    elif json_out is not None:
        click.echo(f"wrote {json_out}")
    else:
        for line in inspect_lines(info):
            click.echo(line)
        for warning in info.get("warnings") or []:
            click.echo(f"warning: {warning}", err=True)
