"""SGLang 0.5.23's loading rules for a drafter (read from the PyPI wheel; files relative to sglang/srt/).

- Routes (`--speculative-algorithm`): EAGLE3 and EAGLE read the EAGLE layouts (srt/models/llama_eagle3.py
  LlamaForCausalLMEagle3, srt/models/llama_eagle.py LlamaForCausalLMEagle: `midlayer` / `layers.0`, d2t as its hot
  token map, a missing embed_tokens shared from the target), DFLASH the z-lab DFlash layout (models/dflash.py,
  speculative/dflash_utils.py parse_dflash_draft_config: dflash_config.target_layer_ids / mask_token_id,
  block_size), STANDALONE a plain HF LM (each family's route: its serving facet, export/hf/facets/). Its EAGLE-3 layers capture the residual entering layer j
  (srt/models/llama.py set_eagle3_layers_to_capture: eagle_aux_hidden_state_layer_ids + 1). MTP: no route.
- Quantized Linears: the draft's own quantization_config (configs/model_config.py; the draft inherits the target's
  --quantization unless --speculative-draft-model-quantization names one) as compressed-tensors
  (layers/quantization/compressed_tensors/compressed_tensors.py _get_scheme_from_parts: pack-quantized WNA16,
  int8 W8A8, fp8 W8A8 / W8A16, NVFP4 W4A16 / W4A4; the formats of utils.py is_activation_quantization_format
  only, so no MX). Module names: the EAGLE-3 layer is built with prefix `model` (model.qkv_proj,
  model.self_attn.o_proj, model.gate_up_proj, model.down_proj); `fc` is a plain torch Linear in both EAGLE models
  (never quantized; its loader fills fc.weight only); the head is quantized only when a target names it
  (get_lm_head_scheme). DFlash drafters build unquantized layers (models/dflash.py DFlashDraftModel
  supports_quantization = False; only Nemotron-3.5 drafts quantize). utils.py should_ignore_layer: `re:`
  entries match the name, plain ones also a dotted suffix; fused shards must agree (ValueError).
- The draft head (export/hf/heads.py): EAGLE-3's is one ParallelLMHead(draft_vocab_size, hidden_size), a
  STANDALONE draft's its LlamaForCausalLM lm_head. SGLang loads the target's lm_head into an EAGLE-3 drafter only
  when config.json has draft_vocab_size null (srt/models/llama_eagle3.py load_lm_head_from_target, then
  speculative/eagle_worker_v2.py init_lm_head set_embed_and_head); with a draft_vocab_size, a checkpoint without
  lm_head leaves the draft's own head unloaded. So a shared head over the whole vocabulary is written with
  draft_vocab_size null.
"""

from __future__ import annotations

import re

from specpress.export.hf.rules import (
    Job,
    Rules,
    first,
    fused_scales_differ,
    last_layer_tap,
    mixed_fused,
    quantized_named,
    unquantized_only,
)

V = "SGLang 0.5.23"
CT_FILE = "layers/quantization/compressed_tensors/compressed_tensors.py"
LOW_BIT = ("int3", "int2", "ternary")  # pack-quantized with num_bits 3 / 2 (ct_encodings.py)


def _scheme(job: Job) -> str | None:
    q = job.qcfg
    if q is None:
        return None
    if getattr(q, "has_pre_quant_scale", False):
        return (f"{V} reads a quantized drafter here as compressed-tensors ({CT_FILE}), whose schemes hold weights, "
                f"scales, zero points and input scales, not {q.method}'s pre_quant_scale: quantize with --method rtn "
                f"or gptq")
    if q.scheme in LOW_BIT:
        return (f"{V}'s compressed-tensors weight-only scheme takes 4- and 8-bit weights (srt/layers/quantization/"
                f"compressed_tensors/schemes/compressed_tensors_wNa16.py WNA16_SUPPORTED_TYPES_MAP; {CT_FILE} "
                f"_get_scheme_from_parts finds no scheme for a {q.scheme} pack-quantized group and raises 'No "
                f"compressed-tensors compatible scheme was found'): quantize with int4 or int8, or use --for vllm")
    if q.scheme in ("mxfp4", "mxfp8"):
        return (f"{V} has no compressed-tensors scheme for {q.scheme} (srt/{CT_FILE} _get_scheme_from_parts reads the "
                f"formats of compressed_tensors/utils.py is_activation_quantization_format: naive, int, float, "
                f"nvfp4-pack and pack-quantized, and raises 'No compressed-tensors compatible scheme was found' for "
                f"mxfp8-quantized / mxfp4-pack-quantized): quantize with fp8 or nvfp4, or use --for vllm")
    return None


def _plain_fc(job: Job) -> str | None:
    if job.route is None or not job.route.plain_fc or not quantized_named(job, "fc"):
        return None
    algo, model = job.route.name, job.route.plain_fc
    return (f"{V}'s {algo} `fc` is a plain torch Linear (srt/models/{model} LlamaModel.fc): its loader "
            f"fills fc.weight only, so a quantized fc would be dropped and the Linear left uninitialised. Keep it in "
            f"float: specpress quantize ... --exclude fc")


def _nvfp4_scales(job: Job) -> str | None:
    if job.scheme != "nvfp4":
        return None
    why = fused_scales_differ(job, ("weight_scale_2", "input_scale"))
    if why is None:
        return None
    return (f"{V} fuses q/k/v and gate/up into one NVFP4 Linear with one global scale, the max of the shards' "
            f"(srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py), without "
            f"rescaling the block scales: {why}. Re-quantize the full-precision drafter (specpress quantize shares "
            f"the global scale within a fused group)")


def ignore_entry(name: str, job: Job) -> str:
    """A leaf-name regex: SGLang's EAGLE-3 module names drop `self_attn` / `mlp` / `layers.0` for the fused and
    MLP Linears (model.qkv_proj, model.down_proj), so only the leaf is shared by every naming (a module is float
    in all layers or none: compressed_tensors.check_layer_uniform)."""
    return r"re:(.*\.)?" + re.escape(name.rpartition(".")[2]) + "$"


def _serve(job: Job) -> str:
    assert job.route is not None
    parts = [f"python -m sglang.launch_server --model-path {job.verifier or 'TARGET'}",
             f"--speculative-algorithm {job.route.name} --speculative-draft-model-path {job.out}"]
    if job.traits.session == "block":  # one pass drafts the whole block
        parts.append(f"--speculative-num-draft-tokens {job.config.block_size}")
    else:
        parts.append(f"--speculative-num-steps {job.tokens} --speculative-eagle-topk 1 "
                     f"--speculative-num-draft-tokens {job.tokens + 1}")
    if job.qcfg is not None:
        parts.append("--speculative-draft-model-quantization compressed-tensors")
    return " ".join(parts)


def _config(job: Job, cfg: dict) -> dict:
    if job.route is not None and job.route.architectures:  # SGLang picks the model class by this name
        cfg = {**cfg, "architectures": list(job.route.architectures)}
    if shares_target_head(job):  # the one config SGLang loads the target's lm_head for
        cfg = {**cfg, "draft_vocab_size": None}
    return cfg


def shares_target_head(job: Job) -> bool:
    """An EAGLE-3 export (a family with a reduced draft vocabulary) written without lm_head: a shared head over the
    target's whole vocabulary (a reduced one is refused or materialized before the job exists:
    export/hf/heads.py)."""
    return job.traits.draft_vocab == "reduced" and bool(getattr(job.config, "shared_head", False))


def _notes(job: Job) -> list[str]:
    notes = []
    if shares_target_head(job):
        notes.append(f"{V}: config.json has draft_vocab_size null, so SGLang loads the target's lm_head into the "
                     f"drafter (srt/models/llama_eagle3.py load_lm_head_from_target); specpress reads it back as the "
                     f"whole vocabulary")
    if job.qcfg is None:
        return notes
    return notes + [f"{V}: without --speculative-draft-model-quantization the draft inherits the target's "
                    f"--quantization (srt/arg_groups/serving_hook.py), which would override this drafter's "
                    f"compressed-tensors config"]


SHARED_HEAD = (f"{V} shares the target's lm_head with an EAGLE-3 drafter only when its config has draft_vocab_size "
               f"null (srt/models/llama_eagle3.py load_lm_head_from_target), and then the target's WHOLE head, whose "
               f"logits are the drafter's only when its draft vocabulary is the target's")


RULES = Rules(
    refuse=first(unquantized_only(V), _scheme, _plain_fc,
                 mixed_fused(V, f"srt/{CT_FILE.replace('compressed_tensors.py', 'utils.py')} should_ignore_layer "
                                f"raises a ValueError for shards with different schemes"),
                 last_layer_tap(V, "srt/models/llama.py set_eagle3_layers_to_capture captures the input of layer "
                                   "id + 1"),
                 _nvfp4_scales),
    notes=_notes,
    serve=_serve,
    ignore=ignore_entry,
    config=_config,
    label=V,
    shared_head=SHARED_HEAD,
)
