"""`specpress prompts`: held-out evaluation prompts for `bench` (the options parsed, then
specpress.runtime.heldout.write_heldout_prompts)."""

from __future__ import annotations

from pathlib import Path

import click

from specpress.commands.options import TARGET_FORMS, TARGET_PATH


@click.command()
@click.option("--target", "target_dir", required=True, type=TARGET_PATH,
              help="Target model directory: its tokenizer.json encodes the prompts." + TARGET_FORMS)
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Prompts file to write (JSON lines).")
@click.option("--n", type=click.IntRange(min=1), default=None,
              help="Number of prompts [default: 100; with --questions, every question].")
@click.option("--questions", "questions_file", type=click.Path(path_type=Path), default=None,
              help="A question file in FastChat / Spec-Bench format (JSON lines with \"turns\": MT-bench's "
                   "question.jsonl): its turns become chat prompts in the target's own chat template.")
@click.option("--turns", type=click.Choice(["first", "all"]), default="first", show_default=True,
              help="With --questions: first turns only, or every turn (a later turn follows the target's own "
                   "greedy answers to the earlier ones, decoded here).")
@click.option("--system", default=None, metavar="TEXT",
              help="With --questions: a system message put first (default: none, so the template's own default "
                   "system prompt applies where it has one).")
@click.option("--answer-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="With --turns all: tokens of each answer between turns.")
@click.option("--tokens", type=click.IntRange(min=1), default=64, show_default=True, help="Tokens per prompt.")
@click.option("--seed", type=int, default=0, show_default=True, help="Where the prompts are cut (deterministic).")
@click.option("--force", is_flag=True, help="Replace an existing --out file.")
def prompts(target_dir: Path, out: Path, n: int | None, questions_file: Path | None, turns: str,
            system: str | None, answer_tokens: int, tokens: int, seed: int, force: bool) -> None:
    """Write held-out prompts as JSON lines of {"input_ids": [...]}, the file `bench --prompts` reads.

    The prompts are cut from the Python source of third-party packages installed with specpress (click,
    rich, yaml, safetensors, tokenizers, onnx, numpy; test folders excluded), one per file where possible:
    code the built-in zoo target and the drafters distilled on it (the Python standard library) never saw,
    so acceptance measured on them is held out. The same --target, --n, --tokens and --seed give the same
    file on any machine with the same package versions; a sweep recipe's `prompts: {heldout: {n, tokens}}`
    draws the same ones. For your own traffic, write {"prompt": "text"} lines instead.

    With --questions (a chat target): each question's turn is put in a conversation and rendered by the target's
    own chat template (chat_template.jinja or tokenizer_config.json, rendered in Jinja2's sandbox), with the
    generation prompt, then encoded; each line also says its question_id, category and turn. A recipe's
    `prompts: {questions: PATH, n: N}` does the same. Evaluate on these, never train on them.

    \b
    Example:
      specpress prompts --target ~/.cache/specpress/zoo/small --n 100 --tokens 64 --out prompts.jsonl
      specpress prompts --target smollm2-135m --questions mt_bench/question.jsonl --out mt1.jsonl
    """
    if questions_file is not None:
        from specpress.runtime.chat_prompts import ChatPromptRequest, write_chat_prompts

        req = ChatPromptRequest(n=n, turns=turns, system=system, answer_tokens=answer_tokens, force=force)
        lines = write_chat_prompts(target_dir, questions_file, out, req)
        mean = sum(len(x["input_ids"]) for x in lines) / len(lines)
        click.echo(f"wrote {len(lines)} chat prompts ({turns} turns, {mean:.0f} tokens on average) to {out}")
        return
    from specpress.errors import UsageError

    given = [f for f, v in (("--turns", turns != "first"), ("--system", system is not None),
                            ("--answer-tokens", answer_tokens != 128)) if v]
    if given:
        raise UsageError(f"{', '.join(given)} apply only with --questions")
    n = 100 if n is None else n
    from specpress.runtime.heldout import write_heldout_prompts

    made = write_heldout_prompts(target_dir, out, n, tokens, seed, force=force)
    click.echo(f"wrote {len(made)} prompts of {tokens} tokens to {out}")
