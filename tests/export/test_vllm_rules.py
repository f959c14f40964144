"""vLLM's loading rules for what `export hf --for vllm` writes, read from vLLM 0.34.0 (files relative to vllm/).

vLLM builds its drafter only on a GPU, so what needs one is restated here, each rule citing its file:

- R1 module names: draft decoder layers are numbered after the target's depth, `model.layers.{L + i}`
  (model_executor/models/llama_eagle3.py, llama_eagle.py, qwen3_dflash.py: start_layer_id = the target's layer
  count); `fc` is `model.fc`, a ReplicatedLinear with the draft's quantization config; an independent LM (method
  draft_model) keeps its own names. The EAGLE-3 head is a ParallelLMHead that takes the quantization config.
- R2 fused Linears (model_executor/models/llama.py packed_modules_mapping): q/k/v -> qkv_proj (QKVParallelLinear),
  gate/up -> gate_up_proj (MergedColumnParallelLinear); o_proj, down_proj: RowParallelLinear.
- R5 tap count: `fc` takes target_hidden_size x the number of taps in transformer_layer_config.eagle_config
  (llama_eagle3.py LlamaModel: num_aux_hidden_states, else eagle_config's list, else 3).
- R6 what each compressed-tensors scheme allocates per shard of out_features n (model_executor/layers/quantization/
  compressed_tensors/schemes/*.py create_weights; the weight loader copies each checkpoint tensor into its shard's
  slice, casting floats, so codes must match in dtype and every tensor in shape): WNA16 weight_packed int32
  [n, K*bits/32], weight_scale [n, K/G], weight_zero_point int32 [n*bits/32, K/G], weight_shape int64 [2];
  W8A8Int8 weight int8 [n, K], weight_scale [n, 1] (channel) or one per shard, input_scale one; W8A8Fp8 /
  W8A16Fp8 weight e4m3 [n, K], weight_scale [n, 1] or one per shard, input_scale one; NVFP4 weight_packed uint8
  [n, K/2], weight_scale e4m3 [n, K/16], weight_global_scale / input_global_scale one per shard; MXFP8 weight e4m3
  [n, K], weight_scale uint8 [n, K/32]; MXFP4 weight_packed uint8 [n, K/2], weight_scale uint8 [n, K/32].
  (These run only with a GPU kernel picked: create_weights fails on CPU, so they are restated.)

What runs on CPU is vLLM's own code, in the side interpreter (tests/export/side.py; marked `speculators`):
its compressed-tensors matching (quantization/compressed_tensors/utils.py should_ignore_layer,
find_matched_target) and scheme selection (compressed_tensors.py get_scheme, _get_scheme_from_parts and its
format predicates) on our quantization_config for every vLLM module name of R1/R2; its speculators config
conversion (transformers_utils/configs/speculators/base.py + algos.py) on our config.json; and its refusal of a
local verifier path (transformers_utils/config.py maybe_override_with_speculators). The same matching is also
run through compressed-tensors' own `is_match` (0.20.1, the project's env) on every run.
"""

from __future__ import annotations

import json

import pytest
import torch
from engines_common import quantized, saved_target, wide_target
from safetensors.torch import load_file
from side import run_side
from torch import nn

from specpress.errors import ConfigError
from specpress.export.hf import export_hf
from specpress.models.drafter_io import save_drafter

ct_match = pytest.importorskip("compressed_tensors.utils.match")  # the `serving` extra
FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}  # R2


class LinearBase(nn.Module):  # stand-ins named as vLLM's layer classes (model_executor/layers/linear.py)
    pass


class QKVParallelLinear(LinearBase):
    pass


class MergedColumnParallelLinear(LinearBase):
    pass


class RowParallelLinear(LinearBase):
    pass


class ReplicatedLinear(LinearBase):
    pass


class ParallelLMHead(nn.Module):  # a VocabParallelEmbedding, not a LinearBase
    pass


def vllm_modules(family: str, depth: int, layers: int = 1, head: bool = False) -> dict[str, tuple[str, list[str]]]:
    """R1 + R2: vLLM module name -> (its class, the checkpoint names it loads), for a drafter of `family` whose
    target has `depth` layers."""
    ckpt = {"eagle3": "layers.{i}", "dflash": "layers.{i}", "eagle": "layers.{i}", "lm": "model.layers.{i}"}[family]
    out: dict[str, tuple[str, list[str]]] = {}
    for i in range(layers):
        p = f"model.layers.{i if family == 'lm' else depth + i}"
        c = ckpt.format(i=i)
        out[f"{p}.self_attn.qkv_proj"] = ("QKVParallelLinear", [f"{c}.self_attn.{s}" for s in FUSED["qkv_proj"]])
        out[f"{p}.self_attn.o_proj"] = ("RowParallelLinear", [f"{c}.self_attn.o_proj"])
        out[f"{p}.mlp.gate_up_proj"] = ("MergedColumnParallelLinear", [f"{c}.mlp.{s}" for s in FUSED["gate_up_proj"]])
        out[f"{p}.mlp.down_proj"] = ("RowParallelLinear", [f"{c}.mlp.down_proj"])
    if family in ("eagle3", "dflash", "eagle"):
        out["model.fc"] = ("ReplicatedLinear", ["fc"])
    if head:
        out["lm_head"] = ("ParallelLMHead", ["lm_head"])
    return out


LAYERS = {"eagle3": 1, "dflash": 2, "eagle": 1, "lm": 2}
STANDIN = {c.__name__: c for c in (QKVParallelLinear, MergedColumnParallelLinear, RowParallelLinear, ReplicatedLinear,
                                   ParallelLMHead)}


def quantized_names(tensors) -> set[str]:
    keys = (".weight_packed", ".weight_scale")
    return {k.rpartition(".")[0] for k in tensors if k.endswith(keys)}


# (family, cell, target depth, quantize options): the exports the rules are run on
CASES = [("eagle3", c, 8, {}) for c in ("int4", "int4-asym", "int8", "int8-asym", "int8-dynamic", "int8-static", "fp8",
                                       "fp8-dynamic", "fp8-static", "fp8-tensor-static", "nvfp4", "nvfp4-static",
                                       "mxfp8", "mxfp8-dynamic", "mxfp4", "int2", "int2-asym", "ternary")] + [
    ("eagle3", "int4", 8, {"exclude": ("fc", "down_proj")}), ("eagle3", "int8", 8, {"include": ("lm_head",)}),
    ("dflash", "int4", 8, {}), ("dflash", "fp8-dynamic", 8, {"exclude": ("fc",)}), ("eagle", "int8", 8, {}),
    ("lm", "nvfp4", 8, {}), ("lm", "int4", 8, {"exclude": ("down_proj",)})]
IDS = [f"{f}-{c}-L{d}" + ("-" + "-".join(f"{k}_{'_'.join(v)}" for k, v in o.items()) if o else "")
       for f, c, d, o in CASES]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """id -> (family, the export's config.json, its tensors, its directory, the target depth)."""
    tmp = tmp_path_factory.mktemp("vllm")
    target = wide_target()
    tdir = saved_target(target, tmp)
    out = {}
    for key, (family, cell, depth, opts) in zip(IDS, CASES, strict=True):
        d = quantized(family, cell, target, **opts)
        src = save_drafter(d, tmp / f"{key}-src")
        e = export_hf(src, tmp / key, engine="vllm", verifier=str(tdir)).out
        out[key] = (family, json.loads((e / "config.json").read_text()), load_file(str(e / "model.safetensors")), e,
                    depth)
    return out


@pytest.mark.parametrize("key", IDS)
def test_compressed_tensors_is_match_takes_every_quantized_linear_and_ignores_every_float_one(key, exports):
    """R1-R2 names through compressed-tensors 0.20.1's own is_match (what vLLM's loader is built on)."""
    family, cfg, tensors, _, depth = exports[key]
    q = cfg["quantization_config"]
    (group,) = q["config_groups"].values()
    stored_q = quantized_names(tensors)
    assert stored_q, "nothing was quantized"
    for name, (cls, shards) in vllm_modules(family, depth, LAYERS[family], "lm_head" in stored_q).items():
        quantized_shards = {s in stored_q for s in shards}
        assert len(quantized_shards) == 1, f"{name}: shards {shards} quantized in part"
        says = ct_match.is_match(name, STANDIN[cls](), group["targets"], q["ignore"], fused=FUSED)
        assert says == quantized_shards.pop(), f"{name}: compressed-tensors' is_match says {says}"


def vllm_allocates(cfg: dict, n: int, k: int) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """R6: the shard tensors vLLM's scheme for this config group expects (dtype None: any float, cast on load)."""
    import math

    (g,) = [v for v in cfg["quantization_config"]["config_groups"].values()]
    w, a, fmt = g["weights"], g.get("input_activations"), g["format"]
    one = ((1,), None)
    if fmt == "pack-quantized":
        bits, gs = w["num_bits"], w.get("group_size") or k
        out = {"weight_packed": ((n, math.ceil(k * bits / 32)), torch.int32), "weight_scale": ((n, k // gs), None),
               "weight_shape": ((2,), torch.int64)}
        if not w["symmetric"]:
            out["weight_zero_point"] = ((math.ceil(n * bits / 32), k // gs), torch.int32)
        return out
    if fmt == "nvfp4-pack-quantized":
        out = {"weight_packed": ((n, k // 2), torch.uint8), "weight_scale": ((n, k // 16), torch.float8_e4m3fn),
               "weight_global_scale": one}
        return out | ({"input_global_scale": one} if a else {})
    if fmt in ("mxfp8-quantized", "mxfp4-pack-quantized"):
        key, shape, dt = ("weight", (n, k), torch.float8_e4m3fn) if fmt == "mxfp8-quantized" else \
            ("weight_packed", (n, k // 2), torch.uint8)
        return {key: (shape, dt), "weight_scale": ((n, k // 32), torch.uint8)}
    code = torch.int8 if w["type"] == "int" else torch.float8_e4m3fn
    scale = ((n, 1), None) if w["strategy"] == "channel" else one
    out = {"weight": ((n, k), code), "weight_scale": scale}
    return out | ({"input_scale": one} if a and not a.get("dynamic") else {})


@pytest.mark.parametrize("key", IDS)
def test_each_shard_fits_what_vllm_allocates_for_it(key, exports):
    """R6 on every quantized Linear of every export, as a shard of its fused layer (R2)."""
    family, cfg, tensors, _, depth = exports[key]
    stored_q = quantized_names(tensors)
    for name in sorted(stored_q):
        mine = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}
        if "weight_shape" in mine:
            n, k = (int(x) for x in mine["weight_shape"])
        else:
            w = mine.get("weight", mine.get("weight_packed"))
            n, k = w.shape[0], w.shape[1] * (2 if w.dtype == torch.uint8 else 1)
        want = vllm_allocates(cfg, n, k)
        assert set(want) == set(mine) - {"bias"}, f"{name}: vLLM expects {sorted(want)}, stored {sorted(mine)}"
        for t, (shape, dtype) in want.items():
            got = mine[t]
            assert tuple(got.shape) == shape or (shape == (1,) and got.numel() == 1), f"{name}.{t}: {tuple(got.shape)}"
            assert (dtype is None and got.is_floating_point() and got.element_size() >= 2) or got.dtype == dtype, \
                f"{name}.{t}: {got.dtype}"


@pytest.mark.parametrize("taps", [(2, 5), (1, 3, 4, 6)], ids=["2-taps", "4-taps"])
def test_vllm_sizes_fc_for_the_drafters_taps(taps, tmp_path):
    """R5: a drafter with 2 or 4 taps gets an fc vLLM allocates at its stored shape."""
    from engines_common import drafter

    target = wide_target()
    d = drafter("eagle3", target, target_layer_ids=taps)
    out = export_hf(save_drafter(d, tmp_path / "src"), tmp_path / "out", engine="vllm",
                    verifier=str(saved_target(target, tmp_path))).out
    cfg = json.loads((out / "config.json").read_text())
    ids = (cfg["transformer_layer_config"].get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    count = len(ids) if ids else 3
    assert cfg["eagle_aux_hidden_state_layer_ids"] == list(taps)
    assert load_file(str(out / "model.safetensors"))["fc.weight"].shape == (d.config.hidden_size,
                                                                           cfg["target_hidden_size"] * count)


def test_a_per_layer_choice_is_refused_where_the_config_cannot_name_it(tmp_path):
    """The ignore list names modules without their layer index (R1 renumbers draft layers): a module float in
    one DFlash layer and quantized in the other cannot be written."""
    target = wide_target()
    d = quantized("dflash", "int8", target, exclude=("layers.1.mlp.down_proj",))
    with pytest.raises(ConfigError, match=r"down_proj.*some decoder layers and float in others"):
        export_hf(save_drafter(d, tmp_path / "src"), tmp_path / "out", engine="vllm",
                  verifier=str(saved_target(target, tmp_path)))
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- vLLM's own code

SIDE = r"""
import json, sys, types, warnings
import torch
from torch import nn
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.quantization.compressed_tensors import compressed_tensors as ctmod
from vllm.model_executor.layers.quantization.compressed_tensors.utils import find_matched_target, should_ignore_layer
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
from vllm.transformers_utils.config import maybe_override_with_speculators

payload = torch.load(sys.argv[1], weights_only=False)
fused = dict(LlamaForCausalLM.packed_modules_mapping)
classes = {}
for n in ("QKVParallelLinear", "MergedColumnParallelLinear", "RowParallelLinear", "ReplicatedLinear"):
    import vllm.model_executor.layers.linear as lin
    classes[n] = getattr(lin, n)
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
classes["ParallelLMHead"] = ParallelLMHead

def bare(cls):  # an instance of vLLM's class without its (GPU-bound) __init__: the matchers read the class name
    m = cls.__new__(cls)
    nn.Module.__init__(m)
    return m

# the schemes' constructors read only the model dtype from the current config (and pick GPU kernels: NVFP4 / MXFP4)
vc = VllmConfig(device_config=DeviceConfig(device="cpu"))
object.__setattr__(vc, "model_config", types.SimpleNamespace(dtype=torch.bfloat16, quantization_config=None))
C = ctmod.CompressedTensorsConfig
out = {}
with set_current_vllm_config(vc):
    for key, case in payload["cases"].items():
        cfg = json.load(open(case["dir"] + "/config.json"))
        r = {"modules": {}}
        qc = C.from_config(cfg["quantization_config"])
        qc.packed_modules_mapping = fused
        for name, cls in case["modules"].items():
            layer = bare(classes[cls])
            ignored = should_ignore_layer(name, ignore=qc.ignore, fused_mapping=fused)
            target = None if ignored else find_matched_target(name, layer, qc.target_scheme_map.keys(), fused)
            try:
                scheme = qc.get_scheme(layer=layer, layer_name=name)
                scheme = None if scheme is None else type(scheme).__name__
            except (ValueError, AttributeError) as exc:  # the kernel is picked at construction: needs a GPU
                scheme = f"no CPU kernel: {str(exc)[:60]}"
            r["modules"][name] = {"ignored": ignored, "target": target, "scheme": scheme}
        g = next(iter(qc.target_scheme_map.values()))  # one scheme, targeted by class (and the head by name)
        w, a = g["weights"], g.get("input_activations")
        r["predicates"] = {p: bool(getattr(C, p)(w)) for p in ("_is_nvfp4_format", "_is_mxfp4", "_is_mxfp8")}
        r["predicates"]["_is_wNa16_group_channel"] = bool(C._is_wNa16_group_channel(w, a))
        if "speculators_model_type" in cfg:
            r["hf_config"] = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(cfg)))
            r["spec"] = SpeculatorsConfig.extract_vllm_speculative_config(json.loads(json.dumps(cfg)))
            try:
                maybe_override_with_speculators(case["dir"], None, trust_remote_code=False)
                r["serve_export"] = "accepted"
            except ValueError as exc:
                r["serve_export"] = str(exc)
        out[key] = r
torch.save(out, sys.argv[2])
"""


@pytest.fixture(scope="module")
def vllm_says(exports, tmp_path_factory):
    cases = {}
    for key, (family, _cfg, tensors, d, depth) in exports.items():
        mods = vllm_modules(family, depth, LAYERS[family], "lm_head" in quantized_names(tensors))
        cases[key] = {"dir": str(d), "modules": {n: c for n, (c, _) in mods.items()}}
    return run_side(SIDE, {"cases": cases}, tmp_path_factory.mktemp("vllm-side"))


# vLLM's scheme per cell (compressed_tensors.py _get_scheme_from_parts); NVFP4 / MXFP4 pick their GPU kernel when
# constructed, so for them vLLM's own format predicate is what is asserted
SCHEME = {"int4": "CompressedTensorsWNA16", "int4-asym": "CompressedTensorsWNA16", "int8": "CompressedTensorsWNA16",
          "int8-asym": "CompressedTensorsWNA16", "int8-dynamic": "CompressedTensorsW8A8Int8",
          "int8-static": "CompressedTensorsW8A8Int8", "fp8": "CompressedTensorsW8A16Fp8",
          "fp8-dynamic": "CompressedTensorsW8A8Fp8", "fp8-static": "CompressedTensorsW8A8Fp8",
          "fp8-tensor-static": "CompressedTensorsW8A8Fp8", "mxfp8": "CompressedTensorsW8A8Mxfp8",
          "mxfp8-dynamic": "CompressedTensorsW8A8Mxfp8",
          **{c: "CompressedTensorsWNA16" for c in ("int2", "int2-asym", "ternary")}}
PREDICATE = {"nvfp4": "_is_nvfp4_format", "nvfp4-static": "_is_nvfp4_format", "mxfp4": "_is_mxfp4"}


@pytest.mark.speculators
@pytest.mark.parametrize("key", IDS)
def test_vllm_matches_and_schemes_every_linear_as_stored(key, exports, vllm_says):
    family, cfg, tensors, _, depth = exports[key]
    cell = next(c for f, c, d, o in CASES if key.startswith(f"{f}-{c}-L{d}"))
    stored_q = quantized_names(tensors)
    said = vllm_says[key]
    for name, (_, shards) in vllm_modules(family, depth, LAYERS[family], "lm_head" in stored_q).items():
        m = said["modules"][name]
        if shards[0] in stored_q:
            assert not m["ignored"] and m["target"] is not None, f"{name}: quantized here, unmatched by vLLM: {m}"
            if cell in SCHEME:
                assert m["scheme"] == SCHEME[cell], f"{name}: vLLM picks {m['scheme']}"
        else:
            assert m["ignored"] or name == "lm_head", f"{name}: float here but vLLM expects quantized tensors: {m}"
            assert m["scheme"] is None, f"{name}: float here, vLLM gives it {m['scheme']}"
    if cell in PREDICATE:
        assert said["predicates"][PREDICATE[cell]], f"vLLM's {PREDICATE[cell]} does not take this config group"


@pytest.mark.speculators
@pytest.mark.parametrize("key", [k for k in IDS if k.startswith(("eagle3", "dflash"))])
def test_vllm_reads_our_speculators_config_as_we_mean_it(key, exports, vllm_says):
    """transformers_utils/configs/speculators: the drafter's hf_config vLLM builds, and the method / tokens."""
    family, cfg, tensors, _, depth = exports[key]
    said = vllm_says[key]
    hf, spec = said["hf_config"], said["spec"]
    assert spec == {"method": family, "num_speculative_tokens": cfg["speculators_config"]["proposal_methods"][0]
                    ["speculative_tokens"]}
    assert hf["hidden_size"] == cfg["transformer_layer_config"]["hidden_size"]
    if family == "eagle3":
        taps = cfg["eagle_aux_hidden_state_layer_ids"]
        assert hf["architectures"] == ["Eagle3LlamaForCausalLM"] and hf["norm_before_residual"] is False
        assert hf["eagle_aux_hidden_state_layer_ids"] == taps and hf["draft_vocab_size"] == cfg["draft_vocab_size"]
        n = len(hf["eagle_config"]["eagle_aux_hidden_state_layer_ids"])  # R5 with vLLM's own hf_config
        assert tensors["fc.weight" if "fc.weight" in tensors else "fc.weight_packed"].shape[0] == hf["hidden_size"]
        assert n == len(taps)
    else:
        assert hf["architectures"] == ["DFlashDraftModel"]
        assert hf["dflash_config"]["target_layer_ids"] == [i - 1 for i in cfg["aux_hidden_state_layer_ids"]]
        assert hf["dflash_config"]["mask_token_id"] == cfg["mask_token_id"]
    # a local verifier path: `vllm serve EXPORT` is refused, the serve command the export prints is the way
    assert "Select local verifiers explicitly" in said["serve_export"]
