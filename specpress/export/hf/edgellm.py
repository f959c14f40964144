"""TensorRT Edge-LLM 0.11.0's rules for EAGLE-3 and DFlash drafter checkpoints, read from the PyPI wheel's exporter
(tensorrt_edgellm-0.11.0; files under tensorrt_edgellm/). `tensorrt-edgellm-export CKPT OUT` turns the checkpoint
into OUT/llm/model.onnx with trt_edgellm::AttentionPlugin; it runs without CUDA, and
tests/export/test_edgellm_exports.py runs it on the exports written here (.ci/edgellm-venv builds its venv).

- Recognition (config.py ModelConfig): an EAGLE-3 draft by an architecture containing "Eagle3" or a `ttt_length`
  key; `midlayer.*` is remapped to `layers.0.*` (model.py), `d2t` kept (int32), `t2d` skipped.
- Taps: the draft's `target_layer_ids` is read from a top-level key only (config.py eagle3_target_layer_ids;
  absent -> []), so it is written there. The base export feeds the draft cat(hidden_states[2],
  hidden_states[L//2], hidden_states[L-3]) whatever the draft says (tensorrt_edgellm/models/default/
  modeling_default.py CausalLM, eagle_base; --eagle-draft-dir sets only their count): other taps are refused.
- Quantized Linears (config.py _parse_quant, _algo_to_quant_type on hf_quant_config.json): any FP8 quant_algo ->
  FP8Linear (per-tensor static Q/DQ); any FP4 one -> NVFP4 W4A4 (the weight-only nvfp4_a16 only for a nemotron_h
  MIXED_PRECISION checkpoint); MXFP8 -> MXFP8 with dynamic MX activations; W8A8 / INT8 -> INT8 SmoothQuant W8A8;
  W4A16_AWQ -> the AWQ-prepacked int4 plugin; anything else (W8A16) -> float16 Linears.
- The draft layer's attention and MLP Linears are built without a module name (tensorrt_edgellm/models/eagle3/
  modeling_eagle3_draft.py make_linear(config, ...)), so they all take the checkpoint's scheme; only `fc` and
  `lm_head` are looked up in exclude_modules.
- Precision (tensorrt_edgellm/models/linear.py, checkpoint/repacking.py): the graph runs in float16. Float
  weights are cast to float16, and so are FP8's weight_scale / input_scale (_cast_fp8_linear_scales), AWQ's
  weight_scale and pre_quant_scale (_cast_modelopt_awq_prepacked) and SmoothQuant's pre_quant_scale
  (INT8SQLinear multiplies its float16 input by it and requires float16 after: written in float16 here).
  Codes, block scales, and NVFP4 / INT8 float32 scales are exported as written.
- DFlash (float; facets/dflash.py): the z-lab layout SGLang reads. `--dflash-draft --dflash-draft-dir` exports it
  beside its base (lm_head from the base); dflash.py resolve_dflash_contract reads dflash_config's
  target_layer_ids, block_size and mask_token_id (a V1 draft: no DFlash2DraftModel architecture), and the base
  export concatenates those layers' outputs (tensorrt_edgellm/models/default/modeling_default.py
  target_hidden_by_layer), the features specpress's DFlash reads.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specpress.export.hf.heads import head_kind
from specpress.export.hf.rules import Job, Rules, first, modelopt_algo, unquantized_only

V = "TensorRT Edge-LLM 0.11.0"
E = "tensorrt_edgellm/models/"  # its modeling files
DEPLOYS = ("FP8", "NVFP4", "MXFP8", "W8A8_SQ_PER_CHANNEL", "W4A16_AWQ")
UNNAMED = (f"{E}eagle3/modeling_eagle3_draft.py builds the draft layer's Linears with make_linear(config, ...) and "
           f"no module name")

_algo = modelopt_algo  # the quant_algo the ModelOpt encoding writes for the job (None: float or refused there)


def default_taps(n: int) -> tuple[int, ...]:
    """The hidden_states indices Edge-LLM 0.11's Llama / Qwen base export concatenates for an EAGLE-3 draft."""
    return (2, n // 2, n - 3)


def taps_of(job: Job) -> tuple[int, ...] | None:
    """The drafter's taps (its default ones when it records none), or None without a target depth."""
    if job.taps is not None:
        return tuple(job.taps)
    return default_taps(job.num_target_layers) if job.num_target_layers else None


def _taps(job: Job) -> str | None:
    if not job.facet.residual_taps:  # DFlash: the base reads the draft's dflash_config.target_layer_ids
        return None
    if job.num_target_layers is None:
        return (f"{V}'s base export feeds an EAGLE-3 draft hidden_states [2, L//2, L-3] of its target; this drafter "
                f"records no target depth L to check its taps against: re-save it attached to its target")
    n, taps = job.num_target_layers, taps_of(job)
    if taps == default_taps(n):
        return None
    return (f"{V}'s base export feeds an EAGLE-3 draft cat(hidden_states[2], hidden_states[L//2], "
            f"hidden_states[L-3]) of its target ({E}default/modeling_default.py CausalLM, eagle_base: layer_indices "
            f"= [2, n_layers // 2, n_layers - 3], whatever the draft's target_layer_ids; --eagle-draft-dir sets only "
            f"how many), here {list(default_taps(n))} for L = {n}; this drafter taps {list(taps or ())}, so it would "
            f"be fed other features. Re-distill it with the default taps (only Edge-LLM's Gemma4 base reads the "
            f"draft's)")


WHY = {
    "W4A16_NVFP4": (f"config.py _algo_to_quant_type maps every FP4 quant_algo to nvfp4, W4A4 (the weight-only "
                    f"nvfp4_a16 only for a nemotron_h MIXED_PRECISION checkpoint: _parse_mixed_precision), so "
                    f"{E}linear.py NVFP4LinearMethod would quantize this drafter's activations with input_scale 1.0 "
                    f"(its default buffer; none was calibrated), a drafter specpress did not measure (its "
                    f"--no-quantize-activations drops the activation Q/DQ of every Linear of an export, for "
                    f"isolating accuracy, not as a weight-only kernel). Quantize nvfp4 with --activations static "
                    f"(W4A4)"),
    "W8A16": ("config.py _algo_to_quant_type names no weight-only int8 (W8A8 / INT8 -> int8_sq only), so W8A16 "
              "falls back to float16 Linears (QUANT_FP16), which hold no int8 weight or weight_scale. Quantize int8 "
              "with --activations static (W8A8, SmoothQuant or rtn) or fp8"),
    "FP8_PER_CHANNEL_PER_TOKEN": (f"config.py _algo_to_quant_type maps every FP8 quant_algo to fp8, {E}linear.py "
                                  f"FP8Linear: a per-tensor weight_scale and a static per-tensor input_scale; "
                                  f"per-channel weights with per-token (or no) activation quantization have no form "
                                  f"there. Quantize fp8 per tensor (Fp8Config granularity \"tensor\") with "
                                  f"--activations static"),
}


def _scheme(job: Job) -> str | None:
    algo = _algo(job)
    if algo is None or algo in DEPLOYS:
        return None  # float, or refused by the ModelOpt encoding's own rule when the export writes it
    why = WHY.get(algo, "not among " + ", ".join(DEPLOYS))
    return f"{V} cannot export quant_algo {algo} as specpress measured it: {why}"


def _all_layer_linears(job: Job) -> str | None:
    if not job.quantized:
        return None
    float_layer = sorted(n for n in job.linears if n not in job.quantized and n not in ("fc", "lm_head"))
    if not float_layer:
        return None
    return (f"{V} quantizes every Linear of the draft layer with the checkpoint's scheme ({UNNAMED}, so "
            f"exclude_modules never reaches them); {', '.join(float_layer)} are float here: quantize all of the "
            f"layer's Linears (only fc and lm_head may stay float), or export the float drafter")


def _awq_aligned(job: Job) -> str | None:
    if _algo(job) != "W4A16_AWQ":
        return None
    bad = [f"{n} [{o}, {i}]" for n, (o, i) in job.linears.items() if n in job.quantized and (o % 64 or i % 64)]
    if not bad:
        return None
    return (f"{V} repacks W4A16_AWQ weights for its Int4GroupwiseGemmPluginV2 (checkpoint/repacking.py, the default "
            f"--int4-gemm-plugin-version 2), which needs out and in features divisible by 64; {', '.join(bad)} are "
            f"not: exclude them where the rules allow (fc, lm_head), or quantize with fp8 / nvfp4")


def _own_head(job: Job) -> str | None:
    if head_kind(job.config) != "shared":  # a shared head over a reduced vocabulary was refused (heads.py) already
        return None
    return f"{SHARED_HEAD}: this drafter has no lm_head of its own; prune without --share-head"


def _config(job: Job, cfg: dict[str, Any]) -> dict[str, Any]:
    if not job.facet.residual_taps:  # DFlash: dflash_config.target_layer_ids, which dflash.py reads
        return cfg
    return {**cfg, "target_layer_ids": list(taps_of(job) or ())}  # config.py reads it from the top level only


def _tensors(job: Job, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """SmoothQuant's / AWQ's pre_quant_scale in float16: INT8SQLinear multiplies its float16 input by it and
    requires float16 after (linear.py); the AWQ loader casts it to float16 itself (checkpoint/repacking.py)."""
    return {k: (v.to(torch.float16) if k.endswith(".pre_quant_scale") else v) for k, v in tensors.items()}


def _notes(job: Job) -> list[str]:
    notes = [f"{V} runs the draft in float16: float weights, activations and (where quantized) FP8's weight_scale / "
             f"input_scale, AWQ's weight_scale and the pre_quant_scales are rounded to float16 ({E}linear.py, "
             f"checkpoint/repacking.py); codes, block scales and NVFP4 / INT8 float32 scales are exported as written"]
    if _algo(job) == "MXFP8":
        notes.append(f"{V} quantizes the activations to MXFP8 at run time (trt::TRT_MXFP8DynamicQuantize, blocks "
                     f"of 32): the weights are specpress's, the activation exponents TensorRT's kernel picks")
    return notes


def _serve(job: Job) -> str:
    base = job.verifier or "TARGET"
    if job.traits.session == "block":  # DFlash: the draft is exported beside its base (its lm_head is the base's)
        return (f"tensorrt-edgellm-export {base} {job.out}-onnx --dflash-draft --dflash-draft-dir {job.out} && "
                f"tensorrt-edgellm-export {base} base-onnx --dflash-base --dflash-draft-dir {job.out}  (then "
                f"tensorrt-edgellm-build on the device)")
    return (f"tensorrt-edgellm-export {job.out} {job.out}-onnx && tensorrt-edgellm-export {base} base-onnx "
            f"--eagle-base --eagle-draft-dir {job.out}  (then tensorrt-edgellm-build on the device)")


SHARED_HEAD = (f"{V} builds the EAGLE-3 draft's lm_head [draft_vocab_size, hidden_size] from the draft checkpoint "
               f"({E}eagle3/modeling_eagle3_draft.py Eagle3DraftModel) and shares none of the base's")

RULES = Rules(
    refuse=first(unquantized_only(V), _own_head, _taps, _scheme, _all_layer_linears, _awq_aligned),
    notes=_notes,
    serve=_serve,
    ignore=lambda name, job: name,
    tensors=_tensors,
    config=_config,
    label=V,
    shared_head=SHARED_HEAD,
)
