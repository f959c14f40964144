"""The CLI's path for `specpress regenerate`: target and data dirs -> the regenerated JSON lines -> the printed line.

    rep = regenerate_from_dirs("zoo/small", "zoo:train", "data/regen.jsonl", RegenConfig(sequences=6144))
    print("\\n".join(report_lines(rep)))

`regenerate_from_dirs` claims `out` (its `.partial` and the card beside it), checks a partial to resume, the
window and the data before loading anything, loads the target and its tokenizer, and continues the prompts
(compress/regen.py); a Ctrl-C becomes Interrupted, saying what `<out>.partial` holds and how to continue.
`report_lines` is what the command prints of the card.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpress.compress.regen import RegenConfig


@dataclass
class RegenReport:
    out: Path
    card: dict[str, Any]  # what <stem>.card.json records: settings, sequences, tokens, tokens/s, EOS, round trips


def regenerate_from_dirs(target_dir: str | Path, data_path: str | Path, out: str | Path, config: RegenConfig, *,
                         resume: bool = False, force: bool = False, target_dtype: str = "bf16",
                         progress: bool = False) -> RegenReport:
    """Claim `out`, check, load the target, regenerate `config.sequences` continuations into `out`.

    resume: continue `<out>.partial` (a note says when there is none); force: replace an existing `out` (kept
    until the new file is complete); progress: a bar (plain lines when stderr is a log file) on stderr.
    Raises Interrupted on Ctrl-C.
    """
    from specpress.artifacts import claim_output
    from specpress.compress.data import check_data, data_stream
    from specpress.compress.guards import check_seq_len, interrupted, regen_saved
    from specpress.compress.regen import card_path, regenerate, verify_partial
    from specpress.models.target import load_target
    from specpress.models.tokenizer import load_tokenizer

    out = Path(out)
    cfg = config
    with claim_output(out, force=force, inputs={"--target": target_dir, "--data": data_path}, kind="file",
                      partial=True, resume=resume, companions=(card_path(out),)) as claim:  # before loading
        assert claim.partial is not None
        if resume and claim.partial.exists():
            verify_partial(out)  # a partial cut short or changed is refused before the target is loaded
        check_seq_len(target_dir, cfg.prompt_tokens + cfg.new_tokens, cfg.batch, training=False,
                      what=f"--prompt-tokens {cfg.prompt_tokens} + --new-tokens {cfg.new_tokens}")
        check_data(data_path)  # a device, a FIFO or more text than memory: refused before loading
        target = load_target(target_dir, dtype=target_dtype)
        tok = load_tokenizer(target_dir)
        stream = data_stream(data_path, tok, target.config.eos_ids, target.config.vocab_size, target_dir)
        try:
            with _progress_bar(progress, cfg.sequences) as on_batch:
                # --resume without a partial: said in claim.notes, starts fresh
                card = regenerate(target, tok, stream, cfg, out, resume=resume and claim.partial.exists(),
                                  force=force, source=str(data_path), on_batch=on_batch)
        except KeyboardInterrupt:
            raise interrupted(claim.partial, regen_saved(claim.partial)) from None
    return RegenReport(out, card)


def self_instruct_from_dirs(target_dir: str | Path, out: str | Path, config: Any, *,
                            user_prompts: str | Path | None = None, resume: bool = False, force: bool = False,
                            target_dtype: str = "bf16", progress: bool = False) -> RegenReport:
    """Claim `out`, load the target, write `config.conversations` chat conversations (compress/self_instruct.py):
    queries sampled from the chat template's empty user turn, or read from `user_prompts`; answered by the target."""
    from specpress.artifacts import claim_output
    from specpress.compress.guards import check_seq_len, interrupted, regen_saved
    from specpress.compress.regen import card_path, verify_partial
    from specpress.compress.self_instruct import self_instruct
    from specpress.models.target import load_target
    from specpress.models.tokenizer import load_tokenizer
    from specpress.runtime.chat import load_chat_template, read_user_prompts, template_specials

    out = Path(out)
    cfg = config
    inputs = {"--target": target_dir, "--user-prompts": user_prompts}
    with claim_output(out, force=force, inputs=inputs, kind="file", partial=True, resume=resume,
                      companions=(card_path(out),)) as claim:
        assert claim.partial is not None
        if resume and claim.partial.exists():
            verify_partial(out)
        template = load_chat_template(target_dir)  # not a chat model: refused before it loads
        special = template_specials(target_dir)
        prompts = read_user_prompts(user_prompts) if user_prompts is not None else None
        check_seq_len(target_dir, cfg.query_tokens + 128 + cfg.answer_tokens, cfg.batch, training=False,
                      what=f"--query-tokens {cfg.query_tokens} + --new-tokens {cfg.answer_tokens}")
        target = load_target(target_dir, dtype=target_dtype)
        tok = load_tokenizer(target_dir)
        try:
            with _progress_bar(progress, cfg.conversations) as on_batch:
                card = self_instruct(target, tok, template, special, cfg, out, user_prompts=prompts,
                                     resume=resume and claim.partial.exists(),
                                     source=str(user_prompts) if user_prompts else "self-instruct",
                                     on_batch=on_batch)
        except KeyboardInterrupt:
            raise interrupted(claim.partial, regen_saved(claim.partial)) from None
    return RegenReport(out, card)


@contextmanager
def _progress_bar(on: bool, total: int) -> Iterator[Callable[[int, int], None] | None]:
    """A rich bar and a LogTicker on stderr over `total` sequences; yields regenerate's on_batch (None when off)."""
    if not on:
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    from specpress.ticker import LogTicker, bar_columns

    console = Console(stderr=True)
    ticker = LogTicker(console, "regenerate", total)
    with Progress(*bar_columns(eta=True), console=console) as bar:
        task = bar.add_task("regenerate", total=total)

        def on_batch(done: int, total: int) -> None:
            bar.update(task, completed=done)
            ticker.tick(done, "sequences")

        yield on_batch


def report_lines(report: RegenReport) -> list[str]:
    """The line `specpress regenerate` prints: sequences, tokens generated and their rate, EOS stops, round trips."""
    card = report.card
    return [(f"wrote {report.out}: {card['sequences']} sequences, {card['generated_tokens']} generated tokens "
            f"({card['tokens_per_s']:.0f} tokens/s), {card['stopped_at_eos']} stopped at EOS, "
            f"{card['round_trip_exact']}/{card['sequences']} re-encode exactly")] if card.get("mode") != "chat" else [
        f"wrote {report.out}: {card['sequences']} conversations ({card['requested']} asked), "
        f"{card['query_tokens'] + card['generated_tokens']} generated tokens ({card['tokens_per_s']:.0f} tokens/s), "
        f"{card['stopped_at_eos']} answers ended by the target, {card['duplicates']} duplicate and "
        f"{card['truncated_queries']} cut queries dropped"]


__all__ = ["RegenConfig", "RegenReport", "regenerate_from_dirs", "report_lines", "self_instruct_from_dirs"]
