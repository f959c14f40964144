"""`build_zoo`: corpus -> tokenizer -> trained Llama -> HF-format directory with a model card.

Scratch state (tokenizer, training checkpoint) lives in `<out>.partial/` so an interrupted build
resumes; the final directory is written by `save_target` (temp dir, then rename), never half-written.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from specpress.artifacts import claim_output, write_file, write_json
from specpress.errors import CheckpointError, Interrupted, RequestError, UsageError
from specpress.readback import read_json
from specpress.zoo.card import ZOO_FORMAT, ZOO_VERSION, model_card, zoo_json
from specpress.zoo.real import REAL_TARGETS, build_real
from specpress.zoo.corpus import CorpusFile, corpus_fingerprint, corpus_files, split_stats
from specpress.zoo.tokenizer import EOS_ID, encode_documents, tokenizer_files, train_tokenizer
from specpress.zoo.train import STATE_FILE, TokenBatches, TrainConfig, evaluate, init_weights, train

ZOO_FILES = ("config.json", "model.safetensors", "tokenizer.json", "zoo.json")
META_FILE = "meta.json"
_PARTIAL_FILES = {META_FILE, "tokenizer.json", STATE_FILE}


@dataclass(frozen=True)
class ZooPreset:
    """Network shape and training budget of one zoo size (`steps` is the default, deterministic budget)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    steps: int
    vocab_size: int = 4096
    max_position_embeddings: int = 1024
    seq_len: int = 256
    batch_size: int = 16
    lr: float = 2e-3
    warmup_steps: int = 50
    weight_decay: float = 0.1
    optimizer: str = "adamw"  # or "muon" (see specpress.zoo.train.make_optimizer)
    rope_theta: float = 10000.0
    bf16: bool = True
    compile: bool = False
    max_files: int | None = None  # train on the first N corpus files of each split only (None: all of them)

    def __post_init__(self) -> None:
        if self.num_layers < 8:
            raise UsageError(f"zoo preset {self.name!r}: num_layers must be >= 8 so EAGLE-3's taps "
                             f"(layers 2, L//2, L-3) are distinct, got {self.num_layers}")
        if self.hidden_size % self.num_heads:
            raise UsageError(f"zoo preset {self.name!r}: hidden_size {self.hidden_size} is not divisible by "
                             f"num_heads {self.num_heads}")
        if self.seq_len > self.max_position_embeddings:
            raise UsageError(f"zoo preset {self.name!r}: seq_len {self.seq_len} exceeds "
                             f"max_position_embeddings {self.max_position_embeddings}")

    def target_config(self) -> Any:
        """The `TargetConfig` of this preset (EOS = BOS = id 0, tied embeddings)."""
        from specpress.models.target import TargetConfig

        return TargetConfig(
            architecture="LlamaForCausalLM", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_heads,
            head_dim=self.hidden_size // self.num_heads, max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta, rms_norm_eps=1e-5, tie_word_embeddings=True,
            bos_token_id=EOS_ID, eos_token_id=EOS_ID)

    def train_config(self, *, seed: int, steps: int | None, max_seconds: float | None) -> TrainConfig:
        total = self.steps if steps is None else steps
        return TrainConfig(steps=total, batch_size=self.batch_size, seq_len=self.seq_len, seed=seed, lr=self.lr,
                           warmup_steps=min(self.warmup_steps, max(1, total // 10)),
                           weight_decay=self.weight_decay, optimizer=self.optimizer, bf16=self.bf16,
                           compile=self.compile, max_seconds=max_seconds)


PRESETS: dict[str, ZooPreset] = {
    # 7.87M params. 1200 steps x 4096 tokens = 4.9M tokens (~1.5 epochs), Muon + AdamW (400-step probes:
    # perplexity 60.5 at lr 2e-3 and 53.3 at 4e-3 or 8e-3, vs 86.4 for AdamW at 2e-3). A step costs ~0.8 s on
    # 2 cores with bf16 + torch.compile -> ~16 min of training, ~18 min in all (compile, tokenizer, eval).
    "small": ZooPreset(name="small", hidden_size=256, intermediate_size=768, num_layers=8, num_heads=4,
                       steps=1200, lr=4e-3, optimizer="muon", compile=True),
    # 2.1M params, for the README's smoke path: 150 steps x 2048 tokens on 200 of the corpus files, fp32
    # eager (bf16 autocast without compile is several times slower on these CPUs; compiling costs ~1 min).
    "tiny": ZooPreset(name="tiny", hidden_size=128, intermediate_size=384, num_layers=8, num_heads=4,
                      steps=150, vocab_size=2048, seq_len=128, warmup_steps=15, lr=4e-3, optimizer="muon",
                      bf16=False, max_files=200),
    # 27.4M params, for speed studies. 1000 steps (4.1M tokens) at ~1.8k tok/s -> ~40 min of training.
    "medium": ZooPreset(name="medium", hidden_size=512, intermediate_size=1376, num_layers=8, num_heads=8,
                        steps=1000, lr=1.5e-3, compile=True),
}


@dataclass(frozen=True)
class ZooReport:
    """What a build produced; the same numbers go into zoo.json and the README.md card."""

    out: Path
    size: str
    seed: int
    params: int
    train_files: int
    train_bytes: int
    train_tokens: int
    val_files: int
    val_bytes: int
    val_tokens: int
    corpus_sha1: str
    steps_planned: int
    steps: int
    tokens_seen: int
    train_seconds: float
    stopped_by: str  # "steps" or "minutes"
    resumed_from: int
    bf16: bool
    compiled: bool
    val_loss: float
    val_perplexity: float
    val_bits_per_byte: float

    def lines(self) -> list[str]:
        """What `specpress zoo build` prints of it: where, and params, steps, validation loss and perplexity."""
        numbers = (f"  params {self.params:,}  steps {self.steps}  val loss {self.val_loss:.3f}  "
                   f"perplexity {self.val_perplexity:.2f}")
        return [f"zoo target written to {self.out}", numbers]


def default_zoo_dir(size: str = "small") -> Path:
    """`$SPECPRESS_CACHE/zoo/<size>`, default `~/.cache/specpress/zoo/<size>`."""
    cache = os.environ.get("SPECPRESS_CACHE")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache" / "specpress"
    return base / "zoo" / size


def is_zoo_dir(path: Path) -> bool:
    """True when `path` holds a finished zoo build (zoo.json with the zoo format tag, weights, tokenizer)."""
    path = Path(path)
    if not all((path / f).is_file() for f in ZOO_FILES):
        return False
    meta = _read_json(path / "zoo.json")
    return isinstance(meta, dict) and meta.get("format") == ZOO_FORMAT


def preset_changes(path: Path, size: str) -> list[str]:
    """How the preset recorded in a finished zoo build differs from today's `size` preset, as
    "field: built -> now" strings (empty when it matches). Fields a build predates count at their default. bf16 is
    not compared: the training dtype is chosen per machine (build_zoo's dtype), not by the preset."""
    if size not in PRESETS:  # a real target (zoo/real.py): converted, not trained; its sha256 is checked instead
        return []
    built = _read_json(Path(path) / "zoo.json")
    old = built.get("preset") if isinstance(built, dict) else None
    if not isinstance(old, dict):
        return []
    defaults = {f.name: f.default for f in fields(ZooPreset)}
    return [f"{k}: {old.get(k, defaults[k])} -> {v}" for k, v in asdict(PRESETS[size]).items()
            if k != "bf16" and old.get(k, defaults[k]) != v]


def ensure_zoo(size: str = "small", *, progress: bool = True) -> Path:
    """The default zoo dir of `size`, built first (default budget, seed 0; a real target: converted) if missing."""
    if size in REAL_TARGETS:
        from specpress.zoo.resolve import resolve_target_path

        return resolve_target_path(size, say=lambda m: print(m, file=sys.stderr) if progress else None)
    out = default_zoo_dir(size)
    if not is_zoo_dir(out):
        build_zoo(out, size=size, progress=progress)
    return out


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise RequestError(f"{out} exists and is not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not is_zoo_dir(out):
        raise RequestError(f"{out} exists and is not a zoo directory (no zoo.json); choose another --out "
                           "or remove it")
    if is_zoo_dir(out) and not force:
        raise RequestError(f"{out} already holds a zoo target; pass --force to build it again and replace it")


def _clear_partial(partial: Path) -> None:
    if not partial.exists():
        return
    foreign = [p.name for p in partial.iterdir() if p.name not in _PARTIAL_FILES and not p.name.startswith(".")]
    if foreign:
        raise RequestError(f"{partial} holds files a zoo build did not write ({', '.join(sorted(foreign)[:3])}); "
                           "remove it by hand")
    shutil.rmtree(partial)


def build_zoo(out: Path | None = None, *, size: str = "small", minutes: float | None = None, seed: int = 0,
              progress: bool = True, resume: bool = True, force: bool = False, preset: ZooPreset | None = None,
              steps: int | None = None, max_files: int | None = None,
              stdlib: Path | None = None, dtype: str = "auto") -> ZooReport:
    """Build the zoo target into `out` (None: default_zoo_dir(size)) and return its report (its `lines()`:
    what `specpress zoo build` prints).

    size: a name in PRESETS (when `preset` is given, only the default `out`'s). minutes: optional wall-clock cap
    on training on top of the preset's fixed step budget (`steps` overrides that budget). max_files /
    stdlib: a smaller or different corpus (tests). resume: continue from `<out>.partial/` when it
    was left by a build with the same settings. force: replace a zoo target already in `out` (else refused).
    dtype: the training forwards' dtype; auto trains a preset that asks for bf16 in bf16 only where this CPU
    computes it natively (specpress.device.native_bf16), else in fp32. The dtype used is part of the build's
    settings (a checkpoint of the other dtype is not resumed) and is written on the model card.
    """
    if preset is None:
        if size not in PRESETS:
            raise UsageError(f"unknown zoo size {size!r}; available: {', '.join([*PRESETS, *REAL_TARGETS])}")
        preset = PRESETS[size]
    preset = replace(preset, bf16=_bf16(preset, dtype))
    if minutes is not None and minutes <= 0:
        raise UsageError(f"--minutes must be positive, got {minutes}")
    out = Path(default_zoo_dir(size) if out is None else out).expanduser().absolute()
    _check_out(out, force)
    # locked; its partial is _prepare_partial's
    with claim_output(out, force=True, partial=True, resume=True, writes="specpress-zoo"):
        try:
            return _build(out, preset, minutes, seed, progress, resume, steps, max_files, stdlib)
        except KeyboardInterrupt:
            planned = preset.train_config(seed=seed, steps=steps, max_seconds=None).steps
            raise _interrupted(out.with_name(out.name + ".partial"), planned) from None


def _interrupted(partial: Path, planned: int) -> Interrupted:
    """The Ctrl-C message of a build: the training step its checkpoint holds (saved on the way out), what else
    `partial` keeps, and how to go on (a build resumes by default)."""
    from specpress.zoo.train import load_state

    again = "to continue, run the same command again (a build resumes from its checkpoint; --no-resume starts over)"
    if (partial / STATE_FILE).is_file():
        try:
            step = f"training step {load_state(partial / STATE_FILE)['step']} of {planned}"
        except CheckpointError:
            step = "an unreadable training checkpoint"
        return Interrupted(f"interrupted: {step} saved in {partial}; {again}")
    if (partial / "tokenizer.json").is_file():
        return Interrupted(f"interrupted before the first training step was saved: the corpus tokenizer is kept in "
                           f"{partial}; {again}")
    return Interrupted("interrupted before anything was saved; run the command again to start")


def _bf16(preset: ZooPreset, dtype: str) -> bool:
    from specpress.device import native_bf16, train_dtype

    if dtype == "auto":
        return preset.bf16 and native_bf16("cpu")
    return train_dtype(dtype) == "bf16"


def _dtype_words(bf16: bool) -> str:
    from specpress.device import native_bf16

    if bf16:
        return "bf16 autocast"
    return "fp32" if native_bf16("cpu") else "fp32 (this CPU has no native bf16: neither AVX512-BF16 nor AMX)"


def _build(out: Path, preset: ZooPreset, minutes: float | None, seed: int, progress: bool, resume: bool,
           steps: int | None, max_files: int | None, stdlib: Path | None) -> ZooReport:
    """build_zoo once `out` is checked and claimed."""
    from specpress.models.target import TargetModel, save_target
    from specpress.zoo.progress import Reporter

    partial = out.with_name(out.name + ".partial")
    say = Reporter(enabled=progress)
    t_start = time.monotonic()

    files = corpus_files(root=stdlib, max_files=preset.max_files if max_files is None else max_files)
    stats = split_stats(files)
    sha = corpus_fingerprint(files)
    tcfg = preset.train_config(seed=seed, steps=steps, max_seconds=None if minutes is None else minutes * 60)
    key = {"format": ZOO_VERSION, "preset": asdict(preset), "corpus_sha1": sha, "seed": seed,
           "train": tcfg.resume_key()}
    _prepare_partial(partial, key, resume, say)
    say.note(f"corpus: {stats['train'].files} train files ({stats['train'].bytes:,} B), "
             f"{stats['val'].files} val files ({stats['val'].bytes:,} B)")
    tok, train_ids, val_ids = _tokenize(files, preset.vocab_size, partial)
    say.note(f"tokens: {len(train_ids):,} train, {len(val_ids):,} val (vocab {tok.get_vocab_size()})")

    torch.manual_seed(seed)
    model = TargetModel(preset.target_config())
    init_weights(model, preset.num_layers)
    params = sum(p.numel() for p in model.parameters())
    batches = TokenBatches(train_ids, preset.seq_len, preset.batch_size, seed)
    if (partial / STATE_FILE).is_file():
        say.note(f"resuming from the checkpoint in {partial}")
    say.note(f"training {params / 1e6:.1f}M params for {tcfg.steps} steps of "
             f"{preset.batch_size}x{preset.seq_len} tokens in {_dtype_words(tcfg.bf16)}{f' (at most {minutes:g} min)' if minutes else ''}"
             f"{'; compiling first (~1 min)' if tcfg.compile else ''}")
    with say.training(tcfg.steps, "train") as on_step:
        result = train(model, batches, tcfg, state_dir=partial, key=key, on_step=on_step)
    say.note(f"{result.steps} steps, {result.tokens_seen:,} tokens in {result.train_seconds:.0f} s; "
             f"evaluating on {len(val_ids):,} validation tokens (fp32)")
    val_loss, scored = evaluate(model, val_ids, preset.seq_len)
    report = ZooReport(
        out=out, size=preset.name, seed=seed, params=params,
        train_files=stats["train"].files, train_bytes=stats["train"].bytes, train_tokens=int(len(train_ids)),
        val_files=stats["val"].files, val_bytes=stats["val"].bytes, val_tokens=int(len(val_ids)),
        corpus_sha1=sha, steps_planned=tcfg.steps, steps=result.steps, tokens_seen=result.tokens_seen,
        train_seconds=round(result.train_seconds, 1), stopped_by=result.stopped_by,
        resumed_from=result.resumed_from, bf16=tcfg.bf16, compiled=result.compiled,
        val_loss=round(val_loss, 5), val_perplexity=round(math.exp(val_loss), 3),
        val_bits_per_byte=round(val_loss * scored / math.log(2) / max(1, stats["val"].bytes), 4))
    extra = {"python_version": platform.python_version(), "torch": torch.__version__,
             "torch_threads": torch.get_num_threads(), "wall_seconds": round(time.monotonic() - t_start, 1)}
    save_target(model, out, extra_files=_artifact_files(tok, report, preset, extra), force=True)
    shutil.rmtree(partial)
    say.note(f"wrote {out}: val loss {report.val_loss:.3f}, perplexity {report.val_perplexity:.2f}")
    return report


def _prepare_partial(partial: Path, key: dict[str, Any], resume: bool, say: Any) -> None:
    """Keep `<out>.partial/` only when resuming a build with the same `key`; then record the key."""
    meta = partial / META_FILE
    if partial.exists() and not (resume and meta.is_file() and _read_json(meta) == key):
        say.note(f"discarding {partial} (left by a build with other settings)" if resume
                 else f"starting afresh: removing {partial}")
        _clear_partial(partial)
    partial.mkdir(parents=True, exist_ok=True)
    write_json(meta, key)


def _read_json(path: Path) -> Any:
    try:
        return read_json(path)
    except CheckpointError:
        return None


def _tokenize(files: list[CorpusFile], vocab_size: int,
              partial: Path) -> tuple[Tokenizer, np.ndarray, np.ndarray]:
    """The tokenizer (trained on the train split, or reloaded from `partial`) and both token streams [N]."""
    from specpress.models.tokenizer import load_tokenizer

    texts = {s: [f.read_text() for f in files if f.split == s] for s in ("train", "val")}
    tok_file = partial / "tokenizer.json"
    if tok_file.is_file():
        tok = load_tokenizer(partial)
    else:
        tok = train_tokenizer(texts["train"], vocab_size)
        write_file(tok_file, tok.to_str(pretty=True))
    return tok, encode_documents(tok, texts["train"]), encode_documents(tok, texts["val"])


def _artifact_files(tok: Tokenizer, report: ZooReport, preset: ZooPreset,
                    extra: dict[str, Any]) -> dict[str, str]:
    """Everything but config.json and the weights: tokenizer files, generation config, card, zoo.json."""
    generation = {"bos_token_id": EOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID}
    return {**tokenizer_files(tok, model_max_length=preset.max_position_embeddings),
            "generation_config.json": json.dumps(generation, indent=2) + "\n",
            "README.md": model_card(report, preset, extra),
            "zoo.json": zoo_json(report, preset, extra)}


def preset_with(name: str, **changes: Any) -> ZooPreset:
    """A copy of a named preset with some fields changed (e.g. a tiny one for tests)."""
    if name not in PRESETS:
        raise UsageError(f"unknown zoo size {name!r}; available: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **changes)
