"""The seam: what the speculative loop and the draft sessions see of the target and the drafter.

The speculative loop (`runtime/loop.py`) calls the target only through a `TargetRunner`, and the draft
sessions (`runtime/drafting.py`) call a drafter only through one of three drafter protocols, one per
session kind (the family descriptor's `session`); a backend (torch, onnxruntime, tensorrt) implements
them. Inputs and outputs are torch tensors on `runner.device`; a backend converts at its edge.

- `FeatureDrafter` (eagle, eagle3, mtp): `fuse_taps` turns target taps into input features, then
  `feature_step` runs one drafting pass over T new positions (prefill of accepted pairs, a chain step,
  one tree level) and returns logits and the drafter's output hidden, which the next level feeds back.
- `TokenDrafter` (lm): `lm_step` is an independent small LM's forward; it sees tokens only.
- `BlockDrafter` (dflash): `block_drafts` injects the new context features as K/V and drafts a whole
  block [root, MASK x (B-1)] in one pass, greedily (left to right through a Markov head when present).

Each is what `DrafterRunner` says every drafter has, plus its one or two calls. Caches: `new_cache`
returns an object with `length`, `capacity`, `crop(n)` and `compact(base, keep)` (`models.kv.KVCache`
semantics); a session uses nothing else of it, so a backend may keep its K/V in any form as long as
those four behave the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from specpress.models.kv import KVCache
    from specpress.models.target import TargetConfig, TargetOutput


class DraftCache(Protocol):
    """The part of a KV cache a draft session touches (see `models.kv.KVCache`)."""

    length: int

    @property
    def capacity(self) -> int: ...

    def crop(self, length: int) -> None: ...

    def compact(self, base: int, keep: list[int]) -> None: ...


class TargetRunner(Protocol):
    """The target as the loop calls it: one forward serves prefill, a plain decode step and a tree verify."""

    @property
    def config(self) -> "TargetConfig":
        """The target's config (vocabulary, context length, EOS ids)."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the target's inputs and outputs live."""
        ...

    def new_cache(self, capacity: int) -> "KVCache":
        """A fresh target KV cache for `capacity` positions."""
        ...

    def forward(self, ids: Tensor, *, cache: "KVCache", positions: Tensor | None = None,
                mask: Tensor | None = None, taps: Sequence[int] = (), logits: str = "all") -> "TargetOutput":
        """ids [1, T], positions [T] (None: cache.length + 0..T-1), mask bool [T, cache.length + T]
        (None: causal) -> logits [1, T, V] ([1, 1, V] with logits="last"), hidden [1, T, H] and the
        requested taps {i: [1, T, H]}. Appends T slots to `cache`."""
        ...


@runtime_checkable
class DrafterRunner(Protocol):
    """What every drafter runner has, whatever it drafts with. Shapes in the three protocols below: T new
    positions, C new context positions, F the drafter's input feature width, H its hidden size, V the
    target vocabulary, Vd the draft vocabulary (= V unless the family drafts over a reduced one)."""

    backend: str  # registry name: "torch", "onnxruntime", "tensorrt"
    family: str  # drafter family name (models registry)
    taps: tuple[int, ...]  # target hidden-state taps (HF hidden_states indices) needed on every forward
    vocab_size: int  # V
    token_map: Tensor | None  # [Vd] draft id -> target id, or None when Vd == V and ids are the target's

    @property
    def device(self) -> torch.device:
        """Where the runner's torch inputs and outputs live."""
        ...

    @property
    def provider(self) -> str:
        """What actually executed the drafter (e.g. 'cpu', 'CUDAExecutionProvider'); for the metrics."""
        ...

    def new_cache(self, capacity: int) -> DraftCache:
        """A fresh drafter KV cache for `capacity` positions."""
        ...


@runtime_checkable
class FeatureDrafter(DrafterRunner, Protocol):
    """A feature-conditioned drafter (eagle, eagle3, mtp): it reads (feature of token j, token j+1) pairs."""

    def fuse_taps(self, taps: dict[int, Tensor]) -> Tensor:
        """{tap: [1, T, H_target]} -> input features [1, T, F] (eagle3; eagle and mtp read the target's last
        hidden state as it is and have no taps)."""
        ...

    def feature_step(self, feats: Tensor, ids: Tensor, cache: DraftCache, positions: Tensor | None,
                     mask: Tensor | None, module: int = 0) -> tuple[Tensor, Tensor]:
        """feats [1, T, F] (fused taps / target hidden, or the drafter's own hidden [1, T, H] fed back),
        ids [1, T] (the token after each position), positions [T] (None: cache.length + 0..T-1),
        mask bool [T, cache.length + T] (None: causal) -> logits [1, T, Vd], hidden [1, T, H].
        Appends T slots to `cache`. `module`: the draft level (0 for the prefill of committed pairs, the
        tree level of a draft step); MTP picks its module from it (level % modules), other families ignore it."""
        ...


@runtime_checkable
class TokenDrafter(DrafterRunner, Protocol):
    """A token-only drafter (lm): an independent small LM over the target's tokenizer."""

    def lm_step(self, ids: Tensor, cache: DraftCache, positions: Tensor | None, mask: Tensor | None,
                last_only: bool = False) -> Tensor:
        """ids [1, T], positions [T] (None: cache.length + 0..T-1), mask bool [T, cache.length + T]
        (None: causal) -> logits [1, T, V] ([1, 1, V] when `last_only`); appends T slots to `cache`."""
        ...


@runtime_checkable
class BlockDrafter(DrafterRunner, Protocol):
    """A block drafter (dflash): the target's context injected as K/V, a block drafted in one pass."""

    def fuse_taps(self, taps: dict[int, Tensor]) -> Tensor:
        """{tap: [1, T, H_target]} -> context features [1, T, F]."""
        ...

    def block_drafts(self, feats: Tensor | None, root: int, block_size: int, cache: DraftCache) -> list[int]:
        """feats [1, C, F] context new since the last call (or None) -> the greedy drafts at block
        positions 1..block_size-1 under `root`. Appends the context's C slots to `cache`."""
        ...


AnyDrafter = FeatureDrafter | TokenDrafter | BlockDrafter  # what a backend's load_runner returns
