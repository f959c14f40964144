"""Tiny GGUF files written here with llama.cpp's own writer (gguf-py), from a random transformers model, laid out
as llama.cpp's convert_hf_to_gguf.py lays a Llama out (tensor names, Q/K rows permuted for its RoPE kernel, a
byte-level BPE tokenizer in the `gpt2` form, a chat template)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hf_common import make_hf_model

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TEXT = ["def main(): return 1", "hello world, how are you today?", "The quick brown fox jumps over the lazy dog.",
         "import os\nprint(os.getcwd())", "user: write a poem about the sea", "assistant: the sea is wide and deep"]


def tiny_bpe(vocab_size: int = 320):
    """A byte-level BPE trained on a few lines (ids 0-2: the special tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_TEXT * 20, trainer)
    return tok


def _permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """llama.cpp's Q/K row order (convert_hf_to_gguf.py LlamaModel.permute): halves of each head interleaved."""
    if n_head_kv != n_head:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    i, rest = parts[2], ".".join(parts[3:])
    names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight"}
    return f"blk.{i}.{names[rest]}"


def write_tiny_gguf(path: Path, *, qtype: str = "F32", arch: str = "llama", tie: bool = True, seed: int = 0,
                    chat_template: str | None = CHATML, raw_override: dict | None = None):
    """Write a 2-layer Llama as GGUF at `path`; returns (the transformers model it came from, the tokenizer).

    qtype: the block type of every 2-D weight (norms stay F32). arch: the `general.architecture` written (the
    tensors are a Llama's whatever it says: for refusal tests). raw_override: {gguf tensor name: (bytes array,
    GGMLQuantizationType)} written instead (for hostile files)."""
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    tok = tiny_bpe()
    vocab = tok.get_vocab_size()
    hf = make_hf_model("llama", seed=seed, vocab_size=vocab, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=256, tie_word_embeddings=tie, bos_token_id=0, eos_token_id=2)
    cfg = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(vocab)
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    qt = getattr(gguf.GGMLQuantizationType, qtype)
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    for name, t in hf.state_dict().items():
        if tie and name == "lm_head.weight":
            continue
        a = t.detach().float().numpy()
        if name.endswith("q_proj.weight"):
            a = _permute(a, heads, heads)
        elif name.endswith("k_proj.weight"):
            a = _permute(a, heads, kv)
        g = _gguf_name(name)
        if raw_override and g in raw_override:
            data, raw = raw_override[g]
            w.add_tensor(g, data, raw_dtype=raw)
        elif a.ndim == 2 and qtype != "F32":
            w.add_tensor(g, quants.quantize(a, qt), raw_dtype=qt)
        else:
            w.add_tensor(g, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf, tok
