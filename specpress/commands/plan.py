"""`specpress plan`: a thin layer over specpress.plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

PLANNED = ("distill", "quantize", "prune", "export onnx", "export target", "export hf", "bench", "run")


def _fmt(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.0f} MiB"


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
    from specpress.cli import COMMANDS
    from specpress.errors import UsageError
    from specpress.plan import plan_command

    words = list(command)
    if json_out is not None and str(json_out) in {n.split()[0] for n in PLANNED}:  # `plan --json export hf ...`
        words, json_out = [str(json_out), *words], Path("-")
    if len(words) == 1 and (words[0].endswith((".yaml", ".yml")) or words[0] in ("quickstart",)):
        return _plan_recipe(words[0], json_out, force)
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
    with _json_claim(json_out, force):
        p = plan_command(name, ctx.params)
        if json_out != Path("-"):
            _show(f"specpress {name}", p)
        _write_json(json_out, p.to_dict())


def _json_claim(json_out: Path | None, force: bool) -> Any:
    """--json FILE claimed (artifacts.claim_output) before planning; nothing to claim for stdout."""
    from contextlib import nullcontext

    from specpress.artifacts import claim_output

    if json_out is None or json_out == Path("-"):
        return nullcontext()
    return claim_output(json_out, force=force, kind="file", flag="--json")


def _write_json(json_out: Path | None, obj: dict) -> None:
    """The plan's JSON to --json FILE, or on stdout for a bare --json."""
    import json

    from specpress.artifacts import write_json

    if json_out == Path("-"):
        click.echo(json.dumps(obj, indent=2))
    elif json_out is not None:
        write_json(json_out, obj)


def _plan_recipe(recipe: str, json_out: Path | None, force: bool) -> None:
    from specpress.plan import plan_recipe

    with _json_claim(json_out, force):
        plans = plan_recipe(recipe)
        worst = max(plans, key=lambda p: p.peak_bytes)
        if json_out != Path("-"):
            for p in plans:
                _show(p.command, p)
            click.echo(f"sweep {recipe}: {len(plans)} plans; the largest peak is {_fmt(worst.peak_bytes)} "
                       f"({worst.command}); in-process and local workers run one point at a time, a Ray cluster one "
                       f"per worker")
        _write_json(json_out, {"recipe": recipe, "peak_bytes": worst.peak_bytes,
                               "plans": [p.to_dict() for p in plans]})


def _show(title: str, p) -> None:  # noqa: ANN001 - a specpress.plan.Plan (not imported at module load)
    from specpress.machine import available_bytes

    click.echo(f"{title}: peak about {_fmt(p.peak_bytes)} (in the {p.peak_phase} phase)")
    for phase, parts in p.phases.items():
        click.echo(f"  {phase:<24} {_fmt(sum(parts.values())):>10}   "
                   + ", ".join(f"{k} {_fmt(v)}" for k, v in parts.items() if v))
    click.echo(f"  {'process (imports)':<24} {_fmt(p.base):>10}")
    click.echo(f"  must hold {_fmt(p.holds_bytes)}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in p.holds.items()))
    work = ", ".join(f"{k.replace('_', ' ')} {v:,}" if isinstance(v, int) else f"{k.replace('_', ' ')} {v}"
                     for k, v in p.work.items() if v is not None)
    if work:
        click.echo(f"  work: {work}")
    for note in p.notes:
        click.echo(f"  note: {note}")
    free = available_bytes()
    if free is not None:
        verdict = "fits" if p.peak_bytes < free else "does NOT fit"
        click.echo(f"  {verdict} in the {_fmt(free)} available now")
