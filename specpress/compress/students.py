"""The student of a distillation run: its config (shape from flags, defaults from the target), its
initial weights (seeded; or a copy of an init drafter), and EAGLE-3's draft vocabulary.

Defaults: hidden, FFN width and heads of the target; 1 layer (eagle, eagle3, mtp module count),
2 layers (dflash), max(1, L/4) layers (lm). Families that share the target's embeddings and head (all
but lm) must keep the target's hidden size. The lm student starts from the target's embeddings, head
and final norm when their shapes match.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np
import torch

from specpress.errors import RequestError, UsageError
from specpress.models.drafter import Drafter, DrafterConfig, build_drafter, get_family
from specpress.models.family import StudentSpec
from specpress.models.target import TargetConfig, TargetModel

if TYPE_CHECKING:
    from specpress.compress.config import DistillConfig

SHAPE_FLAGS = ("hidden", "layers", "ffn", "heads", "kv_heads", "draft_vocab", "taps", "markov_rank")


def student_config(config: "DistillConfig", t: TargetConfig, teacher: Drafter | None = None) -> DrafterConfig:
    """The student's family config for target `t`: the shared layer shape from the flags (defaults from the
    target), the rest from the family's descriptor (Family.student)."""
    fam = get_family(config.family)
    hidden = config.hidden or t.hidden_size
    if fam.draft_vocab != "own" and hidden != t.hidden_size:
        raise RequestError(f"{fam.name} drafters share the target's embeddings, so their hidden size must be the "
                           f"target's ({t.hidden_size}), not {hidden}; shrink them with --ffn, --heads, --kv-heads or "
                           f"--layers")
    heads = config.heads or t.num_attention_heads
    assert t.num_key_value_heads is not None
    kv = config.kv_heads or (t.num_key_value_heads if heads % t.num_key_value_heads == 0 else heads)
    same_heads = heads == t.num_attention_heads and hidden == t.hidden_size
    head_dim = t.head_dim if same_heads else None
    if head_dim is None and hidden % heads:
        raise RequestError(f"hidden size {hidden} is not divisible by {heads} heads; choose --heads that divides it")
    if heads % kv:
        raise RequestError(f"{heads} heads are not a multiple of {kv} KV heads; choose --kv-heads that divides --heads")
    shape = dict(vocab_size=t.vocab_size, hidden_size=hidden, intermediate_size=config.ffn or t.intermediate_size,
                 num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, rms_norm_eps=t.rms_norm_eps,
                 max_position_embeddings=t.max_position_embeddings, rope=t.rope)
    assert config.options is not None  # resolved on construction
    spec = StudentSpec(layers=config.layers, draft_vocab=config.draft_vocab, block_size=config.block_size,
                       mask_token_id=config.mask_token_id, **config.options.student_spec())  # taps, markov_rank
    return fam.student(shape, spec, t, teacher.config if teacher is not None else None)


def draft_vocab_by_frequency(stream: np.ndarray, vocab_size: int, n: int,
                             allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The `n` most frequent token ids of `stream` (ties: lower id first), ascending; only `allowed` ids
    (a bool [V] mask) when given."""
    counts = np.bincount(np.asarray(stream, dtype=np.int64), minlength=vocab_size)[:vocab_size].astype(np.float64)
    if allowed is not None:
        ok = allowed.cpu().numpy().astype(bool)
        if int(ok.sum()) < n:
            raise RequestError(f"a draft vocabulary of {n} cannot be drawn from the {int(ok.sum())} allowed ids")
        counts[~ok] = -1.0
    order = np.lexsort((np.arange(vocab_size), -counts))
    return torch.from_numpy(np.sort(order[:n])).long()


def init_student(config: "DistillConfig", target: TargetModel, stream: np.ndarray, *, init: Drafter | None = None,
                 teacher: Drafter | None = None) -> Drafter:
    """A fresh seeded student attached to `target` (or a trainable copy of `init`)."""
    if init is not None:
        given = [f for f in SHAPE_FLAGS if getattr(config, f) is not None]
        if given:
            raise UsageError(f"the student's shape comes from the init drafter; drop {', '.join(given)}")
        student = copy.deepcopy(init).attach_target(target)
        student.requires_grad_(True)
        if get_family(student.family).draft_vocab == "own":
            student.lm_head.requires_grad_(True)  # a dense or low-rank head (tied: the embedding)
        return student.float()
    cfg = student_config(config, target.config, teacher)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        student = build_drafter(cfg, target)
    vocab = get_family(student.family).draft_vocab
    if vocab == "reduced":
        allowed = teacher.t2d if teacher is not None else None  # type: ignore[union-attr]
        n = cfg.draft_vocab_size  # type: ignore[attr-defined]
        student.set_draft_vocab(draft_vocab_by_frequency(stream, cfg.vocab_size, n, allowed))  # type: ignore[operator]
        if teacher is None and cfg.hidden_size == target.config.hidden_size:  # type: ignore[attr-defined]
            # Start the draft head from the target's head rows of the draft vocabulary and the final norm
            # from the target's: the drafter's output space then begins aligned with the target's.
            with torch.no_grad():
                ids = student.to_target_ids(torch.arange(n, device=student.d2t.device))  # type: ignore[operator]
                student.lm_head.weight.copy_(target.lm_head.weight[ids])  # type: ignore[union-attr]
                student.norm.weight.copy_(target.model.norm.weight)  # type: ignore[union-attr]
    if vocab == "own" and cfg.hidden_size == target.config.hidden_size:  # type: ignore[attr-defined]
        with torch.no_grad():
            student.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
            student.model.norm.weight.copy_(target.model.norm.weight)
            if not cfg.tie_word_embeddings:  # type: ignore[attr-defined]
                student.lm_head.weight.copy_(target.lm_head.weight)
    return student
