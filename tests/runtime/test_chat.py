"""Chat prompts in the target's own template (rendered in Jinja2's sandbox, bounded), question files read with
every bad line named, and self-generated (Magpie) chat data: deterministic, deduplicated, resumable."""

from __future__ import annotations

import json

import pytest
import torch

from specpress.errors import DataError
from specpress.runtime.chat import read_questions, render_chat
from cli_common import run_main
from gguf_common import write_tiny_gguf

pytest.importorskip("gguf")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    """A tiny converted GGUF target: tokenizer.json and a ChatML chat template."""
    import os

    d = tmp_path_factory.mktemp("chat")
    old = os.environ.get("SPECPRESS_CACHE")
    os.environ["SPECPRESS_CACHE"] = str(d / "cache")
    try:
        from specpress.zoo.gguf import convert_gguf

        write_tiny_gguf(d / "t.gguf")
        return convert_gguf(d / "t.gguf", say=lambda m: None)
    finally:
        os.environ.pop("SPECPRESS_CACHE") if old is None else os.environ.__setitem__("SPECPRESS_CACHE", old)


def _questions(tmp_path, lines):
    f = tmp_path / "q.jsonl"
    f.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return f


def test_first_turns_in_the_targets_template(tmp_path, chat_target):
    from tokenizers import Tokenizer

    q = _questions(tmp_path, [{"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
                              {"question_id": 82, "category": "math", "turns": ["What is 2+2?"]}])
    out = tmp_path / "p.jsonl"
    r = run_main("prompts", "--target", chat_target, "--questions", q, "--out", out, "--system", "Be brief.")
    assert r.exit_code == 0, r.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["question_id"], x["category"], x["turn"]) for x in lines] == [("81", "writing", 1), ("82", "math", 1)]
    tok = Tokenizer.from_file(str(chat_target / "tokenizer.json"))
    text = tok.decode(lines[0]["input_ids"], skip_special_tokens=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWrite a poem.<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert lines[0]["input_ids"][0] == tok.token_to_id("<|im_start|>")  # specials encoded as the special ids
    from specpress.runtime.prompts import load_prompts

    assert [p.ids for p in load_prompts(out, None, 400)] == [tuple(x["input_ids"]) for x in lines]  # bench reads it


def test_all_turns_follow_the_targets_own_answers(tmp_path, chat_target):
    from tokenizers import Tokenizer

    from specpress.models.target import load_target
    from specpress.runtime.backends.torch.runner import TorchTarget
    from specpress.runtime.plain import decode_plain

    q = _questions(tmp_path, [{"question_id": 1, "turns": ["Hello there", "And then?"]}])
    out = tmp_path / "p.jsonl"
    r = run_main("prompts", "--target", chat_target, "--questions", q, "--out", out, "--turns", "all",
                 "--answer-tokens", "6")
    assert r.exit_code == 0, r.stderr
    first, second = [json.loads(x) for x in out.read_text().splitlines()]
    tok = Tokenizer.from_file(str(chat_target / "tokenizer.json"))
    answer = decode_plain(TorchTarget(load_target(chat_target)), first["input_ids"], 6).tokens
    want = [t for t in answer if t != 2]
    assert second["turn"] == 2 and second["input_ids"][:len(first["input_ids"])] == first["input_ids"]
    text = tok.decode(second["input_ids"], skip_special_tokens=False)
    assert text.endswith("<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(want) in text


@pytest.mark.parametrize("lines, words", [
    (['{"turns": ["ok"]}', "{not json"], r"q\.jsonl:2: not JSON"),
    (['{"question_id": 1}'], r"q\.jsonl:1: no \"turns\" field"),
    (['{"turns": ["fine", "  "]}'], r"q\.jsonl:1: turn 2 is empty"),
    (['{"turns": []}'], r"q\.jsonl:1: \"turns\" must be a non-empty list"),
    (['[1, 2]'], r"q\.jsonl:1: a list, not an object"),
    ([json.dumps({"turns": ["x" * 300_000]})], r"q\.jsonl:1: turn 1 is 300,000 characters"),
    ([], r"no questions"),
])
def test_bad_question_files_name_the_line(tmp_path, lines, words):
    with pytest.raises(DataError, match=words):
        read_questions(_questions(tmp_path, lines))


def test_binary_question_file_is_refused(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_bytes(b'{"turns": ["a"]}\n\x00\x01\x02')
    with pytest.raises(DataError, match=r"q\.jsonl:2: binary data"):
        read_questions(f)


HOSTILE = {
    "{{ raise_exception('no system role') }}": "refused the conversation: no system role",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}": "sandbox forbids",
    "{% for m in messages %}{{ m.content.__globals__ }}{% endfor %}": "rendered an empty prompt",  # unsafe: undefined
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x": "ran for more than",
    "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}": "more than 4,194,304 characters",
    "{% if %}": "does not parse",
    "{{ messages[5].content }}": "failed on a conversation",
    "   ": "rendered an empty prompt",
}


@pytest.mark.parametrize("template", list(HOSTILE))
def test_hostile_templates_fail_cleanly(template):
    with pytest.raises(DataError, match=HOSTILE[template]):
        render_chat(template, [{"role": "user", "content": "hi"}])


def test_template_failure_through_the_cli_names_the_line(tmp_path, chat_target):
    import shutil

    d = tmp_path / "t"
    shutil.copytree(chat_target, d)
    (d / "chat_template.jinja").write_text("{% if messages[0].content == 'boom' %}{{ raise_exception('no') }}"
                                           "{% endif %}{{ messages[0].content }}")
    q = _questions(tmp_path, [{"turns": ["fine"]}, {"turns": ["boom"]}])
    r = run_main("prompts", "--target", d, "--questions", q, "--out", tmp_path / "p.jsonl")
    assert r.exit_code == 1 and r.stderr.splitlines()[0].startswith(f"error: {q}:2: the chat template refused")
    assert not (tmp_path / "p.jsonl").exists()
    r = run_main("prompts", "--target", d, "--turns", "all", "--out", tmp_path / "p.jsonl")
    assert r.exit_code == 2 and "apply only with --questions" in r.stderr


def test_continue_padded_equals_each_row_alone(chat_target):
    from specpress.compress.regen import continue_batch, continue_padded
    from specpress.models.target import load_target
    from specpress.runtime.sampling import SamplingParams

    t = load_target(chat_target)
    rows = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    alone = [continue_batch(t, torch.tensor([r]), 10, SamplingParams(), None, [2])[0] for r in rows]
    assert continue_padded(t, rows, 10, SamplingParams(), None, [2]) == alone


def test_self_instruct_is_deterministic_deduplicated_and_resumes(tmp_path, chat_target):
    from specpress.compress.self_instruct import ChatRegenConfig, query_prefix, self_instruct
    from specpress.models.target import load_target
    from specpress.models.tokenizer import load_tokenizer
    from specpress.runtime.chat import load_chat_template

    target, tok = load_target(chat_target), load_tokenizer(chat_target)
    template = load_chat_template(chat_target)
    assert query_prefix(template, {}, None) == "<|im_start|>user\n"
    cfg = ChatRegenConfig(conversations=6, query_tokens=12, answer_tokens=5, batch=4)
    card = self_instruct(target, tok, template, {}, cfg, tmp_path / "a.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert 0 < len(lines) == card["sequences"] <= 6
    assert len({" ".join(x["query"].lower().split()) for x in lines}) == len(lines)
    for x in lines:
        assert x["text"].startswith(f"<|im_start|>user\n{x['query']}<|im_end|>\n<|im_start|>assistant\n")
        assert x["text"].endswith("<|im_end|>")
    calls = [0]

    def stop(done, total):
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        self_instruct(target, tok, template, {}, cfg, tmp_path / "b.jsonl", on_batch=stop)
    self_instruct(target, tok, template, {}, cfg, tmp_path / "b.jsonl", resume=True)
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()


def test_regenerate_cli_user_prompts_and_refusals(tmp_path, chat_target):
    prompts = tmp_path / "u.jsonl"
    prompts.write_text('{"prompt": "hello"}\n{"turns": ["one", "two"]}\n')
    out = tmp_path / "chat.jsonl"
    r = run_main("regenerate", "--target", chat_target, "--user-prompts", prompts, "--out", out,
                 "--new-tokens", "4", "--target-dtype", "fp32")
    assert r.exit_code == 0, r.stderr
    assert [json.loads(x)["query"] for x in out.read_text().splitlines()] == ["hello", "one", "two"]
    assert "3 conversations" in r.stdout
    r = run_main("regenerate", "--target", chat_target, "--self-instruct", "2", "--data", "zoo:train",
                 "--out", tmp_path / "x.jsonl")
    assert r.exit_code == 2 and "--data does not apply" in r.stderr
    r = run_main("regenerate", "--target", chat_target, "--out", tmp_path / "x.jsonl")
    assert r.exit_code == 2 and "give --data" in r.stderr
