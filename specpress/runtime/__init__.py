"""The speculative runtime: draft policies, draft trees, sampling and lossless verification.

Importing `specpress.runtime` (or `specpress.runtime.policy`) does not import torch; the names below
load their module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "policy": ("BlockPolicy", "ChainPolicy", "DynamicPolicy", "MTPPolicy", "Policy", "TreePolicy", "GRAMMAR",
               "parse_policy", "validate_choices"),
    "tree": ("DraftTree", "DynamicDraft", "DynamicTreeBuilder", "Frontier", "build_dynamic_tree", "pack_mask",
             "tree_for_policy", "unpack_mask"),
    "sampling": ("SamplingParams", "process_logits", "sample", "sample_from"),
    "verify": ("VerifyResult", "verify", "verify_greedy", "verify_sampling"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'specpress.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"specpress.runtime.{module}"), name)
