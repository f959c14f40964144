"""`specpress prompts --questions`: a question file's turns as chat prompts in the target's own template.

    made = write_chat_prompts(target_dir, Path("question.jsonl"), Path("p.jsonl"), ChatPromptRequest(n=80))

First turns need only the tokenizer and the template. `turns="all"` writes every turn; a later turn's prompt
holds the conversation so far, whose assistant turns are the target's own greedy answers (up to
`answer_tokens` tokens each), decoded here, as MT-bench's second turns are answered after the model's first.
Each line: {"input_ids": [...], "question_id": ..., "category": ..., "turn": k}, the format `bench` reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specpress.artifacts import claim_output, write_file
from specpress.errors import DataError, UsageError
from specpress.models.target import load_target
from specpress.models.tokenizer import load_tokenizer
from specpress.runtime.backends.torch.runner import TorchTarget
from specpress.runtime.plain import decode_plain
from specpress.ticker import count_bar
from specpress.runtime.chat import (Question, chat_prompt_ids, conversation, load_chat_template, read_questions,
                                    template_specials)


@dataclass(frozen=True)
class ChatPromptRequest:
    n: int | None = None            # the first n questions (None: all)
    turns: str = "first"            # "first" | "all"
    system: str | None = None       # a system message put first (None: the template's own default, if any)
    answer_tokens: int = 128        # turns="all": tokens of each assistant answer between turns
    force: bool = False

    def __post_init__(self) -> None:
        if self.turns not in ("first", "all"):
            raise UsageError(f"--turns must be first or all, got {self.turns!r}")
        if self.n is not None and self.n < 1:
            raise UsageError(f"--n must be at least 1, got {self.n}")
        if self.answer_tokens < 1:
            raise UsageError(f"--answer-tokens must be at least 1, got {self.answer_tokens}")


def write_chat_prompts(target_dir: Path, questions_file: Path, out: Path, req: ChatPromptRequest) -> list[dict]:
    """Write the chat prompts of `questions_file` to `out` (claimed first); returns the lines written."""
    questions = read_questions(questions_file)[: req.n]
    template = load_chat_template(target_dir)
    special = template_specials(target_dir)
    with claim_output(out, force=req.force, kind="file", inputs={"--target": target_dir,
                                                               "--questions": questions_file}) as claim:
        tok = load_tokenizer(target_dir)
        # every first turn is rendered before any model loads: a template that fails, fails in a second
        lines = [_line(q, 1, chat_prompt_ids(template, tok, conversation(q, 1, (), req.system), special,
                                             f"{questions_file}:{q.line}: the chat template")) for q in questions]
        if req.turns == "all" and any(len(q.turns) > 1 for q in questions):
            lines = _all_turns(target_dir, questions, questions_file, template, special, tok, req, lines)
        write_file(claim.out, "".join(json.dumps(line) + "\n" for line in lines))
    return lines


def _line(q: Question, turn: int, ids: list[int]) -> dict:
    return {"input_ids": ids, "question_id": q.id, "category": q.category, "turn": turn}


def _all_turns(target_dir: Path, questions: list[Question], qfile: Path, template: str, special: dict,
               tok: object, req: ChatPromptRequest, firsts: list[dict]) -> list[dict]:
    target = TorchTarget(load_target(target_dir))
    eos = set(target.config.eos_ids)
    lines: list[dict] = []
    with count_bar(True, "answering turns", sum(len(q.turns) - 1 for q in questions)) as advance:
        for q, first in zip(questions, firsts):
            lines.append(first)
            answers: list[str] = []
            ids = first["input_ids"]
            for k in range(2, len(q.turns) + 1):
                gen = decode_plain(target, ids, req.answer_tokens)
                answers.append(tok.decode([t for t in gen.tokens if t not in eos], skip_special_tokens=True))  # type: ignore[attr-defined]
                ids = chat_prompt_ids(template, tok, conversation(q, k, answers, req.system), special,
                                      f"{qfile}:{q.line}: the chat template (turn {k})")
                lines.append(_line(q, k, ids))
                advance()
    if not lines:
        raise DataError(f"{qfile}: no prompts")
    return lines
