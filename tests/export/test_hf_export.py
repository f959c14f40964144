"""`export hf`: speculators / compressed-tensors / ModelOpt layouts written from specpress drafters and read
back bit for bit (codes, scales, floats), with the same decoding in the loop; bad input is refused clearly."""

from __future__ import annotations

import json

import pytest
import torch
from drafters_common import IDS, L, make, run
from safetensors.torch import load_file, save_file

from specpress.compress.quantize.api import quantize
from specpress.errors import CheckpointError, ConfigError, RequestError, UsageError
from specpress.export.hf import export_hf
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.quantized.scheme import config_for
from specpress.models.target import save_target
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner

SCHEMES = {  # name -> config_for(...) kwargs
    "int4": dict(scheme="int4", group_size=8),
    "int4-asym": dict(scheme="int4", group_size=8, symmetric=False),
    "int8": dict(scheme="int8"),
    "int8-asym": dict(scheme="int8", group_size=8, symmetric=False),
    "fp8": dict(scheme="fp8"),
}


def drafter_dir(family, target, tmp_path, scheme=None, seed=1):
    d = make(family, target, seed)
    if scheme:
        kw = dict(SCHEMES[scheme])
        quantize(d, config_for(kw.pop("scheme"), **kw))
    return save_drafter(d, tmp_path / f"{family}-{scheme}")


def stored(d):
    return {k: v for k, v in d.public_state_dict().items()}


def assert_same(a, b):
    sa, sb = stored(a), stored(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("family", ["eagle3", "dflash", "lm"])
@pytest.mark.parametrize("scheme", [None, *SCHEMES])
def test_speculators_round_trip_is_bit_identical(family, scheme, target, target_dir, tmp_path):
    src = drafter_dir(family, target, tmp_path, scheme)
    out = tmp_path / "served"
    summary = export_hf(src, out, "speculators", verifier=str(target_dir))
    cfg = json.loads((out / "config.json").read_text())
    keys = set(load_file(str(out / "model.safetensors")))
    if family == "lm":
        assert "speculators_model_type" not in cfg and cfg["architectures"] == ["LlamaForCausalLM"]
    else:
        assert cfg["speculators_model_type"] == family and summary.layout == f"speculators {family}"
        sc = cfg["speculators_config"]
        assert sc["verifier"] == {"name_or_path": str(target_dir), "architectures": ["LlamaForCausalLM"]}
        assert sc["default_proposal_method"] == "greedy" and sc["proposal_methods"][0]["proposal_type"] == "greedy"
        assert not any(k.startswith("midlayer.") for k in keys)
    if family == "eagle3":
        # the artifact stores its taps (the 8-layer target's defaults 2, L//2, L-3): written explicitly
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5] and cfg["norm_before_residual"] is False
        assert cfg["transformer_layer_config"]["model_type"] == "llama" and "layers.0.hidden_norm.weight" in keys
    if family == "dflash":
        assert cfg["aux_hidden_state_layer_ids"] == [2, 6]  # target_layer_ids [1, 5] + 1: hidden_states index
        assert sc["proposal_methods"][0]["speculative_tokens"] == 3 and "lm_head.weight" in keys
    if scheme:
        q = cfg["quantization_config"]
        assert q["quant_method"] == "compressed-tensors" and summary.scheme == scheme.split("-")[0]
        assert any(k.endswith(".weight_packed" if scheme != "fp8" else ".weight_scale") for k in keys)
    a, b = load_drafter(src, target), load_drafter(out, target)
    assert_same(a, b)
    assert b.provenance == a.provenance and b.config == a.config
    assert torch.equal(run(a, target), run(b, target))


def test_eagle3_taps_and_policy_mapping(target, target_dir, tmp_path):
    from dataclasses import replace

    from specpress.models.drafter import build_drafter

    base = make("eagle3", target)
    d = build_drafter(replace(base.config, target_layer_ids=(1, 4, 6)))  # never mutate the shared config
    d.load_state_dict(base.state_dict())
    src = save_drafter(d.attach_target(target), tmp_path / "e3")
    s = export_hf(src, tmp_path / "tree", "speculators", verifier=str(target_dir), policy="tree:[[0],[0,0],[1]]")
    cfg = json.loads((tmp_path / "tree" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 4, 6]  # HF hidden_states index = vLLM's layer-input id
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2
    assert s.speculative_tokens == 2 and any("nearest chain" in n for n in s.notes)
    back = load_drafter(tmp_path / "tree", target)
    assert back.taps == (1, 4, 6)
    # a model id as verifier: the drafter carries the embedding speculators stores (test_speculators_embedding)
    src = save_drafter(d, tmp_path / "e3-shared", include_shared=True)
    export_hf(src, tmp_path / "chain", "speculators", verifier="org/some-model", policy="chain:5")
    cfg = json.loads((tmp_path / "chain" / "config.json").read_text())
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    assert cfg["speculators_config"]["verifier"] == {"name_or_path": "org/some-model",
                                                     "architectures": ["LlamaForCausalLM"]}


@pytest.mark.parametrize("family", ["eagle3", "mtp", "dflash"])
def test_modelopt_fp8_round_trip(family, target, tmp_path):
    src = drafter_dir(family, target, tmp_path, "fp8")
    s = export_hf(src, tmp_path / "mo", "modelopt")
    hq = json.loads((tmp_path / "mo" / "hf_quant_config.json").read_text())
    assert hq["quantization"]["quant_algo"] == "FP8_PER_CHANNEL_PER_TOKEN" and hq["producer"]["name"] == "modelopt"
    assert any("activations" in n for n in s.notes)
    a, b = load_drafter(src, target), load_drafter(tmp_path / "mo", target)
    assert_same(a, b)
    assert torch.equal(run(a, target), run(b, target))


def test_same_decoding_through_the_loop(target, target_dir, tmp_path):
    """An lm drafter holding the target's own weights, int4-quantized (so drafts are often accepted):
    exported and read back, it proposes the same tokens every round (same tau, same accept histogram)."""
    from specpress.models.lm import LMConfig, LMDrafter
    from specpress.runtime.loop import speculative_generate
    from specpress.runtime.policy import parse_policy

    d = LMDrafter(LMConfig.from_target_config(target.config))
    d.load_state_dict(target.state_dict(), strict=False)
    d.attach_target(target)
    quantize(d, config_for("int4", group_size=8))
    src = save_drafter(d, tmp_path / "lm-int4")
    export_hf(src, tmp_path / "served", "speculators")
    prompt = IDS[0].tolist()
    runs = []
    for path in (src, tmp_path / "served"):
        g = speculative_generate(TorchTarget(target), drafter_runner(load_drafter(path, target)), prompt, 24,
                                 parse_policy("chain:3"), eos_ids=())
        runs.append((g.tokens, [r.accepted for r in g.rounds]))
    assert runs[0] == runs[1]
    accepted = runs[0][1]
    assert sum(accepted) > 0, "nothing accepted: the comparison would not exercise the drafts"


# ------------------------------------------------------------------------------------ bad input

def test_refuses_what_a_format_cannot_hold(target, target_dir, tmp_path):
    nf4 = drafter_dir("eagle3", target, tmp_path, None)
    d = load_drafter(nf4, target)
    quantize(d, config_for("nf4", group_size=32, exclude=("down_proj",)))
    nf4 = save_drafter(d, tmp_path / "nf4")
    with pytest.raises(ConfigError, match=r"compressed-tensors has no encoding for a nf4 \(bnb\).*holds int4 .*int8 .*fp8"):
        export_hf(nf4, tmp_path / "x", "speculators", verifier=str(target_dir))
    with pytest.raises(ConfigError, match="ModelOpt's integer formats have no zero points"):
        export_hf(drafter_dir("mtp", target, tmp_path, "int4-asym"), tmp_path / "y", "modelopt")
    with pytest.raises(ConfigError, match="no layout for specpress's 'mtp'"):
        export_hf(drafter_dir("mtp", target, tmp_path, None), tmp_path / "z", "speculators", verifier="x/y")
    with pytest.raises(RequestError, match="not quantized"):
        export_hf(drafter_dir("eagle3", target, tmp_path / "f", None), tmp_path / "w", "modelopt")
    assert not any((tmp_path / n).exists() for n in "xyzw")


def test_verifier_must_match_the_drafters_target(target, tmp_path):
    from drafters_common import SHAPE

    from specpress.models.target import TargetConfig, TargetModel

    other = save_target(TargetModel(TargetConfig(**SHAPE, num_hidden_layers=L + 1)), tmp_path / "other")
    src = drafter_dir("eagle3", target, tmp_path, None)
    with pytest.raises(CheckpointError, match="does not match the target.*num_hidden_layers"):
        export_hf(src, tmp_path / "x", "speculators", verifier=str(other))
    with pytest.raises(UsageError, match="--target NAME_OR_PATH is required"):
        export_hf(src, tmp_path / "x", "speculators")
    with pytest.raises(RequestError, match="lm_head"):  # dflash stores the verifier's head: needs a local dir
        export_hf(drafter_dir("dflash", target, tmp_path, None), tmp_path / "x", "speculators", verifier="org/m")


def test_reader_rejects_unknown_fields_and_a_foreign_verifier(target, target_dir, tmp_path):
    src = drafter_dir("eagle3", target, tmp_path, "int4")
    out = export_hf(src, tmp_path / "s", "speculators", verifier=str(target_dir)).out
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "medusa_heads": 4}))
    with pytest.raises(ConfigError, match="unknown field.*medusa_heads.*known:"):
        load_drafter(out, target)
    cfg["speculators_config"]["verifier"]["architectures"] = ["Qwen3ForCausalLM"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="Qwen3ForCausalLM.*LlamaForCausalLM"):
        load_drafter(out, target)
    cfg["speculators_config"]["verifier"]["architectures"] = ["LlamaForCausalLM"]
    cfg["norm_before_residual"] = True
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="norm_before_residual"):
        load_drafter(out, target)


def test_truncated_or_tampered_weights_are_clear_errors(target, target_dir, tmp_path):
    src = drafter_dir("eagle3", target, tmp_path, "int4")
    out = export_hf(src, tmp_path / "s", "speculators", verifier=str(target_dir)).out
    f = out / "model.safetensors"
    good = f.read_bytes()
    f.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_drafter(out, target)
    f.write_bytes(good)
    t = load_file(str(f))
    key = next(k for k in t if k.endswith(".weight_scale"))
    t[key] = t[key].to(torch.bfloat16)
    save_file(t, str(f))
    with pytest.raises(CheckpointError, match=r"weight_scale: stored torch.bfloat16"):
        load_drafter(out, target)


def test_cli_command(target, target_dir, tmp_path):
    from click.testing import CliRunner

    from specpress.commands.export_hf import hf

    src = drafter_dir("eagle3", target, tmp_path, "int4")
    r = CliRunner().invoke(hf, ["--drafter", str(src), "--out", str(tmp_path / "o"), "--format", "speculators",
                                "--target", str(target_dir), "--policy", "dynamic:depth=4,topk=2,budget=6"])
    assert r.exit_code == 0, r.output
    assert "speculators eagle3, int4 as compressed-tensors" in r.output and "nearest chain" in r.output
    assert "group size 8" in r.output  # not a group size vLLM's kernels take: flagged
    r = CliRunner().invoke(hf, ["--drafter", str(src), "--out", str(tmp_path / "p"), "--format", "onnx"])
    assert r.exit_code != 0 and "speculators" in r.output


def test_inspect_reads_an_exported_directory(target, target_dir, tmp_path):
    from specpress.models.inspect import inspect_artifact

    src = drafter_dir("eagle3", target, tmp_path, "int4")
    out = export_hf(src, tmp_path / "s", "speculators", verifier=str(target_dir)).out
    a, b = inspect_artifact(src), inspect_artifact(out)
    assert b["family"] == "eagle3" and b["params"] == a["params"]
    qa, qb = a["quantization"], b["quantization"]
    assert qb["scheme"] == "int4" and qb["modules"].keys() == qa["modules"].keys()
    for name, m in qb["modules"].items():  # the same codes and scales; + weight_shape and word padding
        assert qa["modules"][name]["bytes"] <= m["bytes"] <= qa["modules"][name]["bytes"] + 16 + 4 * m["params"] // 8


def test_partly_quantized_fused_layer_is_flagged(target, target_dir, tmp_path):
    d = make("eagle3", target)
    quantize(d, config_for("int8", exclude=("k_proj",)))
    src = save_drafter(d, tmp_path / "e3")
    s = export_hf(src, tmp_path / "s", "speculators", verifier=str(target_dir))
    assert any("fused Linear" in n and "k_proj" in n for n in s.notes)
    ok = export_hf(drafter_dir("eagle3", target, tmp_path / "b", "int8"), tmp_path / "t", "speculators",
                   verifier=str(target_dir))
    assert not any("fused Linear" in n for n in ok.notes)


# ------------------------------------------------------------------- what the engines load (issue 34)

def test_speculators_eagle3_stores_the_verifiers_embedding(target, target_dir, tmp_path):
    """speculators' own eagle3 checkpoints keep `embed_tokens.weight` and its Eagle3DraftModel reads it
    (speculators 0.9.0); left out, transformers allocates it uninitialised. The export writes the
    verifier's; with only a model id to read it from, it refuses."""
    src = drafter_dir("eagle3", target, tmp_path, "int4")
    out = export_hf(src, tmp_path / "s", "speculators", verifier=str(target_dir)).out
    t = load_file(str(out / "model.safetensors"))
    assert torch.equal(t["embed_tokens.weight"], target.model.embed_tokens.weight)
    assert_same(load_drafter(src, target), load_drafter(out, target))  # still read back as before
    with pytest.raises(RequestError, match="embed_tokens.*local target directory"):
        export_hf(src, tmp_path / "x", "speculators", verifier="org/some-model")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("family", ["eagle3", "dflash"])
def test_modelopt_fp8_weight_scale_is_one_dimensional(family, target, tmp_path):
    """ModelOpt writes per-channel fp8 scales `[N]`, and TensorRT-LLM's FP8 rowwise method
    (tensorrt_llm/_torch/modules/linear.py FP8RowwiseLinearMethod.create_weights: weight_scale
    `empty(out_features)`) and vLLM 0.34's ModelOpt per-channel scheme (model_executor/layers/quantization/
    modelopt.py KFp8StaticChannel, FP8_PER_CHANNEL_PER_TOKEN) allocate `[N]`: `[N, 1]` fails to copy."""
    src = drafter_dir(family, target, tmp_path, "fp8")
    out = export_hf(src, tmp_path / "mo", "modelopt").out
    t = load_file(str(out / "model.safetensors"))
    scales = {k: v for k, v in t.items() if k.endswith(".weight_scale")}
    assert scales
    for k, s in scales.items():
        w = t[k.removesuffix("_scale")]
        assert s.dtype == torch.float32 and tuple(s.shape) == (w.shape[0],), k


def test_help_and_notes_do_not_promise_sglang_a_quantized_modelopt_route(target, tmp_path):
    """SGLang 0.5.23 (srt/layers/quantization/modelopt_quant.py ModelOptFp8Config) serves static per-tensor FP8
    only: the ModelOpt layout is not its route when quantized (the notes say so); its route is --for sglang,
    which the help names with the version its rules were read from."""
    from click.testing import CliRunner

    from specpress.commands.export_hf import hf

    r = CliRunner().invoke(hf, ["--help"])
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "vLLM / SGLang / TensorRT-LLM" not in text
    assert "--for [vllm|sglang|trtllm|edgellm]" in text and "SGLang 0.5.23" in text and "vLLM 0.34.0" in text
    s = export_hf(drafter_dir("eagle3", target, tmp_path, "fp8"), tmp_path / "mo", "modelopt")
    assert any(n.startswith("not for SGLang") for n in s.notes)
    assert not any("SGLang also" in n or "/ SGLang" in n for n in s.notes)


def test_a_tap_on_the_targets_last_layer_is_refused(target, target_dir, tmp_path):
    """hidden_states[L] is taken after the final norm here; vLLM 0.34 collects tap j as hidden + residual after
    j layers (model_executor/models/llama.py LlamaModel.forward, model_executor/models/interfaces.py
    _maybe_add_hidden_state), tap L before the final norm, so a tap L would be another feature there."""
    from dataclasses import replace

    from specpress.models.drafter import build_drafter

    base = make("eagle3", target)
    d = build_drafter(replace(base.config, target_layer_ids=(2, 4, L)))
    d.load_state_dict(base.state_dict())
    src = save_drafter(d.attach_target(target), tmp_path / "e3")
    with pytest.raises(ConfigError, match=rf"taps hidden_states\[{L}\].*after the final norm.*tap {L} before the "
                                          rf"final norm.*below {L}"):
        export_hf(src, tmp_path / "x", "speculators", verifier=str(target_dir))
    assert not (tmp_path / "x").exists()


def test_vllm_kernel_notes_are_current():
    """vLLM 0.34: 8-bit weights with zero points run through Machete on sm90 (quantization/utils/
    machete_utils.py: uint8 with zero points, groups -1/64/128, in % 64 and out % 128;
    model_executor/kernels/linear/mixed_precision/machete.py: capability 90); Marlin takes zero points for uint4
    only (marlin_utils.py query_marlin_supported_quant_types), so other layers go to the next kernel
    choose_mp_linear_kernel accepts (kernels/linear/__init__.py), Humming on CUDA; Marlin pads shapes that are
    neither (out % 64, in % 128) nor (out % 128, in % 64) (marlin_utils.py marlin_padded_nk)."""
    from specpress.models.formats.compressed_tensors import marlin_tiles, serving_notes

    asym = " ".join(serving_notes({"name": "int", "bits": 8, "group_size": 32, "symmetric": False},
                                  {"layers.0.mlp.down_proj": (40, 32)}))
    assert "Machete" in asym and "sm90" in asym and "4-bit weights only" in asym and "Humming" in asym
    assert "pads" in asym and "may fall back" not in asym and "refuse" not in asym
    assert marlin_tiles(64, 128) and marlin_tiles(128, 64) and not marlin_tiles(64, 64) and not marlin_tiles(40, 32)
    aligned = serving_notes({"name": "int", "bits": 4, "group_size": 64, "symmetric": True},
                            {"a": (128, 192), "b": (64, 256)})  # (out, in): whole tiles in one family or the other
    assert not any("pads" in n for n in aligned)
