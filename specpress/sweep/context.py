"""What every point of a sweep shares: the target, the base drafter, the prompts and the data streams.

The parent process resolves the target (`zoo` -> ensure_zoo) and the base drafter (a path, or distilled
once into `$SPECPRESS_CACHE/drafters/<hash>`, reused by every later sweep with the same distill config,
data and target), then opens a SweepContext; worker processes open their own from the resolved dirs.
Token streams are cached as .npy files under OUT/cache/ (written atomically, memory-mapped on reuse).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from specpress.compress.data import DataSource, encode_stream, read_texts, token_stream
from specpress.compress.regen import _partial
from specpress.compress.self_instruct import self_instruct
from specpress.models.drafter import target_fingerprint
from specpress.runtime.chat import (chat_prompt_ids, conversation, load_chat_template, read_questions,
                                    template_specials)
from specpress.runtime.prompts import Prompt
from specpress.errors import RequestError
from specpress.sweep.recipe import Recipe
from specpress.zoo.resolve import is_gguf_path, resolve_target_path

if TYPE_CHECKING:
    from specpress.compress.calibration import Calibration

AGREEMENT_WINDOWS = (8, 128)  # [batch, seq_len] of each agreement batch


def cache_root() -> Path:
    cache = os.environ.get("SPECPRESS_CACHE")
    return Path(cache).expanduser() if cache else Path.home() / ".cache" / "specpress"


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def dir_digest(path: Path) -> str:
    """Digest of an artifact directory's config.json and weight files (identifies the base drafter)."""
    files = sorted(p for p in Path(path).iterdir() if p.is_file() and (p.suffix in (".json", ".safetensors", ".bin")))
    return _sha({p.name: file_digest(p) for p in files})


def resolve_target(recipe: Recipe, log: Callable[[str], None] = print) -> Path:
    spec = recipe.target
    if spec.zoo is not None:
        from specpress.zoo import default_zoo_dir, ensure_zoo, is_zoo_dir, preset_changes

        cached = default_zoo_dir(spec.zoo)
        if not is_zoo_dir(cached):
            log(f"building the zoo target ({spec.zoo}) first: `specpress zoo build --size {spec.zoo}` (cached after)")
        elif changes := preset_changes(cached, spec.zoo):
            log(f"note: the cached zoo target {cached} was built with an older `{spec.zoo}` preset "
                f"({'; '.join(changes)}); using it as is. `specpress zoo build --size {spec.zoo}` rebuilds it")
        return ensure_zoo(spec.zoo)
    assert spec.path is not None
    if is_gguf_path(spec.path):
        return resolve_target_path(spec.path, say=log)
    if not (spec.path / "config.json").is_file():
        raise RequestError(f"target {spec.path} is not a model directory (no config.json); fix `target:` in the recipe")
    return spec.path


def resolve_drafter(recipe: Recipe, target_dir: Path, log: Callable[[str], None] = print) -> Path:
    """The base drafter dir: the recipe's path, or the cached distillation (built now if missing)."""
    spec = recipe.drafter
    if spec.distill is None:
        assert spec.path is not None
        if not (spec.path / "config.json").is_file():
            raise RequestError(f"drafter {spec.path} is not a drafter directory (no config.json); fix `drafter:`")
        return spec.path
    from specpress.compress.calibration import Calibration, split_stream
    from specpress.compress.distill import distill
    from specpress.compress.guards import check_seq_len
    from specpress.models.drafter import target_fingerprint
    from specpress.models.target import load_target

    cfg, data = spec.distill.config, spec.distill.data
    check_seq_len(target_dir, cfg.seq_len, cfg.batch, what=f"drafter: distill: seq_len {cfg.seq_len}")
    target = load_target(target_dir, dtype=recipe.dtype)
    regen = spec.distill.regenerate
    fingerprint = target_fingerprint(target.config, target)
    identity = {"config": {k: v for k, v in cfg.to_dict().items() if k != "checkpoint_minutes"},
                "data": data.to_json(), "target": fingerprint}
    if regen is not None:  # (absent otherwise, so the drafters cached before `regenerate` existed stay valid)
        identity["regenerate"] = asdict(regen)
    key = _sha(identity)
    out = cache_root() / "drafters" / key
    if (out / "config.json").is_file():
        log(f"base drafter: reusing {out} (distilled earlier with the same config, data and target)")
        return out
    tok, tag = _tokenizer(target_dir)
    eos = target.config.eos_ids[0] if target.config.eos_ids else None
    vocab = target.config.vocab_size
    chat = regen is not None and getattr(regen, "conversations", None) is not None  # self_instruct.py's data
    if chat:  # `data` is not read: the target writes the conversations, and a share of them is held out
        stream = _self_instructed(target, target_dir, tok, regen, chat_data_file(regen, fingerprint), log)
    else:
        stream = token_stream(data, tok, eos, vocab, target=target_dir)
    if regen is not None and not chat:
        from specpress.compress.regen import regenerated_stream

        name = _sha({"regenerate": asdict(regen), "data": data.to_json(), "target": fingerprint})
        stream = regenerated_stream(target, tok, stream, regen, cache_root() / "regenerated" / f"{name}.jsonl",
                                    source=data.to_json(), log=log)
    if data.zoo_split == "train" and not chat:
        train, held = stream, token_stream(DataSource(zoo_split="val"), tok, eos, vocab, target=target_dir)
    else:
        train, held = split_stream(stream, cfg.seq_len)
    source = f"self-instruct ({chat_data_file(regen, fingerprint).name})" if chat else data.to_json()
    cal = Calibration(train, held, cfg.seq_len, cfg.batch, cfg.seed, source)
    budget = f"{cfg.steps} steps" if cfg.steps else f"{cfg.minutes} min"
    log(f"base drafter: distilling a {cfg.family} drafter ({budget}) into {out}; later sweeps reuse it")
    distill(target, cfg, cal.sampler(), out, resume=True, progress=True, heldout=cal.heldout(),
            provenance_extra={"source": source, "target": str(target_dir), "sweep_cache_key": key,
                              **({"regenerate": asdict(regen)} if regen is not None else {})})
    return out


def chat_data_file(regen: Any, fingerprint: Any) -> Path:
    """Where the self-instructed chat data of `regen` (a ChatRegenConfig) for a target is cached."""
    return cache_root() / "regenerated" / f"{_sha({'self_instruct': asdict(regen), 'target': fingerprint})}.jsonl"


def _self_instructed(target: Any, target_dir: Path, tok: Any, cfg: Any, out: Path,
                     log: Callable[[str], None]) -> np.ndarray:
    """The token stream of the target's own chat conversations (written once into the cache, resumed after an
    interruption, reused afterwards)."""
    if not out.is_file():
        log(f"writing {cfg.conversations} chat conversations with the target into {out} (once; later runs reuse it)")
        t0 = time.monotonic()
        card = self_instruct(target, tok, load_chat_template(target_dir), template_specials(target_dir), cfg, out,
                             resume=_partial(out)[0].exists())
        log(f"self-instruct: {card['sequences']} conversations, {card['tokens_per_s']:.0f} tokens/s, "
            f"{time.monotonic() - t0:.0f} s")
    return encode_stream(read_texts(out), tok, target.config.eos_ids[0])


def _tokenizer(target_dir: Path) -> tuple[Any | None, str]:
    f = Path(target_dir) / "tokenizer.json"
    if not f.is_file():
        return None, ""
    from specpress.models.tokenizer import load_tokenizer

    return load_tokenizer(target_dir), file_digest(f)


@dataclass
class SweepContext:
    recipe: Recipe
    out: Path
    target_dir: Path
    base_dir: Path
    target: Any  # TargetModel
    tokenizer: Any | None
    tokenizer_tag: str
    prompts: list[Any]  # [Prompt]
    policies: tuple[str, ...]
    base_info: dict[str, Any]  # inspect_artifact of the base drafter
    base_digest: str
    _streams: dict[str, np.ndarray] = field(default_factory=dict)
    _targets: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)  # label -> (target, summary)
    _greedy: dict[str, list[list[int]]] = field(default_factory=dict)  # label -> greedy outputs on the prompts

    @property
    def eos_id(self) -> int | None:
        return self.target.config.eos_ids[0] if self.target.config.eos_ids else None

    def stream(self, source: DataSource) -> np.ndarray:
        key = source.to_json()
        if source.drafter_data:
            source = DataSource(path=self.drafter_data_file())
        if key not in self._streams:
            self._streams[key] = token_stream(source, self.tokenizer, self.eos_id, self.target.config.vocab_size,
                                              self.out / "cache", self.tokenizer_tag, self.target_dir)
        return self._streams[key]

    def drafter_data_file(self) -> Path:
        """The chat conversations the recipe's base drafter was distilled on (`calibration: drafter-data`)."""
        spec = self.recipe.drafter.distill
        regen = spec.regenerate if spec is not None else None
        if getattr(regen, "conversations", None) is None:
            raise RequestError("`drafter-data` names the chat data of a recipe's `drafter: {distill: {regenerate: "
                               "{self_instruct: N}}}`; this recipe has none: name a data file instead")
        f = chat_data_file(regen, target_fingerprint(self.target.config, self.target))
        if not f.is_file():
            raise RequestError(f"{f} (the base drafter's chat data) is missing: run the sweep again to write it")
        return f

    def calibration(self, seq_len: int, batch: int) -> Calibration:
        """The recipe's calibration data as a compression step's windows: the whole stream (nothing held out),
        seeded with the recipe's seed."""
        from specpress.compress.calibration import Calibration

        source = self.recipe.calibration
        return Calibration(self.stream(source), None, seq_len, batch, self.recipe.seed, source.to_json())

    def stored_dtype(self) -> Any:
        """The dtype compressed points store their float tensors in (the recipe's float_dtype)."""
        import torch

        from specpress.compress.quantize.api import resolve_float_dtype
        from specpress.device import DTYPES

        base = DTYPES.get(str(self.base_info.get("dtype")), torch.float32)
        return resolve_float_dtype(self.recipe.float_dtype, base)

    def target_for(self, label: str) -> tuple[Any, dict[str, Any] | None]:
        """(the target a run with this target label verifies with, what compressing it did; None for the
        float target): compressed copies are built once per process, calibrated on the recipe's
        `calibration` data when their spec needs data (compress/quantize/target.py `compressed_copy`)."""
        tq = self.recipe.target_spec(label)
        return (self.target, None) if tq.is_float else self.compressed(tq)

    def compressed(self, tq: Any) -> tuple[Any, dict[str, Any]]:
        """(the target compressed per `tq`, the summary), built once per process (by label)."""
        if tq.label not in self._targets:
            from specpress.compress.quantize.target import compressed_copy

            stream = self.stream(self.recipe.calibration) if tq.needs_data() else None
            self._targets[tq.label] = compressed_copy(self.target, tq, stream, seed=self.recipe.seed)
        return self._targets[tq.label]

    def greedy_outputs(self, label: str) -> list[list[int]]:
        """The greedy continuations of the sweep's prompts by the target `label`: those a greedy bench of it
        already decoded (`note_greedy`, kept under OUT/cache/), else decoded now (plain decoding, once)."""
        if label not in self._greedy:
            cached = self._greedy_file(label)
            outputs = _cached_outputs(cached) if cached.is_file() else None
            if outputs is not None:
                self._greedy[label] = outputs
            else:
                from specpress.runtime.backends.torch.runner import TorchTarget
                from specpress.runtime.plain import decode_plain

                target = TorchTarget(self.target_for(label)[0])
                self.note_greedy(label, [decode_plain(target, p.ids, self.recipe.max_new_tokens).tokens
                                         for p in self.prompts])
        return self._greedy[label]

    def has_greedy(self, label: str) -> bool:
        return label in self._greedy or self._greedy_file(label).is_file()

    def note_greedy(self, label: str, outputs: list[list[int]]) -> None:
        """Keep the plain greedy continuations a bench of target `label` decoded (in memory and on disk)."""
        from specpress.artifacts import write_json

        self._greedy[label] = [list(o) for o in outputs]
        path = self._greedy_file(label)
        path.parent.mkdir(parents=True, exist_ok=True)  # OUT/cache/ exists only once a token stream was cached
        write_json(path, {"target": label, "outputs": self._greedy[label]})

    def _greedy_file(self, label: str) -> Path:
        """OUT/cache/greedy-<key>.json, keyed by what the continuations depend on."""
        from specpress.sweep.run import target_tag

        tq, r = self.recipe.target_spec(label), self.recipe
        key = _sha({"prompts": [list(p.ids) for p in self.prompts], "max_new_tokens": r.max_new_tokens,
                    "target": target_tag(self.target_dir), "spec": tq.text, "dtype": r.dtype, "seed": r.seed,
                    "calibration": r.calibration.to_json() if tq.needs_data() else None})
        return self.out / "cache" / f"greedy-{key}.json"

    def target_drift(self, label: str) -> dict[str, Any] | None:
        """How far the compressed target's greedy continuations drift from the float target's (None for the
        float target itself; runtime/compressed_target.py defines it)."""
        if self.recipe.target_spec(label).is_float:
            return None
        from specpress.runtime.compressed_target import greedy_agreement

        return greedy_agreement(self.greedy_outputs("float"), self.greedy_outputs(label))

    def agreement_sampler(self) -> Any | None:
        """Windows for acc@k (None when agreement_batches is 0)."""
        if not self.recipe.agreement_batches:
            return None
        return self.windows(self.recipe.agreement_data)

    def windows(self, source: DataSource) -> Any:
        """[8, 128] windows of `source` (shorter past the target's context), seeded with the recipe's seed: those
        acc@k reads (agreement_data), and the --find-smallest search's τ proxy (calibration)."""
        from specpress.compress.data import WindowSampler

        batch, seq = AGREEMENT_WINDOWS
        seq = min(seq, self.target.config.max_position_embeddings - 1)
        return WindowSampler(self.stream(source), seq, batch, self.recipe.seed)


def open_context(recipe: Recipe, out: Path, target_dir: Path, base_dir: Path, base_digest: str | None = None
                 ) -> SweepContext:
    from specpress.models.drafter_io import read_drafter_config
    from specpress.models.inspect import inspect_artifact
    from specpress.models.target import load_target
    from specpress.runtime.bench import default_policy
    from specpress.runtime.prompts import load_prompts

    target = load_target(target_dir, dtype=recipe.dtype)
    tok, tag = _tokenizer(target_dir)
    spec = recipe.prompts
    if spec.questions is not None:
        prompts = question_prompts(target_dir, spec, tok)
    elif spec.path is not None:
        prompts = load_prompts(spec.path, tok, target.config.vocab_size, target.config.max_context)
    else:
        if tok is None:
            raise RequestError(f"held-out prompts need the target's tokenizer.json ({target_dir} has none); give "
                               f"`prompts:` a .jsonl of {{\"input_ids\": [...]}} lines")
        from specpress.runtime.heldout import heldout_code_prompts

        prompts = heldout_code_prompts(tok, spec.heldout_n, spec.heldout_tokens, spec.heldout_seed)
    info = inspect_artifact(base_dir)
    info["family"] = read_drafter_config(base_dir)[0]  # inspect calls a public standalone LM a "target"
    policies = recipe.policies or (default_policy(info["family"]),)
    return SweepContext(recipe, out, Path(target_dir), Path(base_dir), target, tok, tag, prompts, policies, info,
                        base_digest or dir_digest(base_dir))


def question_prompts(target_dir: Path, spec: Any, tok: Any) -> list[Any]:
    """The first turns of `spec.questions` in the target's chat template (as `prompts --questions` writes them)."""
    if tok is None:
        raise RequestError(f"chat prompts need the target's tokenizer.json ({target_dir} has none)")
    template, special = load_chat_template(target_dir), template_specials(target_dir)
    qs = read_questions(spec.questions)[: spec.questions_n]
    return [Prompt(tuple(chat_prompt_ids(template, tok, conversation(q, 1, (), spec.system), special,
                                         f"{spec.questions}:{q.line}: the chat template")), q.turns[0]) for q in qs]


def _cached_outputs(path: Path) -> list[list[int]] | None:
    """The continuations a greedy cache file holds; None when it is damaged (they are decoded again)."""
    from specpress.errors import CheckpointError
    from specpress.readback import read_json_object

    try:
        outputs = read_json_object(path).get("outputs")
    except CheckpointError:
        return None
    ok = isinstance(outputs, list) and all(isinstance(o, list) and all(isinstance(t, int) for t in o) for o in outputs)
    return outputs if ok else None
