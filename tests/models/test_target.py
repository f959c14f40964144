"""The target matches transformers exactly: prefill, incremental decode, tree verify, cache ops."""

from __future__ import annotations

import json

import pytest
import torch

from specpress.errors import CheckpointError, ConfigError, RequestError
from specpress.models.layers import causal_mask
from specpress.models.target import load_target
from target_common import TREE_PARENTS, assert_tree_verify, path_to, tree_inputs  # noqa: F401

TOL = 1e-4

VARIANTS = {
    "llama-gqa-untied": ("llama", {}),
    "llama-tied-bias": ("llama", {"tie_word_embeddings": True, "attention_bias": True}),
    "llama-llama3-rope": ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 32}}),
    "llama-linear-rope": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}),
    "llama-yarn-rope": ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                                       "original_max_position_embeddings": 32}}),
    "mistral": ("mistral", {"sliding_window": None}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"head_dim": 24}),
}


def hf_logits(hf, ids):
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0], out.hidden_states


@pytest.fixture(params=list(VARIANTS))
def pair(request, hf_dir_factory):
    arch, kw = VARIANTS[request.param]
    hf, path = hf_dir_factory(arch, **kw)
    return hf, load_target(path)


def test_prefill_logits_and_taps_match_transformers(pair):
    hf, ours = pair
    ids = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    ref, ref_hidden = hf_logits(hf, ids)
    n = ours.config.num_hidden_layers
    with torch.no_grad():
        out = ours(torch.tensor([ids]), taps=range(n + 1))
    assert (out.logits[0] - ref).abs().max() < TOL
    for i in range(n + 1):
        assert (out.taps[i][0] - ref_hidden[i][0]).abs().max() < TOL, f"tap {i}"
    assert ref.abs().max() > 0.5, "weights too small for the comparison to mean anything"


def test_incremental_decode_matches_full_forward(pair):
    hf, ours = pair
    ids = torch.randint(0, 97, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    ref, _ = hf_logits(hf, ids)
    cache = ours.new_cache(64)
    with torch.no_grad():
        first = ours(torch.tensor([ids[:20]]), cache=cache)
        steps = [ours(torch.tensor([[t]]), cache=cache).logits[0, -1] for t in ids[20:]]
    assert (first.logits[0] - ref[:20]).abs().max() < TOL
    assert (torch.stack(steps) - ref[20:]).abs().max() < TOL
    assert cache.length == 30


def test_tree_verify_equals_each_path_from_scratch(pair):
    hf, ours = pair
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 97, (12,), generator=g).tolist()
    nodes = torch.randint(0, 97, (len(TREE_PARENTS),), generator=g).tolist()
    cache = ours.new_cache(64)
    mask, pos = tree_inputs(TREE_PARENTS, len(prompt))
    with torch.no_grad():
        ours(torch.tensor([prompt]), cache=cache)
        tree = ours(torch.tensor([nodes]), cache=cache, positions=pos, mask=mask).logits[0]
    for leaf in range(len(nodes)):
        path = path_to(TREE_PARENTS, leaf)
        ref, _ = hf_logits(hf, prompt + [nodes[i] for i in path])
        assert (tree[leaf] - ref[-1]).abs().max() < TOL, f"node {leaf} path {path}"


def test_compact_and_crop_equal_fresh_prefill(pair):
    _, ours = pair
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 97, (10,), generator=g).tolist()
    nodes = torch.randint(0, 97, (len(TREE_PARENTS),), generator=g).tolist()
    cache = ours.new_cache(64)
    mask, pos = tree_inputs(TREE_PARENTS, len(prompt))
    with torch.no_grad():
        ours(torch.tensor([prompt]), cache=cache)
        ours(torch.tensor([nodes]), cache=cache, positions=pos, mask=mask)
        keep = path_to(TREE_PARENTS, 7)  # 0 -> 2 -> 5 -> 7
        cache.compact(len(prompt), keep)
        fresh = ours.new_cache(64)
        ours(torch.tensor([prompt + [nodes[i] for i in keep]]), cache=fresh)
    n = len(prompt) + len(keep)
    assert cache.length == fresh.length == n
    assert torch.allclose(cache.k[:, :, :, :n], fresh.k[:, :, :, :n], atol=1e-5)
    assert torch.allclose(cache.v[:, :, :, :n], fresh.v[:, :, :, :n], atol=1e-5)
    cache.crop(len(prompt) + 1)
    shorter = ours.new_cache(64)
    with torch.no_grad():
        ours(torch.tensor([prompt + [nodes[0]]]), cache=shorter)
    m = len(prompt) + 1
    assert cache.length == m
    assert torch.allclose(cache.k[:, :, :, :m], shorter.k[:, :, :, :m], atol=1e-5)
    with pytest.raises(ValueError):
        cache.crop(m + 1)


def test_causal_mask_shape_and_content():
    m = causal_mask(3, 2)
    assert m.shape == (3, 5)
    assert m[:, :2].all() and m[0, 3:].sum() == 0 and m[2, 2:].all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_loads_and_runs_close(hf_dir_factory, dtype):
    hf, path = hf_dir_factory("llama")
    ours = load_target(path, dtype=dtype)
    assert ours.lm_head.weight.dtype == dtype
    ids = list(range(1, 20))
    ref, _ = hf_logits(hf, ids)
    with torch.no_grad():
        out = ours(torch.tensor([ids])).logits[0].float()
    rel = (out - ref).norm() / ref.norm()
    assert rel < 0.05


# ---------------------------------------------------------------------------------- bad input


def test_missing_dir_is_clear(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_target(tmp_path / "nope")


def test_corrupt_config(hf_dir_factory):
    _, path = hf_dir_factory("llama")
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        load_target(path)


def test_unsupported_architecture(hf_dir_factory):
    _, path = hf_dir_factory("llama")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="GPT2LMHeadModel.*not supported"):
        load_target(path)


def test_unsupported_rope(hf_dir_factory):
    _, path = hf_dir_factory("llama")
    cfg = json.loads((path / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="dynamic"):
        load_target(path)


def _rewrite_weights(path, fn):
    from safetensors.torch import load_file, save_file
    sd = load_file(str(path / "model.safetensors"))
    fn(sd)
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_missing_tensor_named(hf_dir_factory):
    _, path = hf_dir_factory("llama")
    _rewrite_weights(path, lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match="model.layers.1.mlp.up_proj.weight"):
        load_target(path)


def test_misshaped_tensor_named(hf_dir_factory):
    _, path = hf_dir_factory("llama")
    _rewrite_weights(path, lambda sd: sd.__setitem__("model.norm.weight", torch.ones(5)))
    with pytest.raises(CheckpointError, match=r"model.norm.weight.*\(5,\)"):
        load_target(path)


def test_nan_weights_refused(hf_dir_factory):
    _, path = hf_dir_factory("llama")

    def poison(sd):
        sd["model.layers.0.self_attn.q_proj.weight"][0, 0] = float("nan")

    _rewrite_weights(path, poison)
    with pytest.raises(CheckpointError, match="NaN"):
        load_target(path)


def test_corrupt_safetensors(hf_dir_factory):
    _, path = hf_dir_factory("llama")
    (path / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_target(path)


def test_sharded_checkpoint_loads(hf_dir_factory, tmp_path):
    hf, _ = hf_dir_factory("llama")
    out = tmp_path / "sharded"
    hf.save_pretrained(out, max_shard_size="50KB")
    assert (out / "model.safetensors.index.json").exists()
    ours = load_target(out)
    ids = list(range(5, 25))
    ref, _ = hf_logits(hf, ids)
    with torch.no_grad():
        assert (ours(torch.tensor([ids])).logits[0] - ref).abs().max() < TOL


def test_cache_overflow_is_usage_error(hf_dir_factory):
    _, path = hf_dir_factory("llama")
    ours = load_target(path)
    with pytest.raises(RequestError, match="context"):
        ours.new_cache(10_000)
