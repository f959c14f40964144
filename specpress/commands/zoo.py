"""`specpress zoo build`: the built-in tiny target, trained here on this machine's Python stdlib."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def zoo() -> None:
    """Built-in targets trained on this machine (no downloads)."""


@zoo.command("build")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Output directory [default: ~/.cache/specpress/zoo/<size>].")
@click.option("--size", type=click.Choice(["small", "medium"]), default="small", show_default=True,
              help="small: ~8M params, <=20 min on 2 cores; medium: ~30M params for speed studies, <=60 min.")
@click.option("--minutes", type=click.FloatRange(min=0.1), default=None,
              help="Wall-clock cap on training (the step budget is fixed per size, so runs are deterministic).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-resume", is_flag=True, help="Ignore a checkpoint left by an interrupted build.")
def build(out: Path | None, size: str, minutes: float | None, seed: int, no_resume: bool) -> None:
    """Train a tokenizer and a small Llama on the Python standard library of this interpreter.

    Writes an HF-format directory (config.json, model.safetensors, tokenizer.json, README.md model
    card, zoo.json) that transformers' AutoModelForCausalLM loads as is. An interrupted build
    resumes from its last checkpoint.

    \b
    Example:
      specpress zoo build                 # ~/.cache/specpress/zoo/small
      specpress zoo build --size medium --out ./zoo-medium
    """
    from specpress.zoo import build_zoo, default_zoo_dir

    target = out or default_zoo_dir(size)
    report = build_zoo(target, size=size, minutes=minutes, seed=seed, progress=True, resume=not no_resume)
    click.echo(f"zoo target written to {report.out}")
    click.echo(f"  params {report.params:,}  steps {report.steps}  val loss {report.val_loss:.3f}  "
               f"perplexity {report.val_perplexity:.2f}")
