"""TensorRT-LLM's loading rules for what `export hf --for trtllm` writes, restated from its sources (GitHub
NVIDIA/TensorRT-LLM main, 2026; PyTorch backend; files relative to tensorrt_llm/) and run on our exports. Its
code needs CUDA and NVIDIA's package index (PyPI's tensorrt-llm is a stub), so nothing of it runs here.

- T1 quant_algo (quantization/mode.py QuantAlgo; _torch/modules/linear.py get_quant_method): the algorithm is a
  QuantAlgo name with a Linear method: FP8 -> FP8QDQ, FP8_PER_CHANNEL_PER_TOKEN -> FP8Rowwise, NVFP4 -> NVFP4,
  W8A16 -> WeightOnlyQuant, W4A16_AWQ -> W4A16_AWQ; W8A8_SQ_PER_CHANNEL has none ('unsupported quant mode').
- T2 names (_torch/models/modeling_speculative.py Eagle3ForCausalLM.load_weights): checkpoint names get `model.`
  (all but lm_head); q/k/v load into `model.midlayer.self_attn.qkv_proj` (WeightMode.FUSED_QKV_LINEAR), gate/up
  into `...mlp.gate_up_proj`; a plain HF LM keeps its names.
- T3 exclusion (_torch/models/modeling_utils.py apply_quant_config_exclude_modules,
  tensorrt_llm/models/modeling_utils.py QuantConfig.is_module_excluded_from_quantization): fnmatch on the runtime
  name; a fused layer is excluded when any of its shard names matches; lm_head takes no quant config at all.
- T4 what each method allocates and how it loads the checkpoint's tensors (_torch/modules/linear.py create_weights /
  load_weights_*): shapes and dtypes below, NVFP4's one weight_scale_2 / input_scale per fused layer (asserted),
  W4A16_AWQ's pre_quant_scale required on a plain Linear and not read for a fused one.
- T5 taps: llmapi/llm_args.py eagle3_layers_to_capture (layer outputs; default {1, L//2 - 1, L - 4}).
"""

from __future__ import annotations

import fnmatch
import json
import re

import pytest
import torch
from engines_common import L, drafter, quantized, saved_target, wide_target
from safetensors.torch import load_file

from specpress.errors import ConfigError, RequestError
from specpress.export.hf import export_hf
from specpress.models.drafter_io import load_drafter, save_drafter

QUANT_ALGOS = {"W8A16", "W4A16", "W4A16_AWQ", "W4A8_AWQ", "W8A16_GPTQ", "W4A16_GPTQ", "W8A8_SQ_PER_CHANNEL",
               "W8A8_SQ_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
               "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN", "W4A8_QSERVE_PER_GROUP",
               "W4A8_QSERVE_PER_CHANNEL", "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_BLOCK_SCALES", "INT8",
               "MIXED_PRECISION", "NVFP4", "W4A8_NVFP4_FP8", "W4A8_MXFP4_FP8", "W4A8_MXFP4_MXFP8", "W4A16_MXFP4",
               "NO_QUANT"}  # T1
METHOD = {"FP8": "FP8QDQ", "FP8_PER_CHANNEL_PER_TOKEN": "FP8Rowwise", "NVFP4": "NVFP4", "W8A16": "WeightOnlyQuant",
          "W4A16": "WeightOnlyQuant", "W4A16_AWQ": "W4A16_AWQ", "W4A8_AWQ": "W4A8_AWQ"}  # T1: get_quant_method
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def runtime_modules(family: str, layers: int) -> dict[str, list[str]]:
    """T2: TensorRT-LLM Linear name -> the checkpoint names it loads (lm_head excluded: never quantized)."""
    out: dict[str, list[str]] = {}
    for i in range(layers):
        ck = "midlayer" if family == "eagle3" else f"model.layers.{i}"
        rt = "model.midlayer" if family == "eagle3" else ck
        for fused, members in FUSED.items():
            sub = "self_attn" if fused == "qkv_proj" else "mlp"
            out[f"{rt}.{sub}.{fused}"] = [f"{ck}.{sub}.{m}" for m in members]
        out[f"{rt}.self_attn.o_proj"] = [f"{ck}.self_attn.o_proj"]
        out[f"{rt}.mlp.down_proj"] = [f"{ck}.mlp.down_proj"]
    if family == "eagle3":
        out["model.fc"] = ["fc"]
    return out


def excluded(name: str, patterns: list[str]) -> bool:
    """T3: the fused layer's shard names are candidates too; fnmatch (or a `re:` regex in newer sources)."""
    leaf = name.rpartition(".")[2]
    cands = [name] + [name.replace(leaf, m) for m in FUSED.get(leaf, ())]
    return any(re.fullmatch(p[3:], c) if p.startswith("re:") else fnmatch.fnmatchcase(c, p)
               for c in cands for p in patterns)


def load_linear(method: str, members: list[dict[str, torch.Tensor]], n: list[int], k: int, group: int | None):
    """T4: what the method allocates for a Linear of out_features sum(n), in_features k, and the checks and
    reshapes its loader applies to the checkpoint tensors of its members (KeyError / AssertionError where
    TensorRT-LLM's would fail). Returns {param: (shape, dtype)} as loaded."""
    N = sum(n)
    if method == "FP8QDQ":
        for m, rows in zip(members, n, strict=True):
            assert m["weight"].dtype == torch.float8_e4m3fn and tuple(m["weight"].shape) == (rows, k)
            assert m["weight_scale"].numel() == 1 and ("input_scale" not in m or m["input_scale"].numel() == 1)
        return {"weight": ((N, k), torch.float8_e4m3fn), "weight_scale": ((), torch.float32)}
    if method == "FP8Rowwise":
        scale = torch.cat([m["weight_scale"] for m in members])
        assert all(m["weight"].dtype == torch.float8_e4m3fn for m in members)
        return {"weight": ((N, k), torch.float8_e4m3fn), "weight_scale": (tuple(scale.shape), scale.dtype)}
    if method == "NVFP4":
        first = members[0]
        for m, rows in zip(members, n, strict=True):
            assert m["weight_scale"].dtype == torch.float8_e4m3fn and tuple(m["weight_scale"].shape) == (rows, k // 16)
            assert tuple(m["weight"].shape) == (rows, k // 2) and m["weight"].dtype == torch.uint8
            assert torch.equal(m["input_scale"], first["input_scale"]), "The input_scale should be same"
            assert torch.equal(m["weight_scale_2"], first["weight_scale_2"]), "The weight_scale_2 should be same"
        return {"weight": ((N, k // 2), torch.uint8), "alpha": ((1,), torch.float32)}
    if method == "WeightOnlyQuant":
        w = torch.cat([m["weight"] for m in members]).T  # (in_features, out_features) int8
        assert w.dtype == torch.int8 and tuple(w.shape) == (k, N)
        s = torch.cat([m["weight_scale"] for m in members])
        assert tuple(s.shape) == (N,)
        return {"weight": (tuple(w.shape), w.dtype), "weight_scale": (tuple(s.shape), s.dtype)}
    if method == "W4A16_AWQ":
        w = torch.cat([m["weight"] for m in members]).T.to(torch.int8)  # (in_features, out_features // 2)
        assert tuple(w.shape) == (k, N // 2)
        s = torch.cat([m["weight_scale"] for m in members]).T
        assert group is not None and k % group == 0 and tuple(s.shape) == (k // group, N)
        if len(members) == 1:  # load_weights_vanilla reads weights[0]["pre_quant_scale"]
            assert tuple(members[0]["pre_quant_scale"].shape) == (k,)
        return {"weight": (tuple(w.shape), w.dtype), "weight_scale": (tuple(s.shape), s.dtype)}
    raise AssertionError(f"no restated loader for {method}")


CELLS = ["fp8-dynamic", "fp8", "fp8-tensor-static", "nvfp4-static", "int4", "int4-awq", "int8"]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    t = wide_target()
    return t, saved_target(t, tmp_path_factory.mktemp("trt"))


def exported(family: str, cell: str | None, target_dir, tmp, **opts):
    t, tdir = target_dir
    d = quantized(family, cell, t, **opts)
    s = export_hf(save_drafter(d, tmp / "src"), tmp / "out", engine="trtllm", verifier=str(tdir))
    return d, s, load_file(str(s.out / "model.safetensors")), json.loads((s.out / "hf_quant_config.json")
                                                                          .read_text()) if cell else None


@pytest.mark.parametrize("family", ["eagle3", "lm"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("opts", [{}, {"exclude": ("down_proj",)}], ids=["all", "down-float"])
def test_trtllm_loads_every_linear_by_its_rules(family, cell, opts, target_dir, tmp_path):
    d, s, tensors, hq = exported(family, cell, target_dir, tmp_path, **opts)
    q = hq["quantization"]
    algo, group = q["quant_algo"], q.get("group_size")
    assert algo in QUANT_ALGOS and algo in METHOD, f"T1: {algo}"
    for name, members in runtime_modules(family, 1 if family == "eagle3" else 2).items():
        stored = [{k[len(m) + 1:]: v for k, v in tensors.items() if k.startswith(m + ".")} for m in members]
        is_q = ["weight_scale" in st for st in stored]
        assert len(set(is_q)) == 1, f"{name}: shards quantized in part"
        assert excluded(name, q["exclude_modules"]) != is_q[0], f"T3: {name} quantized={is_q[0]}, exclusion disagrees"
        if is_q[0]:
            n = [st["weight"].shape[0] * (2 if algo == "W4A16_AWQ" else 1) for st in stored]
            k = stored[0]["weight"].shape[1] * (2 if algo == "NVFP4" else 1)
            load_linear(METHOD[algo], stored, n, k, group)
    assert excluded("lm_head", q["exclude_modules"]) and "lm_head.weight_scale" not in tensors
    cfg = json.loads((s.out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_algo"] == algo


def test_awq_input_scales_are_folded_where_trtllm_reads_none(target_dir, tmp_path):
    """T4 W4A16_AWQ: a fused Linear's pre_quant_scale is not read, so it is folded into the norms before it
    (input_layernorm / hidden_norm for q/k/v; post_attention_layernorm for gate/up) and written as ones; a plain
    Linear keeps its own. The exported drafter, read back by specpress, computes what specpress measured."""
    t, _ = target_dir
    d, s, tensors, hq = exported("eagle3", "int4-awq", target_dir, tmp_path)
    for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
        key = next(k for k in tensors if k.endswith(f"{m}.pre_quant_scale"))
        assert torch.equal(tensors[key], torch.ones_like(tensors[key])), key
    for m in ("o_proj", "down_proj", "fc"):
        key = next(k for k in tensors if k.endswith(f"{m}.pre_quant_scale"))
        assert not torch.equal(tensors[key], torch.ones_like(tensors[key])), f"{key}: AWQ's scale lost"
    back = load_drafter(s.out, target=t)
    ids = torch.randint(1, 61, (1, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        feats = d.fuse_taps(t(ids, taps=d.taps).taps)
        mine, _ = d(feats[:, :-1], ids[:, 1:])
        theirs, _ = back(feats[:, :-1], ids[:, 1:])
    assert (mine - theirs).abs().max() <= 1e-4 * mine.abs().max()
    assert torch.equal(mine.argmax(-1), theirs.argmax(-1))


def test_rtn_int4_gets_the_pre_quant_scale_a_plain_linear_must_have(target_dir, tmp_path):
    """T4: load_weights_vanilla reads pre_quant_scale unconditionally: ones for int4 without AWQ (x · 1 = x)."""
    _, _, tensors, hq = exported("eagle3", "int4", target_dir, tmp_path)
    for m in ("o_proj", "down_proj", "fc"):
        key = next(k for k in tensors if k.endswith(f"{m}.pre_quant_scale"))
        assert torch.equal(tensors[key], torch.ones_like(tensors[key]))


@pytest.mark.parametrize("cell, opts, rule, error", [
    ("nvfp4", {}, "no W4A16_NVFP4 QuantAlgo", RequestError),  # TensorRT-LLM's rules
    ("mxfp8-dynamic", {}, "no MXFP8 QuantAlgo", RequestError),
    ("int8-smoothquant", {}, "unsupported quant mode", RequestError),
    ("int4", {"include": ("lm_head",)}, "lm_head Linear will not accept QuantConfig", RequestError),
    ("int8", {"exclude": ("k_proj",)}, "one fused Linear with one quantization scheme", RequestError),
    ("int4-asym", {}, "no zero points", ConfigError),  # the ModelOpt format's own rule
    ("ternary", {}, "has no encoding for a ternary", ConfigError),
], ids=["w4a16-nvfp4", "mxfp8", "smoothquant", "quantized-head", "split-qkv", "int4-asym", "low-bit"])
def test_what_trtllm_cannot_load_is_refused_with_its_rule(cell, opts, rule, error, target_dir, tmp_path):
    t, tdir = target_dir
    src = save_drafter(quantized("eagle3", cell, t, **opts), tmp_path / "src")
    with pytest.raises(error, match=rule):
        export_hf(src, tmp_path / "out", engine="trtllm", verifier=str(tdir))
    assert not (tmp_path / "out").exists()


def test_nvfp4_fused_shards_with_their_own_global_scale_are_refused(target_dir, tmp_path):
    """T4: NVFP4LinearMethod asserts one weight_scale_2 per fused layer. specpress shares it within q/k/v and
    gate/up when it quantizes; a drafter quantized otherwise (here: k_proj's scaled by hand) is refused."""
    from specpress.models.quantized.modules import quantized_modules

    t, tdir = target_dir
    d = quantized("eagle3", "nvfp4-static", t, exclude=("fc",))  # SGLang's fc is float
    mods = quantized_modules(d)
    assert len({float(mods[f"midlayer.self_attn.{m}_proj"].global_scale) for m in "qkv"}) == 1
    k = mods["midlayer.self_attn.k_proj"]
    k.global_scale.mul_(2)
    src = save_drafter(d, tmp_path / "src")
    for engine, rule in (("trtllm", "asserts one weight_scale_2"), ("vllm", "the max of the shards'"),
                         ("sglang", "the max of the shards'")):
        with pytest.raises(RequestError, match=f"{rule}.*weight_scale_2 differs across q_proj/k_proj/v_proj"):
            export_hf(src, tmp_path / engine, engine=engine, verifier=str(tdir))


def test_the_serve_config_sets_the_taps_trtllm_would_not_default_to(target_dir, tmp_path):
    """T5: eagle3_layers_to_capture is written only when the drafter's taps are not TensorRT-LLM's default."""
    t, tdir = target_dir
    default = export_hf(save_drafter(drafter("eagle3", t), tmp_path / "a"), tmp_path / "oa", engine="trtllm",
                        verifier=str(tdir))
    assert "eagle3_layers_to_capture" not in default.serve and "decoding_type: Eagle3" in default.serve
    assert sorted({1, L // 2 - 1, L - 4}) == sorted(j - 1 for j in drafter("eagle3", t).taps)
    other = export_hf(save_drafter(drafter("eagle3", t, target_layer_ids=(1, 3, 6)), tmp_path / "b"),
                      tmp_path / "ob", engine="trtllm", verifier=str(tdir))
    assert "'  eagle3_layers_to_capture: [0, 2, 5]'" in other.serve and f"trtllm-serve {tdir}" in other.serve


def test_eagle1_and_quantized_dflash_have_no_trtllm_route(target_dir, tmp_path):
    t, tdir = target_dir
    with pytest.raises(RequestError, match="registers EAGLE-3 draft models only"):
        export_hf(save_drafter(drafter("eagle", t), tmp_path / "e"), tmp_path / "oe", engine="trtllm")
    with pytest.raises(RequestError, match="_build_fused_kv_buffers"):
        export_hf(save_drafter(quantized("dflash", "fp8-dynamic", t), tmp_path / "d"), tmp_path / "od",
                  engine="trtllm", verifier=str(tdir))
    assert not (tmp_path / "oe").exists() and not (tmp_path / "od").exists()
