"""SGLang's loading rules for what `export hf --for sglang` writes, read from SGLang 0.5.23 (files relative to
sglang/srt/).

Restated (SGLang builds its drafter on a GPU):
- S1 module names: LlamaForCausalLMEagle3 builds its one layer with the prefix `model` (srt/models/llama_eagle3.py:
  LlamaDecoderLayer(config, i, quant_config, prefix) overrides qkv_proj and mlp with that prefix), so its Linears
  are `model.qkv_proj` (QKVParallelLinear), `model.self_attn.o_proj`, `model.gate_up_proj`, `model.down_proj`;
  EAGLE-1 (srt/models/llama_eagle.py) and a standalone LM use `model.layers.{i}.self_attn.qkv_proj`, ...; `fc` is a
  plain torch Linear in both EAGLE models (no quantization method); the head a ParallelLMHead.
- S2 config fields: EAGLE-3 / EAGLE pick their model class by `architectures` (LlamaForCausalLMEagle3 /
  LlamaForCausalLMEagle); EAGLE-3 taps = eagle_config.eagle_aux_hidden_state_layer_ids + 1 (srt/models/llama.py
  set_eagle3_layers_to_capture); d2t becomes the hot-token map; DFlash reads dflash_config.target_layer_ids /
  mask_token_id and block_size (speculative/dflash_utils.py parse_dflash_draft_config).

Run with SGLang's own code in the side interpreter (marked `speculators`): its compressed-tensors matching
(layers/quantization/compressed_tensors/utils.py should_ignore_layer, find_matched_target,
check_equal_or_regex_match for the head, is_activation_quantization_format for the scheme's format), loaded from
the installed wheel by file path (the sglang package itself imports GPU kernels).
"""

from __future__ import annotations

import json

import pytest
from engines_common import quantized, saved_target, wide_target
from safetensors.torch import load_file
from side import run_side

from specpress.errors import RequestError
from specpress.export.hf import export_hf
from specpress.models.drafter_io import save_drafter

FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def sglang_modules(family: str, layers: int, head: bool) -> dict[str, tuple[str, list[str]]]:
    """S1: SGLang module name -> (class, the checkpoint names it loads)."""
    out: dict[str, tuple[str, list[str]]] = {}
    if family == "eagle3":
        out = {"model.qkv_proj": ("QKVParallelLinear", [f"midlayer.self_attn.{s}" for s in FUSED["qkv_proj"]]),
               "model.self_attn.o_proj": ("RowParallelLinear", ["midlayer.self_attn.o_proj"]),
               "model.gate_up_proj": ("MergedColumnParallelLinear",
                                      [f"midlayer.mlp.{s}" for s in FUSED["gate_up_proj"]]),
               "model.down_proj": ("RowParallelLinear", ["midlayer.mlp.down_proj"])}
    else:
        c = "layers.{i}" if family == "eagle" else "model.layers.{i}"
        for i in range(layers):
            p, ck = f"model.layers.{i}", c.format(i=i)
            out[f"{p}.self_attn.qkv_proj"] = ("QKVParallelLinear", [f"{ck}.self_attn.{s}" for s in FUSED["qkv_proj"]])
            out[f"{p}.self_attn.o_proj"] = ("RowParallelLinear", [f"{ck}.self_attn.o_proj"])
            out[f"{p}.mlp.gate_up_proj"] = ("MergedColumnParallelLinear",
                                            [f"{ck}.mlp.{s}" for s in FUSED["gate_up_proj"]])
            out[f"{p}.mlp.down_proj"] = ("RowParallelLinear", [f"{ck}.mlp.down_proj"])
    if head:
        out["lm_head"] = ("ParallelLMHead", ["lm_head"])
    return out


LAYERS = {"eagle3": 1, "eagle": 1, "lm": 2}
CASES = [("eagle3", c, {"exclude": ("fc",)}) for c in ("int4", "int4-asym", "int8", "int8-asym", "int8-dynamic",
                                                       "int8-static", "fp8", "fp8-dynamic", "fp8-static",
                                                       "fp8-tensor-static", "nvfp4", "nvfp4-static")] + [
    ("eagle3", "int4", {"exclude": ("fc",), "include": ("lm_head",)}), ("eagle", "int8", {"exclude": ("fc",)}),
    ("eagle3", "int8", {"exclude": ("fc", "down_proj")}),
    ("lm", "int4", {}), ("lm", "fp8-dynamic", {"exclude": ("down_proj",)})]
IDS = [f"{f}-{c}" + ("-inc_head" if "include" in o else "") + ("-down_float" if "down_proj" in o.get("exclude", ())
                                                                 else "") for f, c, o in CASES]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sglang")
    target = wide_target()
    tdir = saved_target(target, tmp)
    out = {"target": (target, tdir, tmp)}
    for key, (family, cell, opts) in zip(IDS, CASES, strict=True):
        d = quantized(family, cell, target, **opts)
        s = export_hf(save_drafter(d, tmp / f"{key}-src"), tmp / key, engine="sglang", verifier=str(tdir))
        out[key] = (family, d, s, json.loads((s.out / "config.json").read_text()),
                    load_file(str(s.out / "model.safetensors")))
    return out


def stored_quantized(tensors) -> set[str]:
    return {k.rpartition(".")[0] for k in tensors if k.endswith((".weight_packed", ".weight_scale"))}


@pytest.mark.parametrize("key", [k for k in IDS if k.startswith("eagle3")])
def test_eagle3_config_is_what_sglang_reads(key, built):
    """S2: the class SGLang builds, the taps it captures (+1), the draft vocabulary's hot-token map."""
    family, d, s, cfg, tensors = built[key]
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and s.layout == "public eagle3"
    assert [j + 1 for j in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]] == list(d.config.target_layer_ids)
    assert cfg["draft_vocab_size"] == d.config.draft_vocab_size and "d2t" in tensors
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    assert "--speculative-draft-model-quantization compressed-tensors" in s.serve
    assert "--speculative-algorithm EAGLE3" in s.serve and f"--speculative-draft-model-path {s.out}" in s.serve


def test_float_dflash_and_eagle_carry_the_fields_sglang_reads(built, tmp_path):
    target, tdir, _ = built["target"]
    e = export_hf(save_drafter(quantized("dflash", None, target), tmp_path / "dsrc"), tmp_path / "d", engine="sglang",
                  verifier=str(tdir))
    cfg = json.loads((e.out / "config.json").read_text())
    assert cfg["dflash_config"]["target_layer_ids"] and cfg["dflash_config"]["mask_token_id"] == 0
    assert cfg["block_size"] == 4 and "--speculative-algorithm DFLASH --speculative-num-draft-tokens 4" not in e.serve
    assert "--speculative-algorithm DFLASH" in e.serve and "--speculative-num-draft-tokens 4" in e.serve
    _, _, s, cfg, _ = built["eagle-int8"]
    assert cfg["architectures"] == ["LlamaForCausalLMEagle"] and "--speculative-algorithm EAGLE " in s.serve


@pytest.mark.parametrize("cell, opts, rule", [
    ("int4", {}, r"EAGLE3 `fc` is a plain torch Linear.*--exclude fc"),
    ("int4-awq", {"exclude": ("fc",)}, "not awq's pre_quant_scale"),
    ("mxfp8", {"exclude": ("fc",)}, "no compressed-tensors scheme for mxfp8"),
    ("int8", {"exclude": ("fc", "q_proj")}, "one fused Linear with one quantization scheme"),
    ("int2", {"exclude": ("fc",)}, "takes 4- and 8-bit weights"),
], ids=["quantized-fc", "awq", "mx", "q-float-kv-quantized", "low-bit"])
def test_what_sglang_cannot_load_is_refused_with_its_rule(cell, opts, rule, built, tmp_path):
    target, tdir, _ = built["target"]
    src = save_drafter(quantized("eagle3", cell, target, **opts), tmp_path / "src")
    with pytest.raises(RequestError, match=rule) as err:  # the engine refuses this drafter: exit 1
        export_hf(src, tmp_path / "out", engine="sglang", verifier=str(tdir))
    assert "SGLang 0.5.23" in str(err.value) and not (tmp_path / "out").exists()


def test_a_quantized_dflash_drafter_is_refused(built, tmp_path):
    target, tdir, _ = built["target"]
    src = save_drafter(quantized("dflash", "int8", target), tmp_path / "src")
    with pytest.raises(RequestError, match="supports_quantization is False"):
        export_hf(src, tmp_path / "out", engine="sglang", verifier=str(tdir))


SIDE = r"""
import importlib.util, json, os, sys
import torch
payload = torch.load(sys.argv[1], weights_only=False)
root = importlib.util.find_spec("sglang").submodule_search_locations[0]
path = os.path.join(root, "srt", "layers", "quantization", "compressed_tensors", "utils.py")
spec = importlib.util.spec_from_file_location("sglang_ct_utils", path)
u = importlib.util.module_from_spec(spec)
spec.loader.exec_module(u)
classes = {n: type(n, (torch.nn.Module,), {}) for n in ("QKVParallelLinear", "MergedColumnParallelLinear",
                                                        "RowParallelLinear", "ParallelLMHead")}
fused = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
out = {"file": path}
for key, case in payload["cases"].items():
    q = json.load(open(case["dir"] + "/config.json"))["quantization_config"]
    (g,) = q["config_groups"].values()
    r = {"activation_format": u.is_activation_quantization_format(g.get("format") or q["format"]), "modules": {}}
    for name, cls in case["modules"].items():
        ignored = u.should_ignore_layer(name, ignore=q["ignore"], fused_mapping=fused)
        if cls == "ParallelLMHead":  # get_lm_head_scheme: the head only when a target names it
            target = None if ignored else (u.check_equal_or_regex_match(name, g["targets"]) or None)
        else:
            target = None if ignored else u.find_matched_target(name, classes[cls](), g["targets"], fused)
        r["modules"][name] = {"ignored": ignored, "target": target}
    out[key] = r
torch.save(out, sys.argv[2])
"""


@pytest.mark.speculators
def test_sglang_matches_every_linear_as_stored(built, tmp_path):
    """SGLang's own matching: each quantized Linear takes the group's scheme, each float one is ignored, in SGLang's
    names (S1), and the scheme's format is one its _get_scheme_from_parts builds from."""
    cases = {}
    for key in IDS:
        family, d, s, cfg, tensors = built[key]
        mods = sglang_modules(family, LAYERS[family], "lm_head" in stored_quantized(tensors))
        cases[key] = {"dir": str(s.out), "modules": {n: c for n, (c, _) in mods.items()}}
    said = run_side(SIDE, {"cases": cases}, tmp_path / "side")
    assert said["file"].endswith("sglang/srt/layers/quantization/compressed_tensors/utils.py")
    for key in IDS:
        family, d, s, cfg, tensors = built[key]
        stored = stored_quantized(tensors)
        assert said[key]["activation_format"], f"{key}: SGLang builds no scheme from this format"
        for name, (_, shards) in sglang_modules(family, LAYERS[family], "lm_head" in stored).items():
            m = said[key]["modules"][name]
            if shards[0] in stored:
                assert not m["ignored"] and m["target"], f"{key} {name}: quantized here, unmatched in SGLang: {m}"
            else:
                assert m["ignored"], f"{key} {name}: float here, SGLang expects quantized tensors: {m}"
