"""Slicing a drafter into a smaller dense one of its family (prune's last move, and the head stages'):
a fresh module is built from the smaller config on the meta device and loaded with the kept tensors under
the family's public names; the input's weights are left unchanged.

  slice_ffn      keep some channels of every MLP (gate/up rows, down columns)
  slice_heads    keep some KV groups of every attention (q/k/v rows, o_proj columns)
  drop_layers    keep some layers of the layer stack, renumbered
  shrink_vocab   eagle3: keep some draft tokens (head rows, d2t, t2d)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from specpress.compress.importance import attentions, layer_stack, mlps
from specpress.errors import RequestError
from specpress.models.drafter import Drafter, families_phrase, get_family


def _rebuild(old: Drafter, config: Any, sd: dict[str, Tensor]) -> Drafter:
    """A new module of old's family for `config`, holding `sd` (public names), with old's metadata."""
    from specpress.models.drafter_io import _rebuild_rotaries

    dev = old.compute_param().device
    with torch.device("meta"):
        new = get_family(old.family).model_cls(config)  # type: ignore[call-arg]
    new.load_public(sd, f"pruned {old.family} drafter")
    _rebuild_rotaries(new)
    new = new.to(dev)
    assert not any(t.is_meta for t in (*new.parameters(), *new.buffers())), "a tensor left on the meta device"
    new.provenance, new.target_fingerprint = tuple(old.provenance), old.target_fingerprint
    new.fingerprint_mismatch = list(old.fingerprint_mismatch)
    new._shared = old._shared
    return new.train(old.training)


def _state(d: Drafter) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in d.public_state_dict().items()}


def slice_ffn(d: Drafter, keep: Mapping[str, Tensor]) -> Drafter:
    """Keep channels keep[path] (sorted ids, the same count for every MLP) of each MLP."""
    sizes = {len(v) for v in keep.values()}
    if set(keep) != set(mlps(d)) or len(sizes) != 1:
        raise RequestError("slice_ffn needs the kept channels of every MLP, the same count in each")
    sd = _state(d)
    for p, idx in keep.items():
        idx = idx.to(sd[f"{p}.gate_proj.weight"].device)
        for name in ("gate_proj", "up_proj"):
            sd[f"{p}.{name}.weight"] = sd[f"{p}.{name}.weight"].index_select(0, idx)
        sd[f"{p}.down_proj.weight"] = sd[f"{p}.down_proj.weight"].index_select(1, idx).contiguous()
    return _rebuild(d, dataclasses.replace(d.config, intermediate_size=sizes.pop()), sd)


def slice_heads(d: Drafter, keep: Mapping[str, Tensor]) -> Drafter:
    """Keep KV groups keep[path] (sorted ids, same count everywhere) of each attention: the KV head and its
    query heads (q/k/v rows, biases, o_proj columns)."""
    attn = attentions(d)
    sizes = {len(v) for v in keep.values()}
    if set(keep) != set(attn) or len(sizes) != 1:
        raise RequestError("slice_heads needs the kept KV groups of every attention, the same count in each")
    sd = _state(d)
    for p, groups in keep.items():
        a = attn[p]
        rep, hd = a.nq // a.nkv, a.d
        g = groups.long().cpu()
        q_rows = ((g[:, None] * rep + torch.arange(rep))[..., None] * hd + torch.arange(hd)).flatten()
        kv_rows = (g[:, None] * hd + torch.arange(hd)).flatten()
        for name, rows in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
            for kind in ("weight", "bias"):
                key = f"{p}.{name}.{kind}"
                if key in sd:
                    sd[key] = sd[key].index_select(0, rows.to(sd[key].device))
        key = f"{p}.o_proj.weight"
        sd[key] = sd[key].index_select(1, q_rows.to(sd[key].device)).contiguous()
    n = sizes.pop()
    rep = d.config.num_attention_heads // d.config.num_key_value_heads
    cfg = dataclasses.replace(d.config, num_attention_heads=rep * n, num_key_value_heads=n, head_dim=d.config.head_dim)
    return _rebuild(d, cfg, sd)


def drop_layers(d: Drafter, keep: Sequence[int]) -> Drafter:
    """Keep layers `keep` (ascending) of the drafter's layer stack, renumbered 0..len(keep)-1."""
    path, stack = layer_stack(d)
    keep = list(keep)
    if not keep or sorted(set(keep)) != keep or keep[-1] >= len(stack) or keep[0] < 0:
        raise RequestError(f"layers to keep must be distinct ascending indices in 0..{len(stack) - 1}, got {keep}")
    fam = get_family(d.family)
    gone = [i for i in fam.pinned_layers if i not in keep]
    if gone:
        raise RequestError(f"a {d.family} drafter's layer(s) {gone} cannot be removed: {fam.note}")
    pre = path + "."
    sd = {}
    for k, v in _state(d).items():
        if not k.startswith(pre):
            sd[k] = v
            continue
        i, _, rest = k[len(pre):].partition(".")
        if int(i) in keep:
            sd[f"{pre}{keep.index(int(i))}.{rest}"] = v
    return _rebuild(d, dataclasses.replace(d.config, num_hidden_layers=len(keep)), sd)


def shrink_vocab(d: Drafter, target_ids: Tensor) -> Drafter:
    """eagle3: keep the draft tokens with target ids `target_ids` (each already in the draft vocab):
    their lm_head rows; d2t / t2d rebuilt (target id = draft id + d2t[draft id])."""
    if get_family(d.family).draft_vocab != "reduced":
        who = families_phrase(lambda f: f.draft_vocab == "reduced")
        raise RequestError(f"draft-vocabulary pruning is supported for {who} drafters, not {d.family}")
    v = d.config.vocab_size
    ids = torch.unique(torch.as_tensor(target_ids, dtype=torch.long).cpu())  # sorted, distinct
    if ids.numel() < 1 or int(ids[0]) < 0 or int(ids[-1]) >= v or not bool(d.t2d.cpu()[ids].all()):
        raise RequestError("the kept draft tokens must be target ids already in the drafter's draft vocabulary")
    old = d.to_target_ids(torch.arange(d.config.draft_vocab_size, device=d.d2t.device)).cpu()
    inv = torch.full((v,), -1, dtype=torch.long)
    inv[old] = torch.arange(old.numel())
    sd = _state(d)
    for key in ("lm_head.weight", "lm_head.up.weight"):  # a dense or low-rank head's rows; a shared head has none
        if key in sd:
            sd[key] = sd[key].index_select(0, inv[ids].to(sd[key].device))
    sd["d2t"] = (ids - torch.arange(ids.numel())).to(sd["d2t"].device)
    sd["t2d"] = torch.zeros(v, dtype=torch.bool).index_fill(0, ids, True).to(sd["t2d"].device)
    return _rebuild(d, dataclasses.replace(d.config, draft_vocab_size=int(ids.numel())), sd)


__all__ = ["slice_ffn", "slice_heads", "drop_layers", "shrink_vocab"]
