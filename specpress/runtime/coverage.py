"""Draft-vocabulary coverage: how much of what the target emits a reduced draft vocabulary can propose.

An EAGLE-3 drafter with draft_vocab_size < vocab_size drafts only the tokens of its token map (d2t); a token
outside it is never proposed, so every round that reaches one ends there. `prune --vocab` records the share of
its ranking tokens the kept vocabulary covers ("calibration coverage", the prune step's importance.vocab.
coverage_after in the artifact's provenance). On prompts unlike the ranking data the share of the target's
EMITTED tokens that the vocabulary holds ("evaluation coverage") can be far lower, and τ falls with it: bench
and every sweep point report both, and warn when evaluation coverage is more than COVERAGE_GAP below
calibration coverage.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

COVERAGE_GAP = 0.03  # warn when evaluation coverage is more than 3 points below calibration coverage


def eval_coverage(outputs: Sequence[Sequence[int]], token_map: Tensor | None) -> float | None:
    """Fraction of the emitted tokens (outputs: token ids per prompt) that are in the draft vocabulary
    token_map [Vd] (draft id -> target id); None when the drafter drafts the full vocabulary or nothing
    was emitted."""
    if token_map is None:
        return None
    emitted = torch.tensor([t for o in outputs for t in o], dtype=torch.long)
    if emitted.numel() == 0:
        return None
    ids = token_map.detach().long().cpu()
    in_vocab = torch.zeros(int(max(int(ids.max()), int(emitted.max()))) + 1, dtype=torch.bool)
    in_vocab[ids] = True
    return round(float(in_vocab[emitted].float().mean()), 6)


def calibration_coverage(provenance: Sequence[Mapping[str, Any]] | None) -> float | None:
    """The coverage the last draft-vocabulary prune recorded on its ranking tokens, or None when no prune step
    chose the draft vocabulary."""
    for step in reversed(list(provenance or [])):
        vocab = (step.get("importance") or {}).get("vocab") if step.get("step") == "prune" else None
        if isinstance(vocab, Mapping) and vocab.get("coverage_after") is not None:
            return float(vocab["coverage_after"])
    return None


def coverage_warning(evaluation: float | None, calibration: float | None, gap: float = COVERAGE_GAP) -> str | None:
    """A sentence when evaluation coverage is more than `gap` below calibration coverage, else None."""
    if evaluation is None or calibration is None or calibration - evaluation <= gap:
        return None
    return (f"the draft vocabulary covers {100 * evaluation:.1f} % of the tokens the target emitted on these prompts "
            f"but {100 * calibration:.1f} % of its ranking data (more than {100 * gap:.0f} points lower): these "
            f"prompts differ from what the vocabulary was ranked on and tau suffers; re-rank it on traffic like "
            f"these prompts (`specpress prune --vocab N --data PROMPTS.jsonl`)")


def drafter_provenance(drafter_dir: Any) -> list[Mapping[str, Any]]:
    """The compression steps of a drafter artifact or an exported directory (its manifest); [] when neither."""
    from pathlib import Path

    from specpress.runtime.backends import is_drafter_artifact

    path = Path(drafter_dir).expanduser()
    if is_drafter_artifact(path):
        from specpress.models.inspect import inspect_artifact

        return list(inspect_artifact(path)["provenance"])
    if (path / "manifest.json").is_file():
        from specpress.manifest import load_manifest

        return list(load_manifest(path).provenance)
    return []


__all__ = ["COVERAGE_GAP", "eval_coverage", "calibration_coverage", "coverage_warning", "drafter_provenance"]
