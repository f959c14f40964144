"""The built-in tiny target: a byte-level BPE and a Llama trained on this machine's Python stdlib.

`build_zoo`, `ensure_zoo`, `default_zoo_dir` and the presets load lazily (torch only when used);
the corpus helpers (`corpus_files`, `load_split_text`) need no torch.
"""

from __future__ import annotations

from typing import Any

from specpress.zoo.corpus import CorpusFile, corpus_files, load_split_text, split_of, stdlib_root

_LAZY = {"build_zoo", "ensure_zoo", "default_zoo_dir", "is_zoo_dir", "preset_changes", "ZooPreset", "ZooReport",
         "PRESETS", "preset_with"}

__all__ = ["CorpusFile", "corpus_files", "load_split_text", "split_of", "stdlib_root", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from specpress.zoo import build

        return getattr(build, name)
    raise AttributeError(f"module 'specpress.zoo' has no attribute {name!r}")
