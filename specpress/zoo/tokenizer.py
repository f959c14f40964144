"""Byte-level BPE for the zoo target, trained with `tokenizers` and saved in the HF layout.

Loading goes through `specpress.models.tokenizer.load_tokenizer` (one home for reading tokenizers).

`<|endoftext|>` has id 0 and is both EOS and the document separator. The byte-level pre-tokenizer
and decoder make `decode(encode(text)) == text` for every string (no prefix space, no cleanup).
"""

from __future__ import annotations

import json
from typing import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from specpress.errors import UsageError

EOS_TOKEN = "<|endoftext|>"
EOS_ID = 0


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """Train a byte-level BPE with `vocab_size` entries (256 bytes + EOS + merges)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise UsageError(f"vocab_size must be at least {len(alphabet) + 1} (256 bytes + EOS), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.token_to_id(EOS_TOKEN) != EOS_ID:
        raise AssertionError(f"{EOS_TOKEN} got id {tok.token_to_id(EOS_TOKEN)}, expected {EOS_ID}")
    return tok


def tokenizer_files(tok: Tokenizer, *, model_max_length: int) -> dict[str, str]:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json (what AutoTokenizer reads)."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    special = {"bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN, "unk_token": EOS_TOKEN, "pad_token": EOS_TOKEN}
    return {
        "tokenizer.json": tok.to_str(pretty=True),
        "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(special, indent=2) + "\n",
    }


def encode_documents(tok: Tokenizer, texts: Sequence[str]) -> np.ndarray:
    """Token stream [N] (uint16 when the vocab fits): every document followed by EOS."""
    dtype = np.uint16 if tok.get_vocab_size() <= 2**16 else np.int32
    encodings = tok.encode_batch(list(texts))
    parts: list[np.ndarray] = []
    for enc in encodings:
        parts.append(np.asarray(enc.ids, dtype=dtype))
        parts.append(np.asarray([EOS_ID], dtype=dtype))
    if not parts:
        return np.zeros(0, dtype=dtype)
    return np.concatenate(parts)
