"""The student of a distillation run: its config (shape from flags, defaults from the target), its
initial weights (seeded; or a copy of an init drafter), and EAGLE-3's draft vocabulary.

Defaults: hidden, FFN width and heads of the target; 1 layer (eagle, eagle3, mtp module count),
2 layers (dflash), max(1, L/4) layers (lm). Families that share the target's embeddings and head (all
but lm) must keep the target's hidden size. The lm student starts from the target's embeddings, head
and final norm when their shapes match.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import torch

from specpress.errors import UsageError
from specpress.models.dflash import DFlashConfig, default_target_layer_ids
from specpress.models.drafter import Drafter, DrafterConfig, build_drafter
from specpress.models.eagle import EagleConfig
from specpress.models.eagle3 import Eagle3Config
from specpress.models.lm import LMConfig
from specpress.models.mtp import MTPConfig
from specpress.models.target import TargetConfig, TargetModel

if TYPE_CHECKING:
    from specpress.compress.distill import DistillConfig

SHAPE_FLAGS = ("hidden", "layers", "ffn", "heads", "kv_heads", "draft_vocab", "taps", "markov_rank")
MAX_DRAFT_VOCAB = 32000


def student_config(config: "DistillConfig", t: TargetConfig, teacher: Drafter | None = None) -> DrafterConfig:
    """The student's family config for target `t` (see the module docstring for the defaults)."""
    fam = config.family
    hidden = config.hidden or t.hidden_size
    if fam != "lm" and hidden != t.hidden_size:
        raise UsageError(f"{fam} drafters share the target's embeddings, so their hidden size must be the target's "
                         f"({t.hidden_size}), not {hidden}; shrink them with --ffn, --heads, --kv-heads or --layers")
    heads = config.heads or t.num_attention_heads
    assert t.num_key_value_heads is not None
    kv = config.kv_heads or (t.num_key_value_heads if heads % t.num_key_value_heads == 0 else heads)
    same_heads = heads == t.num_attention_heads and hidden == t.hidden_size
    head_dim = t.head_dim if same_heads else None
    if head_dim is None and hidden % heads:
        raise UsageError(f"hidden size {hidden} is not divisible by {heads} heads; choose --heads that divides it")
    if heads % kv:
        raise UsageError(f"{heads} heads are not a multiple of {kv} KV heads; choose --kv-heads that divides --heads")
    shape = dict(vocab_size=t.vocab_size, hidden_size=hidden, intermediate_size=config.ffn or t.intermediate_size,
                 num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, rms_norm_eps=t.rms_norm_eps,
                 max_position_embeddings=t.max_position_embeddings, rope=t.rope)
    layers = config.layers
    if fam == "eagle":
        return EagleConfig(**shape, num_hidden_layers=layers or 1)  # type: ignore[arg-type]
    if fam == "eagle3":
        if layers not in (None, 1):
            raise UsageError(f"eagle3 drafters have exactly one layer (midlayer); --layers {layers} is not possible")
        n = config.draft_vocab
        if n is None:
            n = teacher.config.draft_vocab_size if teacher is not None else min(t.vocab_size, MAX_DRAFT_VOCAB)
        if teacher is not None and n > teacher.config.draft_vocab_size:
            raise UsageError(f"--draft-vocab {n} is larger than the --from drafter's draft vocabulary "
                             f"({teacher.config.draft_vocab_size}); the student's must be a subset of it")
        if n > t.vocab_size:
            raise UsageError(f"--draft-vocab {n} is larger than the target's vocabulary ({t.vocab_size})")
        return Eagle3Config(**shape, draft_vocab_size=n, target_layer_ids=config.taps)  # type: ignore[arg-type]
    if fam == "mtp":
        return MTPConfig(**shape, num_target_layers=t.num_hidden_layers,  # type: ignore[arg-type]
                         num_nextn_predict_layers=layers or 1, qk_norm=t.qk_norm)
    if fam == "dflash":
        n_layers = layers or 2
        if config.taps is not None:  # HF hidden_states indices, like eagle3's; DFlash reads layer id = tap - 1
            bad = [i for i in config.taps if not 1 <= i <= t.num_hidden_layers]
            if bad:
                n = t.num_hidden_layers
                raise UsageError(f"--taps {bad} out of range for dflash: HF hidden_states indices 1..{n} "
                                 f"(the output of layer i-1; {n} = the final normed hidden)")
            ids = tuple(sorted({i - 1 for i in config.taps}))
        else:
            ids = tuple(sorted(set(default_target_layer_ids(t.num_hidden_layers, n_layers))))
        mask = config.mask_token_id if config.mask_token_id is not None else 0
        if not 0 <= mask < t.vocab_size:
            raise UsageError(f"--mask-token-id {mask} is outside the target's vocabulary 0..{t.vocab_size - 1}")
        return DFlashConfig(**shape, num_hidden_layers=n_layers,  # type: ignore[arg-type]
                            num_target_layers=t.num_hidden_layers, block_size=config.block_size,
                            mask_token_id=mask, target_layer_ids=ids, markov_rank=config.markov_rank or 0)
    if fam == "lm":
        base = dataclasses.replace(t, hidden_size=hidden, intermediate_size=config.ffn or t.intermediate_size,
                                   num_hidden_layers=layers or max(1, t.num_hidden_layers // 4),
                                   num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim)
        return LMConfig.from_target_config(base)
    raise UsageError(f"distill does not know how to shape a {fam!r} student")


def draft_vocab_by_frequency(stream: np.ndarray, vocab_size: int, n: int,
                             allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The `n` most frequent token ids of `stream` (ties: lower id first), ascending; only `allowed` ids
    (a bool [V] mask) when given."""
    counts = np.bincount(np.asarray(stream, dtype=np.int64), minlength=vocab_size)[:vocab_size].astype(np.float64)
    if allowed is not None:
        ok = allowed.cpu().numpy().astype(bool)
        if int(ok.sum()) < n:
            raise UsageError(f"a draft vocabulary of {n} cannot be drawn from the {int(ok.sum())} allowed ids")
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
        if student.family == "lm":
            student.lm_head.weight.requires_grad_(True)
        return student.float()
    cfg = student_config(config, target.config, teacher)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        student = build_drafter(cfg, target)
    if student.family == "eagle3":
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
    if student.family == "lm" and cfg.hidden_size == target.config.hidden_size:  # type: ignore[attr-defined]
        with torch.no_grad():
            student.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
            student.model.norm.weight.copy_(target.model.norm.weight)
            if not cfg.tie_word_embeddings:  # type: ignore[attr-defined]
                student.lm_head.weight.copy_(target.lm_head.weight)
    return student
