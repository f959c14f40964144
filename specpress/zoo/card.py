"""The zoo model card (README.md) and its machine-readable twin (zoo.json)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specpress.zoo.build import ZooPreset, ZooReport

ZOO_FORMAT = "specpress-zoo"
ZOO_VERSION = 1
_OPTIMIZER_NAMES = {"adamw": "AdamW", "muon": "Muon (block matrices) + AdamW (embedding, norms)"}


def zoo_json(report: "ZooReport", preset: "ZooPreset", extra: dict[str, Any]) -> str:
    """zoo.json: format tag, the report's numbers, the preset, and the environment (`extra`)."""
    numbers = {k: (str(v) if k == "out" else v) for k, v in asdict(report).items()}
    numbers.pop("out")
    obj = {"format": ZOO_FORMAT, "version": ZOO_VERSION, **numbers, "preset": asdict(preset), **extra}
    return json.dumps(obj, indent=2) + "\n"


def model_card(report: "ZooReport", preset: "ZooPreset", extra: dict[str, Any]) -> str:
    """README.md: what the model is, how it was made, and the numbers (same as zoo.json)."""
    r = report
    rows = [
        ("corpus", f"Python {extra['python_version']} stdlib `*.py`, test folders left out "
                   f"(sha1 {r.corpus_sha1[:12]})"),
        ("train split", f"{r.train_files} files, {r.train_bytes:,} bytes, {r.train_tokens:,} tokens"),
        ("validation split", f"{r.val_files} files, {r.val_bytes:,} bytes, {r.val_tokens:,} tokens "
                             "(sha1 of the relative path, ~5 %)"),
        ("tokenizer", f"byte-level BPE, vocab {preset.vocab_size}, `<|endoftext|>` = id 0 (EOS and "
                      "document separator)"),
        ("architecture", f"LlamaForCausalLM: hidden {preset.hidden_size}, {preset.num_layers} layers, "
                         f"{preset.num_heads} heads, FFN {preset.intermediate_size}, tied embeddings, "
                         f"context {preset.max_position_embeddings} (trained on {preset.seq_len})"),
        ("parameters", f"{r.params:,}"),
        ("training", f"{r.steps:,} of {r.steps_planned:,} steps (stopped by {r.stopped_by}), "
                     f"batch {preset.batch_size} x {preset.seq_len}, {_OPTIMIZER_NAMES[preset.optimizer]} lr "
                     f"{preset.lr:g} cosine, "
                     f"{'bf16 autocast' if r.bf16 else 'fp32'}{', torch.compile' if r.compiled else ''}"),
        ("tokens seen", f"{r.tokens_seen:,}"),
        ("train time", f"{r.train_seconds:.0f} s ({extra['torch_threads']} threads, torch {extra['torch']})"),
        ("validation loss", f"{r.val_loss:.4f} nats/token"),
        ("validation perplexity", f"{r.val_perplexity:.2f} ({r.val_bits_per_byte:.3f} bits/byte)"),
        ("seed", str(r.seed)),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"""# specpress zoo target: `{r.size}`

A tiny Llama trained from scratch on this machine's Python standard library by `specpress zoo build`.
It is the built-in target for speculative-decoding experiments: small enough to train on two CPU cores,
real enough that acceptance rates mean something. Not a general-purpose model.

| item | value |
|---|---|
{table}

Load it with `transformers.AutoModelForCausalLM.from_pretrained(dir)` and
`AutoTokenizer.from_pretrained(dir)`, or `specpress.models.target.load_target(dir)`. Prompts that start
a file may begin with `<|endoftext|>` (the document separator seen in training). Positions beyond
{preset.seq_len} were never trained. The same numbers are in `zoo.json`.

Rebuild: `specpress zoo build --size {r.size} --seed {r.seed}` (the same seed, steps and thread count
give the same weights on the same machine).
"""
