"""`specpress run` and `specpress bench`: thin layers over specpress.runtime."""

from __future__ import annotations

import json
from pathlib import Path

import click

TEMPERATURE = click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
                           help="0 = greedy; >0 samples from the target's (processed) distribution.")
TOP_K = click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0 = off.")
TOP_P = click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True)
SEED = click.option("--seed", type=int, default=0, show_default=True, help="Seed for sampling.")
DTYPE = click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True)
TARGET = click.option("--target", "target_dir", required=True, type=click.Path(path_type=Path),
                      help="Target model directory (HF format: config.json + model.safetensors).")


@click.command()
@TARGET
@click.option("--prompt", required=True, help="Prompt text (encoded with the target's tokenizer.json).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@TEMPERATURE
@TOP_K
@TOP_P
@SEED
@DTYPE
def run(target_dir: Path, prompt: str, max_new_tokens: int, temperature: float, top_k: int, top_p: float,
        seed: int, dtype: str) -> None:
    """Decode one prompt with the target and print the prompt and its continuation.

    \b
    Example:
      specpress run --target ~/.cache/specpress/zoo/small --prompt "def parse_args(" --max-new-tokens 48
    """
    import torch

    from specpress.models.target import load_target
    from specpress.models.tokenizer import load_tokenizer
    from specpress.runtime.plain import decode_plain
    from specpress.runtime.prompts import encode

    target = load_target(target_dir, dtype=dtype)
    tok = load_tokenizer(target_dir)
    ids = encode(prompt, tok)
    g = decode_plain(target, ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                     generator=torch.Generator().manual_seed(seed))
    click.echo(prompt + tok.decode(g.tokens))
    secs = g.decode_ms / 1e3
    click.echo(f"[{len(g.tokens)} tokens, {len(g.tokens) / secs:.1f} tok/s, plain decoding (tau 1.00)]", err=True)


@click.command()
@TARGET
@click.option("--prompts", "prompts_file", required=True, type=click.Path(path_type=Path),
              help='JSON lines: {"prompt": "text"} or {"input_ids": [..]} per line.')
@click.option("--max-new-tokens", type=click.IntRange(min=1), required=True)
@TEMPERATURE
@TOP_K
@TOP_P
@SEED
@DTYPE
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the full metrics object here.")
def bench(target_dir: Path, prompts_file: Path, max_new_tokens: int, temperature: float, top_k: int,
          top_p: float, seed: int, dtype: str, json_out: Path | None) -> None:
    """Decode every prompt of a file and report tokens/s (and, with a drafter, acceptance).

    Without a drafter this measures plain target decoding, the baseline of every speculative run;
    at temperature 0 its outputs equal transformers' greedy generate.

    \b
    Example:
      specpress bench --target ~/.cache/specpress/zoo/small --prompts prompts.jsonl \\
          --max-new-tokens 64 --temperature 0 --json plain.json
    """
    from rich.console import Console
    from rich.progress import Progress

    from specpress.artifacts import write_json
    from specpress.runtime.bench import bench_plain, load_bench_inputs

    target, prompts = load_bench_inputs(target_dir, prompts_file, dtype)
    config = {"target": str(target_dir), "prompts_file": str(prompts_file), "dtype": dtype, "drafter": None,
              "backend": "torch", "policy": None}
    console = Console(stderr=True)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("decoding", total=len(prompts))
        result = bench_plain(target, prompts, max_new_tokens, temperature=temperature, top_k=top_k,
                             top_p=top_p, seed=seed, config=config,
                             on_prompt=lambda i: progress.advance(task))
    n_tok = sum(len(o) for o in result["outputs"])
    console.print(f"{len(prompts)} prompts, {n_tok} tokens, {result['tokens_per_s']:.1f} tok/s "
                  f"(median step {result['verify_ms']:.2f} ms), plain decoding")
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        write_json(json_out, result)
        console.print(f"wrote {json_out}")
    else:
        click.echo(json.dumps({k: v for k, v in result.items() if k != "outputs"}, indent=2))
