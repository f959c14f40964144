"""`specpress plan`: the planned command line parsed with that command's own options, then
specpress.plan.report's plan_to (or recipe_plans_to) and the lines it prints."""

from __future__ import annotations

import json
from pathlib import Path

import click

PLANNED = ("distill", "quantize", "prune", "export onnx", "export target", "export hf", "bench", "run")


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]})
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              type=click.Path(path_type=Path, allow_dash=True),
              help="Also write the plan as one JSON object to FILE; bare --json (or -) prints only it on stdout.")
@click.option("--force", is_flag=True, help="Replace an existing --json file.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def plan(json_out: Path | None, force: bool, command: tuple[str, ...]) -> None:
    """Before running COMMAND: the peak memory it will take and the work it will do (target forwards and
    tokens), from its inputs' config.json and safetensors headers alone (meta device, seconds even at 8B).

    COMMAND is the command line you would run, without `specpress`: distill, quantize, prune, export onnx,
    export target, export hf, bench or run, with the same options; or a sweep recipe (a .yaml path or a
    bundled recipe's name), planned point by point. The peak is the largest of the
    command's phases (each a sum of named parts: the target in --target-dtype, the drafter, optimizer
    state, activations, GPTQ's Hessians, an export's weights as onnxruntime maps them, ...) plus this
    process's own resident memory after the command's imports; it is compared with the memory available
    now. At the Llama-3.2-1B shape the measured peaks of export hf, quantize and bench were 1.00x, 1.19x and 1.01x
    the planned ones (bench/real_scale.py).

    \b
    Examples:
      specpress plan distill --target ~/models/Llama-3.1-8B-Instruct --family eagle3 --data chat.jsonl \\
          --out drafters/eagle3 --steps 2000
      specpress plan export onnx --drafter drafters/eagle3 --target ~/models/Llama-3.1-8B-Instruct --out onnx/e3
      specpress plan recipes/llama31-8b-eagle3.yaml
    """
    from specpress.commands import COMMANDS
    from specpress.errors import UsageError
    from specpress.plan import report

    words = list(command)
    if json_out is not None and str(json_out) in {n.split()[0] for n in PLANNED}:  # `plan --json export hf ...`
        words, json_out = [str(json_out), *words], Path("-")
    json_file = None if json_out == Path("-") else json_out
    if len(words) == 1 and (words[0].endswith((".yaml", ".yml")) or words[0] in ("quickstart",)):
        plans = report.recipe_plans_to(words[0], json_file, force=force)
        if json_out == Path("-"):
            click.echo(json.dumps(report.recipe_json(words[0], plans), indent=2))
        else:
            for line in report.recipe_lines(words[0], plans):
                click.echo(line)
        return
    name = " ".join(words[:2]) if words[0] == "export" and len(words) > 1 else words[0]
    if name not in PLANNED:
        raise UsageError(f"plan knows no command {name!r}; give one of: {', '.join(PLANNED)} with its options")
    args = words[len(name.split()):]
    import importlib

    module, attr, _ = COMMANDS[name.split()[0]]
    cmd = getattr(importlib.import_module(module), attr)
    if name.startswith("export "):
        cmd = cmd.commands[name.split()[1]]
    try:
        ctx = cmd.make_context(name, args)
    except click.exceptions.Exit:
        return
    except click.ClickException as exc:
        raise UsageError(f"specpress {name}: {exc.format_message()}") from None
    p = report.plan_to(name, ctx.params, json_file, force=force)
    if json_out == Path("-"):
        click.echo(json.dumps(p.to_dict(), indent=2))
    else:
        for line in report.plan_lines(f"specpress {name}", p):
            click.echo(line)
