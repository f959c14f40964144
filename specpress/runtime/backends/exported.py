"""Backend-neutral pieces of the runners over an exported directory (onnxruntime now, TensorRT next).

The mask helper turns a boolean attention mask into the `specpress::TreeAttention` inputs
(committed length + LSB-first packed int32 words, runtime.tree.pack_mask's layout).
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpress.runtime.tree import pack_mask


def plugin_mask(mask: Tensor) -> tuple[Tensor, Tensor]:
    """bool [T, S] (True = may attend) -> (committed int32 [1], tree_mask int32 [T, ceil((S-c)/32)]):
    c = the longest prefix of slots every query sees; the words cover slots c..S-1."""
    seen = mask.all(0)
    c = int(seen.numel()) if bool(seen.all()) else int((~seen).nonzero()[0, 0])
    return torch.tensor([c], dtype=torch.int32), pack_mask(mask[:, c:]).contiguous()
