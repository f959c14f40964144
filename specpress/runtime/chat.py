"""Chat prompts: a target's own chat template applied to conversations, and the question files benchmarks use.

The template is the tokenizer's Jinja text (`chat_template.jinja`, or `chat_template` in tokenizer_config.json),
which comes with the model and so is untrusted input: it is rendered by Jinja2's immutable sandbox (as
transformers renders it: no attribute access to Python internals, no mutation of its arguments), bounded in time
and in output size, and any failure is one DataError naming the template.

    template = load_chat_template(target_dir)
    text = render_chat(template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    questions = read_questions(Path("question.jsonl"))          # FastChat / Spec-Bench format

A question file is JSON lines of {"question_id": …, "category": …, "turns": ["…", …]} (MT-bench's question.jsonl,
Spec-Bench's question.jsonl); every bad line is named by file and line number.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpress.errors import DataError
from specpress.readback import parse_json, read_json_object, regular_file

MAX_TEMPLATE_CHARS = 1 << 16       # the largest chat templates in use are ~10 KB
MAX_RENDER_CHARS = 1 << 22         # 4 MiB of prompt text: far past any context this tool decodes
MAX_RENDER_SECONDS = 5.0
MAX_TURN_CHARS = 1 << 18           # 256 KiB in one turn of a question file
MAX_QUESTIONS_BYTES = 1 << 28


@dataclass(frozen=True)
class Question:
    """One line of a question file: its id, category and user turns."""

    id: str
    category: str
    turns: tuple[str, ...]
    line: int


def load_chat_template(model_dir: str | Path) -> str:
    """The chat template of a model directory: chat_template.jinja, else tokenizer_config.json's chat_template
    (a string, or a list of {name, template} of which "default" is taken)."""
    d = Path(model_dir).expanduser()
    f = d / "chat_template.jinja"
    if f.is_file():
        if f.stat().st_size > MAX_TEMPLATE_CHARS * 4:
            raise DataError(f"{f}: {f.stat().st_size:,} bytes is too large for a chat template")
        text = f.read_text(encoding="utf-8", errors="replace")
    else:
        cfg_file = d / "tokenizer_config.json"
        raw = read_json_object(cfg_file, error=DataError).get("chat_template") if cfg_file.is_file() else None
        if isinstance(raw, list):
            named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
            raw = named.get("default")
        if not isinstance(raw, str) or not raw.strip():
            raise DataError(f"{d} has no chat template (no chat_template.jinja, no chat_template in "
                            f"tokenizer_config.json): it is not a chat model, or its template was not copied; use "
                            f"plain prompts ({{\"prompt\": \"text\"}} lines) instead")
        text = raw
    if len(text) > MAX_TEMPLATE_CHARS:
        raise DataError(f"{d}: its chat template is {len(text):,} characters; at most {MAX_TEMPLATE_CHARS:,} are "
                        f"accepted")
    return text


class _Refused(Exception):
    """A template's own raise_exception(message)."""


def _raise(message: str) -> None:
    raise _Refused(str(message))


def _compile(template: str) -> Any:
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise DataError(f"the chat template does not parse ({type(exc).__name__}: {exc})") from None


class _Timeout(Exception):
    pass


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """SIGALRM after `seconds` in the main thread (a template loop that writes nothing is still stopped)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def render_chat(template: str, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True,
                special: Mapping[str, str] | None = None, where: str = "the chat template") -> str:
    """`messages` rendered by `template` in the sandbox; at most MAX_RENDER_SECONDS and MAX_RENDER_CHARS."""
    from jinja2 import TemplateError
    from jinja2.exceptions import SecurityError

    compiled = _compile(template)
    context = {"messages": [dict(m) for m in messages], "add_generation_prompt": add_generation_prompt,
               **(special or {})}
    parts: list[str] = []
    size = 0
    start = time.monotonic()
    try:
        with _alarm(MAX_RENDER_SECONDS):
            for chunk in compiled.generate(**context):
                parts.append(chunk)
                size += len(chunk)
                if size > MAX_RENDER_CHARS:
                    raise DataError(f"{where} wrote more than {MAX_RENDER_CHARS:,} characters for one "
                                    f"conversation; it is not a chat template this tool will run")
                if time.monotonic() - start > MAX_RENDER_SECONDS:
                    raise _Timeout()
    except _Refused as exc:
        raise DataError(f"{where} refused the conversation: {exc}") from None
    except _Timeout:
        raise DataError(f"{where} ran for more than {MAX_RENDER_SECONDS:g} s on one conversation; stopped") from None
    except SecurityError as exc:
        raise DataError(f"{where} tried an operation the sandbox forbids ({exc})") from None
    except (TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError,
            RecursionError, OverflowError) as exc:
        raise DataError(f"{where} failed on a conversation ({type(exc).__name__}: {exc})") from None
    text = "".join(parts)
    if not text.strip():
        raise DataError(f"{where} rendered an empty prompt")
    return text


def template_specials(model_dir: str | Path) -> dict[str, str]:
    """bos_token / eos_token as tokenizer_config.json names them (templates may use them)."""
    f = Path(model_dir).expanduser() / "tokenizer_config.json"
    if not f.is_file():
        return {}
    cfg = read_json_object(f, error=DataError)
    out = {}
    for k in ("bos_token", "eos_token"):
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[k] = v
    return out


def read_questions(path: str | Path) -> list[Question]:
    """The questions of a FastChat / Spec-Bench question file; every bad line is one DataError naming it."""
    path = Path(path).expanduser()
    size = regular_file(path, DataError, "give a .jsonl question file (FastChat's question.jsonl format)")
    if size > MAX_QUESTIONS_BYTES:
        raise DataError(f"{path}: {size:,} bytes is more than a question file may hold ({MAX_QUESTIONS_BYTES:,})")
    raw = path.read_bytes()
    if b"\x00" in raw:
        line = raw[:raw.index(b"\x00")].count(b"\n") + 1
        raise DataError(f"{path}:{line}: binary data (a NUL byte); a question file is UTF-8 JSON lines")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 text; a question file is UTF-8 JSON lines") from None
    out: list[Question] = []
    fix = 'each line must be a JSON object with "turns": a list of non-empty strings (FastChat question.jsonl)'
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise DataError(f"{path}:{n}: not JSON ({getattr(exc, 'msg', exc)}); {fix}") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{n}: a {type(obj).__name__}, not an object; {fix}")
        turns = obj.get("turns")
        if turns is None:
            raise DataError(f"{path}:{n}: no \"turns\" field; {fix}")
        if not isinstance(turns, list) or not turns:
            raise DataError(f"{path}:{n}: \"turns\" must be a non-empty list; {fix}")
        for i, t in enumerate(turns):
            if not isinstance(t, str) or not t.strip():
                raise DataError(f"{path}:{n}: turn {i + 1} is {'empty' if isinstance(t, str) else type(t).__name__}; "
                                f"{fix}")
            if len(t) > MAX_TURN_CHARS:
                raise DataError(f"{path}:{n}: turn {i + 1} is {len(t):,} characters, more than the "
                                f"{MAX_TURN_CHARS:,} a question may hold")
        qid = obj.get("question_id", n)
        cat = obj.get("category", "")
        out.append(Question(id=str(qid), category=str(cat) if isinstance(cat, (str, int)) else "", turns=tuple(turns),
                            line=n))
    if not out:
        raise DataError(f"{path}: no questions (the file is empty)")
    return out


def conversation(question: Question, upto: int, answers: Sequence[str], system: str | None) -> list[dict[str, str]]:
    """The messages of `question` up to user turn `upto` (1-based), the assistant's `answers` between turns."""
    msgs = [{"role": "system", "content": system}] if system else []
    for i in range(upto):
        msgs.append({"role": "user", "content": question.turns[i]})
        if i < upto - 1:
            msgs.append({"role": "assistant", "content": answers[i]})
    return msgs


def chat_prompt_ids(template: str, tokenizer: Any, messages: Sequence[Mapping[str, str]],
                    special: Mapping[str, str], where: str) -> list[int]:
    text = render_chat(template, messages, add_generation_prompt=True, special=special, where=where)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    if not ids:
        raise DataError(f"{where}: the rendered prompt encodes to no tokens")
    return list(ids)


def read_user_prompts(path: str | Path) -> list[str]:
    """User turns to answer: JSON lines of {"prompt": "…"}, or a question file's lines (every turn of "turns")."""
    path = Path(path).expanduser()
    size = regular_file(path, DataError, 'give a .jsonl file of {"prompt": "…"} lines or a question file')
    if size > MAX_QUESTIONS_BYTES:
        raise DataError(f"{path}: {size:,} bytes is more than a prompts file may hold ({MAX_QUESTIONS_BYTES:,})")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    out: list[str] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        obj = parse_json(line, f"{path}:{n}", 'each line must be {"prompt": "…"} or {"turns": [...]}', error=DataError)
        turns = [obj["prompt"]] if isinstance(obj, dict) and "prompt" in obj else \
            obj.get("turns") if isinstance(obj, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise DataError(f'{path}:{n}: each line must be {{"prompt": "non-empty text"}} or {{"turns": [...]}}')
        if any(len(t) > MAX_TURN_CHARS for t in turns):
            raise DataError(f"{path}:{n}: a prompt longer than {MAX_TURN_CHARS:,} characters")
        out += [t.strip() for t in turns]
    if not out:
        raise DataError(f"{path}: no prompts (the file is empty)")
    return out
