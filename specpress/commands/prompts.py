"""`specpress prompts`: held-out evaluation prompts for `bench` (the options parsed, then
specpress.runtime.heldout.write_heldout_prompts)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option("--target", "target_dir", required=True, type=click.Path(path_type=Path),
              help="Target model directory: its tokenizer.json encodes the prompts.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Prompts file to write (JSON lines).")
@click.option("--n", type=click.IntRange(min=1), default=100, show_default=True, help="Number of prompts.")
@click.option("--tokens", type=click.IntRange(min=1), default=64, show_default=True, help="Tokens per prompt.")
@click.option("--seed", type=int, default=0, show_default=True, help="Where the prompts are cut (deterministic).")
@click.option("--force", is_flag=True, help="Replace an existing --out file.")
def prompts(target_dir: Path, out: Path, n: int, tokens: int, seed: int, force: bool) -> None:
    """Write held-out prompts as JSON lines of {"input_ids": [...]}, the file `bench --prompts` reads.

    The prompts are cut from the Python source of third-party packages installed with specpress (click,
    rich, yaml, safetensors, tokenizers, onnx, numpy; test folders excluded), one per file where possible:
    code the built-in zoo target and the drafters distilled on it (the Python standard library) never saw,
    so acceptance measured on them is held out. The same --target, --n, --tokens and --seed give the same
    file on any machine with the same package versions; a sweep recipe's `prompts: {heldout: {n, tokens}}`
    draws the same ones. For your own traffic, write {"prompt": "text"} lines instead.

    \b
    Example:
      specpress prompts --target ~/.cache/specpress/zoo/small --n 100 --tokens 64 --out prompts.jsonl
    """
    from specpress.runtime.heldout import write_heldout_prompts

    made = write_heldout_prompts(target_dir, out, n, tokens, seed, force=force)
    click.echo(f"wrote {len(made)} prompts of {tokens} tokens to {out}")
