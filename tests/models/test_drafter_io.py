"""Drafter artifacts: save/load round trips in the public layouts, public configs from the ecosystems
(EAGLE-3, SpecForge DFlash, EAGLE-1, DeepSeek-style MTP), inspect counts, and target mismatches."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafters_common import CONFIGS, FAMILIES, IDS, SHAPE, F, H, L, V, make, run, tiny_target
from specpress.errors import CheckpointError, ConfigError
from specpress.models.drafter_io import load_drafter, read_drafter_config, save_drafter
from specpress.models.inspect import inspect_artifact
from specpress.models.target import TargetConfig, TargetModel


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return tiny_target()


# ------------------------------------------------------------------------------------ save / load

PUBLIC_KEYS = {
    "eagle": {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.o_proj.weight",
              "layers.0.mlp.gate_proj.weight", "layers.0.post_attention_layernorm.weight"},
    "eagle3": {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.mlp.down_proj.weight",
               "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
               "midlayer.post_attention_layernorm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"},
    "mtp": {f"model.layers.{L}.{k}" for k in ("enorm.weight", "hnorm.weight", "eh_proj.weight",
                                              "shared_head.norm.weight", "self_attn.q_proj.weight",
                                              "mlp.up_proj.weight", "input_layernorm.weight",
                                              "post_attention_layernorm.weight")},
    "dflash": {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.q_norm.weight",
               "layers.1.self_attn.k_norm.weight", "layers.0.input_layernorm.weight", "layers.0.mlp.gate_proj.weight"},
    "lm": {"model.embed_tokens.weight", "model.layers.1.self_attn.k_proj.weight", "model.norm.weight",
           "lm_head.weight"},
}
PUBLIC_CONFIG = {
    "eagle": {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "bias": True},
    "eagle3": {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 24},
    "mtp": {"num_hidden_layers": L, "num_nextn_predict_layers": 1},
    "dflash": {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 4,
               "num_target_layers": L, "num_hidden_layers": 2,
               "dflash_config": {"mask_token_id": 0, "target_layer_ids": [1, 5]}},
    "lm": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2},
}


@pytest.mark.parametrize("family", FAMILIES)
def test_save_load_round_trip_public_layout(family, target, tmp_path):
    d = make(family, target)
    steps = [{"step": "prune", "config": {"ffn": 0.5}}]
    out = save_drafter(d, tmp_path / family, provenance=steps)
    keys = set(load_file(str(out / "model.safetensors")))
    assert PUBLIC_KEYS[family] <= keys, PUBLIC_KEYS[family] - keys
    assert not {"embed_tokens.weight", f"model.layers.{L}.embed_tokens.weight"} & keys  # shared, not stored
    if family == "eagle":
        assert "layers.0.input_layernorm.weight" not in keys
    cfg = json.loads((out / "config.json").read_text())
    for k, v in PUBLIC_CONFIG[family].items():
        assert cfg[k] == v, k
    assert cfg["specpress"]["family"] == family and cfg["specpress"]["steps"] == steps
    assert cfg["specpress"]["target"]["hidden_size"] == H

    back = load_drafter(out, target)
    assert type(back) is type(d) and back.config == d.config and back.provenance == tuple(steps)
    assert torch.equal(run(back, target), run(d, target))


def test_lm_drafter_loads_in_transformers(target, tmp_path):
    transformers = pytest.importorskip("transformers")
    d = make("lm", target)
    out = save_drafter(d, tmp_path / "lm")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        ref = hf(IDS).logits
    assert (ref - run(d, target)).abs().max() < 1e-4


def test_include_shared_writes_the_target_tensors_and_load_drops_them(target, tmp_path):
    d = make("eagle", target)
    out = save_drafter(d, tmp_path / "e", include_shared=True)
    sd = load_file(str(out / "model.safetensors"))
    assert torch.equal(sd["embed_tokens.weight"], target.model.embed_tokens.weight)
    assert torch.equal(run(load_drafter(out, target), target), run(d, target))
    info = inspect_artifact(out)
    assert info["shared_bytes"] == 2 * V * H * 4


def test_nan_weights_refused(target, tmp_path):
    out = save_drafter(make("eagle3", target), tmp_path / "e3")
    sd = load_file(str(out / "model.safetensors"))
    sd["fc.weight"][0, 0] = float("nan")
    save_file(sd, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match="NaN"):
        load_drafter(out, target)


def test_missing_tensor_named(target, tmp_path):
    out = save_drafter(make("dflash", target), tmp_path / "df")
    sd = load_file(str(out / "model.safetensors"))
    del sd["layers.1.mlp.up_proj.weight"]
    save_file(sd, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"layers\.1\.mlp\.up_proj\.weight"):
        load_drafter(out, target)


# ------------------------------------------------------------------------------------ public configs

EAGLE3_LLAMA31_8B = {  # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 2048,
    "model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1,
    "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 128256, "draft_vocab_size": 32000,
}
QWEN3_8B_DFLASH = {  # SpecForge configs/qwen3-8b-dflash.json (+ the dflash_config it writes on export)
    "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": 16, "bos_token_id": 151643,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}, "dtype": "bfloat16",
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12288, "layer_types": ["full_attention"] * 5, "max_position_embeddings": 40960,
    "max_window_layers": 5, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 5,
    "num_key_value_heads": 8, "num_target_layers": 36, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False, "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
LLAMA31_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
              "vocab_size": 128256, "rms_norm_eps": 1e-5, "model_type": "llama", "torch_dtype": "bfloat16"}


def write_cfg(path, cfg):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("name,cfg,family,published", [
    ("eagle", {**LLAMA31_8B, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "bias": True},
     "eagle", 251.7e6),
    ("eagle3", EAGLE3_LLAMA31_8B, "eagle3", 424.7e6),
    ("mtp", {**LLAMA31_8B, "num_hidden_layers": 32, "num_nextn_predict_layers": 1}, "mtp", 251.7e6),
    ("dflash-llama", {**LLAMA31_8B, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5,
                      "num_target_layers": 32, "block_size": 10}, "dflash", 1.17e9),
    ("dflash-qwen3", QWEN3_8B_DFLASH, "dflash", 1.05e9),
])
def test_published_8b_configs_inspect_on_meta(name, cfg, family, published, tmp_path):
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(cfg))
    info = inspect_artifact(f)
    assert info["family"] == family and info["bytes_source"] == "dtype"
    assert abs(info["params"] - published) / published < 0.005, info["params"]
    assert info["bytes"] >= 2 * info["params"]


def test_target_config_inspects_as_target(tmp_path):
    f = write_cfg(tmp_path / "t", {**LLAMA31_8B, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32})
    info = inspect_artifact(f / "config.json")
    assert info["family"] == "target" and abs(info["params"] - 8.03e9) / 8.03e9 < 0.005


def scaled(public: dict, **dims) -> dict:
    return {**public, **dims}


def test_public_eagle3_checkpoint_loads_without_edits(target, tmp_path):
    """The EAGLE3-LLaMA3.1-8B config layout (scaled down) with weights as such repos ship them:
    no t2d (ModelOpt/vLLM), and an embed_tokens copy that must be ignored."""
    d = make("eagle3", target)
    cfg = scaled(EAGLE3_LLAMA31_8B, hidden_size=H, intermediate_size=F, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=V, draft_vocab_size=24, rms_norm_eps=1e-5)
    path = write_cfg(tmp_path / "e3", cfg)
    sd = {k: v for k, v in d.state_dict().items() if k != "t2d"}
    sd["embed_tokens.weight"] = torch.randn(V, H)
    save_file(sd, str(path / "model.safetensors"))
    back = load_drafter(path, target)
    assert back.family == "eagle3" and back.taps == (2, 4, 5) and torch.equal(back.t2d, d.t2d)
    assert torch.equal(run(back, target), run(d, target))


def test_public_dflash_checkpoint_loads_without_edits(target, tmp_path):
    d = make("dflash", target)
    cfg = scaled(QWEN3_8B_DFLASH, hidden_size=H, intermediate_size=F, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=8, vocab_size=V, num_hidden_layers=2, num_target_layers=L, block_size=4,
                 rms_norm_eps=1e-5, rope_theta=10000.0, layer_types=["full_attention"] * 2,
                 dflash_config={"mask_token_id": 0, "target_layer_ids": [1, 5]})
    path = write_cfg(tmp_path / "df", cfg)
    save_file(dict(d.state_dict()), str(path / "model.safetensors"))
    back = load_drafter(path, target)  # auto_map present: ignored, nothing imported or executed
    assert back.family == "dflash" and back.config.mask_token_id == 0
    assert torch.equal(run(back, target), run(d, target))


def test_dflash_config_without_dflash_block_uses_defaults(tmp_path):
    cfg = {k: v for k, v in QWEN3_8B_DFLASH.items() if k != "dflash_config"}
    f = tmp_path / "c.json"
    f.write_text(json.dumps(cfg))
    family, config, _ = read_drafter_config(f)
    assert family == "dflash" and config.target_layer_ids == (1, 9, 17, 25, 33) and config.mask_token_id is None


def test_public_eagle1_checkpoint_loads(target, tmp_path):
    d = make("eagle", target)
    cfg = {**SHAPE, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
           "rms_norm_eps": 1e-5, "bias": True}
    path = write_cfg(tmp_path / "e1", cfg)
    save_file({**d.state_dict(), "embed_tokens.weight": torch.randn(V, H)}, str(path / "model.safetensors"))
    back = load_drafter(path, target)
    assert back.family == "eagle" and torch.equal(run(back, target), run(d, target))


def test_eagle3_tap_conventions_in_config(tmp_path):
    base = scaled(EAGLE3_LLAMA31_8B, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 15, 28]})
    f = tmp_path / "c.json"
    f.write_text(json.dumps(base))
    assert read_drafter_config(f)[1].target_layer_ids == (2, 16, 29)  # SGLang: output of layer j
    f.write_text(json.dumps({**EAGLE3_LLAMA31_8B, "eagle_aux_hidden_state_layer_ids": [2, 16, 29]}))
    assert read_drafter_config(f)[1].target_layer_ids == (2, 16, 29)  # vLLM: input of layer j
    f.write_text(json.dumps({**base, "eagle_aux_hidden_state_layer_ids": [1, 15, 28]}))
    with pytest.raises(ConfigError, match="disagree"):
        read_drafter_config(f)


# ------------------------------------------------------------------------------------ counts


def hand_count(family: str) -> int:
    nq, nkv, d = 4, 2, H // 4
    attn = H * nq * d + 2 * H * nkv * d + nq * d * H
    mlp = 3 * H * F
    if family == "eagle":
        return 2 * H * H + H + attn + mlp + H
    if family == "eagle3":
        return 3 * H * H + 2 * attn - nq * d * H + mlp + 3 * H + H + H * 24  # q/k/v read 2H
    if family == "mtp":
        return 2 * H * H + attn + mlp + 2 * H + 3 * H
    if family == "dflash":
        return 2 * H * H + H + 2 * (attn + 2 * d + mlp + 2 * H) + H
    c = CONFIGS["lm"]
    h, f, dd = c.hidden_size, c.intermediate_size, c.head_dim
    layer = h * 2 * dd + 2 * h * 1 * dd + 2 * dd * h + 3 * h * f + 2 * h
    return 2 * V * h + 2 * layer + h


@pytest.mark.parametrize("family", FAMILIES)
def test_inspect_counts_match_hand_counts(family, target, tmp_path):
    d = make(family, target)
    assert sum(p.numel() for p in d.parameters()) == hand_count(family)
    out = save_drafter(d, tmp_path / family, provenance=[{"step": "quantize"}])
    with_weights = inspect_artifact(out)
    assert with_weights["params"] == hand_count(family) and with_weights["bytes_source"] == "weights"
    buffers = (24 * 8 + V) if family == "eagle3" else 0  # d2t int64, t2d bool
    assert with_weights["bytes"] == 4 * hand_count(family) + buffers
    assert with_weights["provenance"] == [{"step": "quantize"}] and with_weights["dtype"] == "float32"
    (out / "model.safetensors").unlink()
    meta = inspect_artifact(out / "config.json")
    assert meta["params"] == hand_count(family) and meta["bytes"] == with_weights["bytes"]


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("family", ["eagle", "eagle3", "mtp", "dflash"])
def test_dims_mismatch_with_target_is_clear(family, tmp_path):
    small = TargetModel(TargetConfig(**{**SHAPE, "hidden_size": 24}, num_hidden_layers=L))
    other_layers = TargetModel(TargetConfig(**SHAPE, num_hidden_layers=6))
    big = TargetModel(TargetConfig(**SHAPE, num_hidden_layers=L))
    out = save_drafter(make(family, big), tmp_path / family)
    with pytest.raises(CheckpointError, match=r"hidden_size.*32.*24"):
        load_drafter(out, small)
    if family in ("mtp", "dflash"):
        with pytest.raises(CheckpointError, match="num_hidden_layers"):
            load_drafter(out, other_layers)


def test_unknown_public_layout_is_clear(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 8}))
    with pytest.raises(ConfigError, match="cannot tell which drafter family.*known families"):
        inspect_artifact(f)


@pytest.mark.parametrize("cfg, field", [({"architectures": [["Eagle3"]]}, "architectures"),
                                        ({"architectures": {"0": "x"}}, "architectures"),
                                        ({"architectures": "LlamaForCausalLM"}, "architectures"),
                                        ({"architectures": ["LlamaForCausalLM"], "model_type": ["llama"]},
                                         "model_type")])
def test_detection_refuses_malformed_identity_fields_by_name(cfg, field):
    """A list or dict where a name belongs was a TypeError / KeyError from deep inside detection."""
    from specpress.models.drafter_io import detect_family

    with pytest.raises(ConfigError, match=f"config.json: '{field}' must be"):
        detect_family(cfg)
