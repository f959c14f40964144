"""TensorRT-LLM's loading rules for a drafter, PyTorch backend (GitHub NVIDIA/TensorRT-LLM main, 2026 sources;
files relative to tensorrt_llm/). Its code needs CUDA and NVIDIA's package index, so the rules are restated and
checked in tests/export/test_trtllm_rules.py.

- Routes (`speculative_config.decoding_type`): Eagle3 reads the public EAGLE-3 layout (_torch/models/
  modeling_speculative.py Eagle3ForCausalLM: `midlayer.*` or `layers.0.*`, names prefixed `model.` except
  lm_head; a draft lm_head in the checkpoint replaces the target's), DFlash the z-lab layout (_torch/models/
  modeling_dflash.py: layers.*, fc, hidden_norm, dflash_config.mask_token_id / target_layer_ids, block_size),
  DraftTarget a plain HF LM (each family's route: its serving facet, export/hf/facets/). The taps come from the serve config, not the checkpoint (llmapi/llm_args.py
  eagle3_layers_to_capture: layer outputs, default {1, L//2 - 1, L - 4}). MTP and EAGLE-1: no route.
- Quantized Linears: the draft's hf_quant_config.json (ModelOpt; _torch/model_config.py). quant_algo is a
  QuantAlgo name (quantization/mode.py: W8A16, W4A16_AWQ, FP8, FP8_PER_CHANNEL_PER_TOKEN, NVFP4, ...; no
  W4A16_NVFP4, no MXFP8) with a Linear method (_torch/modules/linear.py get_quant_method: FP8QDQ, FP8Rowwise,
  NVFP4, WeightOnlyQuant, W4A16_AWQ, ...; none for W8A8_SQ_PER_CHANNEL: 'unsupported quant mode').
  exclude_modules are fnmatch patterns on runtime names, a fused layer excluded when any shard matches
  (_torch/models/modeling_utils.py apply_quant_config_exclude_modules); lm_head takes no quant config (same file).
- Scales (linear.py): FP8 per-tensor fused shards re-quantized to the max weight_scale; FP8_PER_CHANNEL_PER_TOKEN
  weight_scale [N] concatenated; NVFP4 asserts weight_scale_2 and input_scale equal across fused shards and needs
  input_scale (alpha = input_scale * weight_scale_2); W4A16_AWQ weight [N/2, K] -> int4 [K, N/2], weight_scale
  [N, K/G] transposed, pre_quant_scale required on a plain Linear and NOT loaded for fused q/k/v and gate/up
  (Model Optimizer folds it into the preceding norm); W8A16 weight int8 [N, K], weight_scale [N].
- DFlash stacks every layer's K/V rows of the float qkv_proj.weight into one buffer after loading
  (_build_fused_kv_buffers), so its layers are served in float only.
- The draft head (export/hf/heads.py): Eagle3ForCausalLM's lm_head is one [draft_vocab_size, hidden_size] Linear;
  a checkpoint without lm_head keeps load_lm_head_from_target and takes the target's whole lm_head
  (modeling_speculative.py load_weights / load_weights_from_target_model). DraftTarget's LM has its own lm_head.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpress.export.hf.rules import (
    Job,
    Rules,
    first,
    fused_scales_differ,
    last_layer_tap,
    mixed_fused,
    modelopt_algo,
    quantized_named,
    unquantized_only,
)
from specpress.models.quantized.fusion import group_of

V = "TensorRT-LLM (main, PyTorch backend)"
LOADS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "NVFP4", "W4A16_AWQ", "W8A16")


_algo = modelopt_algo  # the quant_algo this job is written as (None: float, or the encoding refuses it)


def _scheme(job: Job) -> str | None:
    if job.qcfg is None:
        return None
    algo = _algo(job)
    if algo is None or algo in LOADS:
        return None
    why = {"W4A16_NVFP4": "no W4A16_NVFP4 QuantAlgo (quantization/mode.py), and NVFP4LinearMethod needs an "
                          "input_scale (_torch/modules/linear.py load_weight_scales: alpha = input_scale * "
                          "weight_scale_2): quantize nvfp4 with --activations static (W4A4)",
           "MXFP8": "no MXFP8 QuantAlgo in quantization/mode.py as read: quantize with fp8 or nvfp4",
           "W8A8_SQ_PER_CHANNEL": "no Linear method for SmoothQuant's W8A8 in the PyTorch backend (_torch/modules/"
                                  "linear.py get_quant_method raises 'unsupported quant mode'): quantize int8 "
                                  "weight-only (W8A16) or fp8"}
    return f"{V} cannot load quant_algo {algo}: {why.get(algo, 'not among ' + ', '.join(LOADS))}"


def _head(job: Job) -> str | None:
    if not quantized_named(job, "lm_head"):
        return None
    return (f"{V} builds the draft's lm_head without a quantization config (_torch/models/modeling_utils.py "
            f"DecoderModelForCausalLM: 'lm_head Linear will not accept QuantConfig'): quantize without --include "
            f"lm_head")


def _nvfp4_scales(job: Job) -> str | None:
    if job.scheme != "nvfp4":
        return None
    why = fused_scales_differ(job, ("weight_scale_2", "input_scale"))
    if why is None:
        return None
    return (f"{V} asserts one weight_scale_2 and one input_scale per fused q/k/v and gate/up Linear (_torch/modules/"
            f"linear.py NVFP4LinearMethod.load_weight_scales): {why}. Re-quantize the full-precision drafter "
            f"(specpress quantize shares the global scale within a fused group)")


def runtime_name(name: str, job: Job) -> str:
    """The module name TensorRT-LLM matches exclude_modules against: checkpoint names get `model.` (all but
    lm_head) for the EAGLE-3 / DFlash drafters; a plain HF LM's names already are its module names."""
    if name == "lm_head" or name.startswith("model."):
        return name
    return "model." + name


def preceding_norms(job: Job, linear: str) -> list[tuple[str, int]]:
    """The norm weights feeding a fused Linear's input, with the width each covers (in input order)."""
    parent = linear.rpartition(".")[0]  # ...self_attn / ...mlp
    layer = parent.rpartition(".")[0]
    h = job.config.hidden_size
    leaf_group = group_of(linear)
    if leaf_group is None:
        return []
    if leaf_group[0] == "gate_proj":
        return [(f"{layer}.post_attention_layernorm.weight", h)]
    return [(f"{layer}.{norm}.weight", h) for norm in job.facet.fused_input_norms]  # EAGLE-3's midlayer reads 2H


def _awq_form(job: Job, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """W4A16_AWQ as TensorRT-LLM reads it: a plain Linear's pre_quant_scale present (ones when none was
    calibrated: x · 1 = x); a fused group's (shared by its members: one input) folded into the norm(s) before it,
    since the fused loader reads none, and written as ones, so the file still computes what it says."""
    if _algo(job) != "W4A16_AWQ":
        return tensors
    out = dict(tensors)
    folded: set[str] = set()
    for name in job.quantized:
        key = f"{name}.pre_quant_scale"
        k = job.linears[name][1]
        s = out.get(key)
        if group_of(name) is None:
            if s is None:
                out[key] = torch.ones(k, dtype=torch.float32)
            continue
        if s is None or bool((s == 1).all()):
            out[key] = torch.ones(k, dtype=torch.float32)
            continue
        norms = preceding_norms(job, name)
        if sum(w for _, w in norms) != k:
            from specpress.errors import ConfigError

            raise ConfigError(f"{name}: its pre_quant_scale [{k}] does not match the norms before it "
                              f"({', '.join(n for n, _ in norms)}); TensorRT-LLM cannot apply it")
        at = 0
        for norm, width in norms:
            if norm not in folded:
                w = out[norm]
                out[norm] = (w.float() * s[at:at + width].float()).to(w.dtype)
                folded.add(norm)
            at += width
        out[key] = torch.ones(k, dtype=torch.float32)
    return out


def _serve(job: Job) -> str:
    assert job.route is not None
    block = job.traits.session == "block"
    lines = ["speculative_config:", f"  decoding_type: {job.route.name}",
             f"  max_draft_len: {job.config.block_size - 1 if block else job.tokens}",
             f"  speculative_model: {job.out}"]
    if job.route.serve_taps and job.taps is not None and job.num_target_layers:
        n = job.num_target_layers
        if sorted(t - 1 for t in job.taps) != sorted({1, n // 2 - 1, n - 4}):
            lines.append(f"  eagle3_layers_to_capture: [{', '.join(str(t - 1) for t in job.taps)}]")
    body = " ".join(f"'{ln}'" for ln in lines)
    return f"printf '%s\\n' {body} > spec.yaml && trtllm-serve {job.verifier or 'TARGET'} --config spec.yaml"


def _notes(job: Job) -> list[str]:
    notes = []
    if job.route is not None and job.route.serve_taps:
        notes.append(f"{V} takes the taps from the serve config (eagle3_layers_to_capture: layer outputs, default "
                     f"{{1, L//2-1, L-4}}), not from the checkpoint: the command above sets them")
    if _algo(job) == "FP8" and fused_scales_differ(job, ("scales",)):
        notes.append(f"{V} re-quantizes each fused q/k/v and gate/up FP8 Linear to the largest of its shards' "
                     f"weight_scale (_torch/modules/linear.py FP8QDQLinearMethod), re-rounding the other shards")
    if _algo(job) == "W4A16_AWQ" and any(group_of(n) for n in job.quantized):
        notes.append("W4A16_AWQ: the fused Linears' pre_quant_scale is folded into the norms before them (TensorRT-LLM "
                     "loads none for q/k/v or gate/up), rounded to the norms' dtype")
    return notes


SHARED_HEAD = (f"{V} takes the target's WHOLE lm_head when the checkpoint has none (_torch/models/"
               f"modeling_speculative.py Eagle3ForCausalLM.load_weights keeps load_lm_head_from_target; "
               f"load_weights_from_target_model), which computes the drafter's logits only when its draft vocabulary "
               f"is the target's")


RULES = Rules(
    refuse=first(unquantized_only(V), _scheme, _head,
                 mixed_fused(V, "_torch/models/modeling_utils.py apply_quant_config_exclude_modules leaves a fused "
                                "layer unquantized when any shard is excluded"),
                 last_layer_tap(V, "_torch/models/modeling_speculative.py spec_metadata.maybe_capture_hidden_states "
                                   "after each layer"),
                 _nvfp4_scales),
    notes=_notes,
    serve=_serve,
    ignore=runtime_name,
    tensors=_awq_form,
    label=V,
    shared_head=SHARED_HEAD,
)
