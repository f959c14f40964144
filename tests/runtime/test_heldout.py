"""Evaluation prompts cut from documents: deterministic, distinct, several per document when few exist."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from specpress.errors import DataError
from specpress.runtime.heldout import document_prompts


@pytest.fixture(scope="module")
def tok():
    t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(500)}, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return t


def doc(seed: int, n: int) -> str:
    return " ".join(f"w{i}" for i in np.random.default_rng(seed).integers(0, 500, n))


def test_one_prompt_per_document_when_there_are_enough(tok):
    texts = [doc(s, 200) for s in range(30)] + [doc(99, 40)]  # the last is too short to cut 16 + 32 from
    a = document_prompts(texts, tok, 20, 16, seed=3)
    assert a == document_prompts(texts, tok, 20, 16, seed=3) and a != document_prompts(texts, tok, 20, 16, seed=4)
    assert len(a) == 20 and all(len(p.ids) == 16 for p in a)
    starts = {next(i for i, t in enumerate(texts) if " ".join(f"w{x}" for x in p.ids) in t) for p in a}
    assert len(starts) == 20  # each from a different document


def test_few_documents_give_several_distinct_prompts_each(tok):
    texts = [doc(s, 400) for s in range(3)]
    a = document_prompts(texts, tok, 12, 16, seed=0)
    assert len(a) == 12 and len({p.ids for p in a}) == 12


def test_too_little_text_is_a_clear_error(tok):
    with pytest.raises(DataError, match="distinct prompts of 16 tokens could be cut from 1 documents, 50 asked"):
        document_prompts([doc(1, 60)], tok, 50, 16)
    with pytest.raises(DataError, match="only 0"):
        document_prompts([doc(1, 48)], tok, 1, 16)  # exactly prompt + 32 tokens: too short, no crash
