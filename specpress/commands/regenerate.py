"""`specpress regenerate`: the options parsed, then compress/regen_pipeline.py (regenerate_from_dirs)."""

from __future__ import annotations

from pathlib import Path

import click

from specpress.commands.options import target_dtype as target_dtype_option, TARGET_FORMS, TARGET_PATH


@click.command()
@click.option("--target", "target_dir", required=True, type=TARGET_PATH,
              help="Target model directory (HF format with tokenizer.json)." + TARGET_FORMS)
@click.option("--data", "data_path", default=None, type=click.Path(path_type=Path),
              help="Where prompts come from: a text file, .jsonl, a directory of text/code files, or zoo:train "
                   "(not with --self-instruct / --user-prompts).")
@click.option("--self-instruct", "self_instruct", type=click.IntRange(min=1), default=None, metavar="N",
              help="Chat data for an instruct target, Magpie-style: N conversations whose user turns the target "
                   "samples from its chat template's empty user turn, then answers (--new-tokens, --temperature).")
@click.option("--user-prompts", type=click.Path(path_type=Path), default=None,
              help="Chat data answering these user turns ({\"prompt\": ...} lines or a question file) instead of "
                   "sampled ones; with --self-instruct N, the first N.")
@click.option("--query-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="--self-instruct: most tokens of a sampled user turn (a longer one is dropped).")
@click.option("--system", default=None, metavar="TEXT",
              help="--self-instruct / --user-prompts: a system message (default: the template's own).")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="JSON-lines file to write ({\"text\": prompt + continuation} per line).")
@click.option("--sequences", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Prompts to continue.")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=48, show_default=True,
              help="Tokens per prompt window, drawn at seeded random offsets of the tokenized data.")
@click.option("--new-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Target tokens per continuation (fewer when the target emits EOS).")
@click.option("--batch", type=click.IntRange(min=1), default=64, show_default=True,
              help="Sequences decoded together (one KV cache).")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="0 = greedy, the policy the acceptance bars are measured under.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--resume", is_flag=True, help="Continue <out>.partial left by an interrupted run.")
@click.option("--force", is_flag=True, help="Replace an existing --out (kept until the new file is complete).")
@target_dtype_option("bf16", "What the target is served in; a --resume must use the dtype the run began with.")
def regenerate(target_dir: Path, data_path: Path | None, self_instruct: int | None, user_prompts: Path | None,
               query_tokens: int, system: str | None, out: Path, sequences: int, prompt_tokens: int, new_tokens: int,
               batch: int, temperature: float, top_k: int, top_p: float, seed: int, resume: bool,
               force: bool, target_dtype: str) -> None:
    """Continue prompts from --data with the target itself: distillation data that says what the
    target emits (DFlash and EAGLE-3 train on target-regenerated responses).

    Prompts are windows of the tokenized data; each is continued with batched decoding and written
    as one JSON line, so `distill --data OUT` reads it directly. A card <stem>.card.json beside OUT
    records the target fingerprint, the settings, tokens generated, rows that stopped at EOS, and how
    many lines re-encode to exactly the generated ids. Lines go to <out>.partial batch by batch; after
    Ctrl-C, --resume continues from the last whole batch and writes the same file an uninterrupted run
    would.

    Give a distillation enough of it: on the zoo target a 10-minute DFlash distill makes about three
    passes over 6,144 sequences and starts memorising them (tau 2.92 at block:8); with three times as
    many (a second file of 12,288 sequences drawn with --seed 1, concatenated) it reached 3.18-3.38
    (recorded in BENCHMARKS.md at 01a67ba, 2026-11-30).

    For an instruct (chat) target, --self-instruct N writes conversations instead: the target samples a user
    turn (temperature 1) from its chat template's prefix up to an empty user message, the turn is put in a
    conversation, and the target answers it; duplicate queries and queries cut by --query-tokens are dropped,
    and lines are {"text": conversation, "query": ...}. --user-prompts FILE answers given user turns instead. Never
    train on the questions you evaluate on (MT-bench).

    \b
    Example (about 5 minutes for the small zoo target on 2 CPU cores):
      specpress regenerate --target ~/.cache/specpress/zoo/small --data zoo:train \\
          --out data/regen-small.jsonl --sequences 6144
      specpress distill --target ~/.cache/specpress/zoo/small --family dflash \\
          --data data/regen-small.jsonl --out drafters/dflash --minutes 10
      specpress regenerate --target smollm2-135m --self-instruct 2048 --out data/chat.jsonl --batch 32
    """
    from specpress.errors import UsageError

    chat = self_instruct is not None or user_prompts is not None
    if chat and data_path is not None:
        raise UsageError("--data does not apply with --self-instruct / --user-prompts (the chat data's user turns "
                         "are sampled or read from --user-prompts)")
    if not chat and data_path is None:
        raise UsageError("give --data (prompts to continue), or --self-instruct N / --user-prompts FILE for chat data")
    if not chat and (system is not None or query_tokens != 64):
        raise UsageError("--system and --query-tokens apply only with --self-instruct / --user-prompts")
    if chat:
        from specpress.compress.regen_pipeline import report_lines, self_instruct_from_dirs
        from specpress.compress.self_instruct import ChatRegenConfig

        if sequences != 4096 or prompt_tokens != 48 or top_k != 0 or top_p != 1.0:
            raise UsageError("--sequences, --prompt-tokens, --top-k and --top-p do not apply to chat data; the "
                             "count is --self-instruct N")
        n = self_instruct if self_instruct is not None else 10**9
        cfg = ChatRegenConfig(conversations=n, query_tokens=query_tokens, answer_tokens=new_tokens, batch=batch,
                              temperature=temperature, seed=seed, system=system)
        rep = self_instruct_from_dirs(target_dir, out, cfg, user_prompts=user_prompts, resume=resume, force=force,
                                      target_dtype=target_dtype, progress=True)
        for line in report_lines(rep):
            click.echo(line)
        return
    from specpress.compress.regen_pipeline import (
        RegenConfig,
        regenerate_from_dirs,
        report_lines,
    )

    config = RegenConfig(sequences=sequences, prompt_tokens=prompt_tokens, new_tokens=new_tokens, batch=batch,
                         temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    report = regenerate_from_dirs(target_dir, data_path, out, config, resume=resume, force=force,
                                  target_dtype=target_dtype, progress=True)
    for line in report_lines(report):
        click.echo(line)
