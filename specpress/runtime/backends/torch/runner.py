"""The torch backend: the drafter modules of `specpress.models` behind the seam, and the target.

`drafter_runner(module)` wraps any registered drafter module in the runner of its family's session kind
(`FeatureRunner`, `TokenRunner`, `BlockRunner`); each calls exactly what the sessions called on the module
before the seam existed, so a torch run drafts the same tokens. `TorchTarget` is the `TargetRunner` over
a `TargetModel`. `--compile` compiles the module in place (`runtime.compile`); the runner calls the
module, so the compiled forward runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from specpress.models.drafter import get_family
from specpress.models.kv import KVCache
from specpress.models.target import TargetConfig, TargetModel, TargetOutput
from specpress.runtime.backends.base import AnyDrafter


class TorchTarget:
    """The `TargetRunner` over a `TargetModel` (called as a module, so a compiled target runs compiled)."""

    def __init__(self, model: TargetModel) -> None:
        self.model = model

    @property
    def config(self) -> TargetConfig:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    def new_cache(self, capacity: int) -> KVCache:
        return self.model.new_cache(capacity)

    def forward(self, ids: Tensor, *, cache: KVCache, positions: Tensor | None = None, mask: Tensor | None = None,
                taps: Sequence[int] = (), logits: str = "all") -> TargetOutput:
        return self.model(ids, cache=cache, positions=positions, mask=mask, taps=taps, logits=logits)


class TorchRunner:
    """What the three torch runners share: a drafter module (attached to its target) and its cache."""

    backend = "torch"

    def __init__(self, module: Any) -> None:  # module: any registered Drafter, attached to the target
        self.module = module
        self.family = module.family
        self.taps = tuple(module.taps)
        self.vocab_size = int(module.config.vocab_size)
        vd = getattr(module.config, "draft_vocab_size", None)
        self.token_map = (torch.arange(vd, device=module.d2t.device) + module.d2t) if vd else None
        self._device = next(module.parameters()).device

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def provider(self) -> str:
        return str(self._device)

    def new_cache(self, capacity: int) -> KVCache:
        return self.module.new_cache(capacity)


class FeatureRunner(TorchRunner):
    """eagle / eagle3 / mtp: a `FeatureDrafter`."""

    def fuse_taps(self, taps: dict[int, Tensor]) -> Tensor:
        return self.module.fuse_taps(taps)

    def feature_step(self, feats: Tensor, ids: Tensor, cache: KVCache, positions: Tensor | None,
                     mask: Tensor | None, module: int = 0) -> tuple[Tensor, Tensor]:
        return self.module(feats, ids, cache=cache, positions=positions, mask=mask, **self.module.step_kwargs(module))


class TokenRunner(TorchRunner):
    """lm: a `TokenDrafter`."""

    def lm_step(self, ids: Tensor, cache: KVCache, positions: Tensor | None, mask: Tensor | None,
                last_only: bool = False) -> Tensor:
        out = self.module(ids, cache=cache, positions=positions, mask=mask, logits="last" if last_only else "all")
        return out.logits


class BlockRunner(TorchRunner):
    """dflash: a `BlockDrafter`."""

    def fuse_taps(self, taps: dict[int, Tensor]) -> Tensor:
        return self.module.fuse_taps(taps)

    def block_drafts(self, feats: Tensor | None, root: int, block_size: int, cache: KVCache) -> list[int]:
        block = self.module.make_block(torch.tensor([root], device=self.device), block_size)
        logits = self.module(feats, block, cache=cache)[0]  # [B, V]
        return self.module.greedy_drafts(logits, root)


RUNNERS: dict[str, type[TorchRunner]] = {"feature": FeatureRunner, "lm": TokenRunner, "block": BlockRunner}


def drafter_runner(module: Any) -> AnyDrafter:
    """A drafter module in the torch runner of its family's session kind."""
    return RUNNERS[get_family(module.family).session](module)  # type: ignore[return-value]


def load_runner(path: Path, target: TargetModel, device: torch.device, *, strict: bool = False,
                warn: Callable[[str], None] = print, compile: bool = False) -> AnyDrafter:
    """The drafter artifact at `path`, loaded against `target` (a drafter built for another target warns,
    or fails with `strict`), on `device`; `compile` compiles its forward (Inductor, dynamic shapes)."""
    from specpress.models.drafter_io import load_drafter_for
    from specpress.runtime.compile import compile_drafter

    drafter = load_drafter_for(target, path, strict=strict, warn=warn).to(device)
    if compile:
        compile_drafter(drafter)
    return drafter_runner(drafter)


def target_runner(path: Path, model: TargetModel) -> TorchTarget:
    """`--target-backend torch`: the loaded target module itself (the registry's entry; `path` is its directory)."""
    return TorchTarget(model)
