"""The TreeAttention plugin's math (runtime/backends/tensorrt/kernel.py) against models.layers.attention, on CPU.

`kernel.tree_attention` is the very function the plugin's enqueue calls on the GPU; here it decodes the
contract's compact mask (committed length + LSB-first int32 words) and must equal the reference fed the
same visibility as an explicit boolean mask.
"""

from __future__ import annotations

import pytest
import torch

from specpress.runtime.backends.tensorrt.kernel import decode_tree_mask, tree_attention
from specpress.models.layers import attention
from specpress.runtime.tree import DraftTree, pack_mask, unpack_mask


def _qkv(t: int, s: int, hq: int = 4, hkv: int = 2, d: int = 64, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    return mk(1, hq, t, d), mk(1, hkv, s, d), mk(1, hkv, s, d)


def _random_tree(n: int, seed: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    return DraftTree(parents=tuple(parents))


@pytest.mark.parametrize("n,committed", [(6, 3), (40, 17), (70, 0), (1, 5)])
def test_tree_attention_matches_reference(n, committed):
    tree = _random_tree(n, seed=n)
    q, k, v = _qkv(n, committed + n, seed=committed)
    mask = tree.verify_mask(committed)  # bool [n, committed + n]
    ref = attention(q, k, v, mask[None, None])
    got = tree_attention(q, k, v, torch.tensor([committed], dtype=torch.int32), tree.packed_mask(), 64 ** -0.5)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_uncommitted_slots_beyond_the_queries():
    """A dynamic tree's later level: queries see committed slots plus earlier levels' uncommitted slots."""
    committed, earlier, t = 9, 37, 5
    g = torch.Generator().manual_seed(1)
    vis = torch.rand(t, earlier + t, generator=g) < 0.4
    vis[:, earlier:] = torch.eye(t, dtype=torch.bool)
    q, k, v = _qkv(t, committed + earlier + t, seed=2)
    full = torch.cat([torch.ones(t, committed, dtype=torch.bool), vis], dim=1)
    ref = attention(q, k, v, full[None, None])
    got = tree_attention(q, k, v, torch.tensor([committed], dtype=torch.int32), pack_mask(vis), 64 ** -0.5)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, attention(q, k, v, None))  # the mask matters


def test_dflash_block_all_visible_is_unmasked_attention():
    committed, block = 20, 8
    q, k, v = _qkv(block, committed + block, seed=3)
    words = pack_mask(torch.ones(block, block, dtype=torch.bool))
    got = tree_attention(q, k, v, torch.tensor([committed], dtype=torch.int32), words, 64 ** -0.5)
    torch.testing.assert_close(got, attention(q, k, v, None), rtol=1e-5, atol=1e-6)


def test_scale_attribute_is_applied():
    q, k, v = _qkv(3, 7, seed=4)
    words = pack_mask(torch.ones(3, 4, dtype=torch.bool))
    c = torch.tensor([3], dtype=torch.int32)
    got = tree_attention(q, k, v, c, words, 0.05)
    ref = attention(q * (0.05 * 8.0), k, v, None)  # SDPA's own scale is 1/sqrt(64) = 1/8
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_decode_tree_mask_bit_layout():
    """Bit j (LSB first) of word w of row t <=> slot committed + 32 w + j; bit 31 (the sign bit) too."""
    vis = torch.zeros(2, 64, dtype=torch.bool)
    vis[0, 31] = vis[0, 32] = vis[1, 0] = vis[1, 63] = True
    words = pack_mask(vis)
    assert words[0, 0] < 0  # bit 31 set: a negative int32
    got = decode_tree_mask(torch.tensor([4], dtype=torch.int32), words, 4 + 64)
    assert got[:, :4].all()
    assert torch.equal(got[:, 4:], unpack_mask(words, 64))
    assert got[0, 4 + 31] and got[0, 4 + 32] and got[1, 4] and got[1, 4 + 63] and int(got.sum()) == 8 + 4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precisions_follow_fp32(dtype):
    tree = _random_tree(12, seed=5)
    q, k, v = _qkv(12, 30 + 12, seed=6)
    c, words = torch.tensor([30], dtype=torch.int32), tree.packed_mask()
    ref = tree_attention(q, k, v, c, words, 0.125)
    got = tree_attention(q.to(dtype), k.to(dtype), v.to(dtype), c, words, 0.125)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), ref, rtol=0, atol=3e-2 if dtype == torch.bfloat16 else 4e-3)
