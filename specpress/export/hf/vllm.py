"""vLLM 0.34.0's loading rules for a drafter (read from the PyPI wheel; files relative to vllm/).

- Routes (`--speculative-config` method): eagle3 and dflash in the speculators layout (transformers_utils/configs/
  speculators/algos.py update_eagle3 / update_dflash build the drafter's hf_config from transformer_layer_config
  plus the fields they copy), EAGLE-1 in its own layout (model_executor/models/llama_eagle.py), an independent LM
  as a plain HF dir (method draft_model). MTP: no route. Each family's route (its method name, the head vLLM builds
  for it) is in its serving facet (export/hf/facets/).
- Module names: draft decoder layers are numbered after the target's depth (`model.layers.{L + i}`:
  llama_eagle3.py / llama_eagle.py / qwen3_dflash.py start_layer_id); `fc` is `model.fc` (a ReplicatedLinear with
  the draft's quantization config); q/k/v and gate/up load into one fused Linear each.
- compressed-tensors matching (model_executor/layers/quantization/compressed_tensors/utils.py): `ignore` entries
  are equal names or `re:` regexes matched against those names unrewritten; a fused layer is ignored when its
  shards are, all alike or a ValueError; targets match by name, by class name (`Linear` is in every LinearBase),
  or shard-wise. The head (ParallelLMHead) is quantized only when a target names it (compressed_tensors.py
  get_quant_method).
- NVFP4 fused layers take the max of their shards' global scales without rescaling the block scales
  (compressed_tensors_w4a4_nvfp4.py process_weights_after_loading: it only warns).
- A speculators checkpoint whose verifier is a local path is refused by `vllm serve EXPORT`
  (transformers_utils/config.py maybe_override_with_speculators): serve the target with --speculative-config.
- The draft head (export/hf/heads.py): EAGLE-3's is one ParallelLMHead(draft_vocab_size, hidden_size)
  (model_executor/models/llama_eagle3.py), a draft model's its own LlamaForCausalLM lm_head. A checkpoint without
  lm_head leaves has_own_lm_head false (model_executor/models/utils.py process_eagle_weight) and the target's
  whole lm_head is installed (v1/worker/gpu/spec_decode/eagle/utils.py share_target_lm_head).
"""

from __future__ import annotations

import json

from specpress.export.hf.rules import Job, Rules, first, fused_scales_differ, last_layer_tap, mixed_fused, unquantized_only
from specpress.models.formats import compressed_tensors as ct

V = "vLLM 0.34"


def _pre_quant(job: Job) -> str | None:
    if job.qcfg is None or not getattr(job.qcfg, "has_pre_quant_scale", False):
        return None
    return (f"{V} reads a quantized drafter as compressed-tensors (model_executor/layers/quantization/"
            f"compressed_tensors/compressed_tensors.py: weights, scales, zero points and input scales) or as "
            f"ModelOpt's FP8 / NVFP4 (transformers_utils/model_arch_config_convertor.py accepts quant_algo FP8, "
            f"FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, MIXED_PRECISION); neither holds {job.qcfg.method}'s "
            f"pre_quant_scale: quantize with --method rtn or gptq")


def _three_bit(job: Job) -> str | None:
    if job.scheme != "int3":
        return None
    return (f"{V} sizes a 3-bit pack-quantized weight densely (model_executor/layers/quantization/compressed_tensors/"
            f"schemes/compressed_tensors_wNa16.py: pack_factor Fraction(32, 3), ceil(3K/32) int32 words, as "
            f"compressed-tensors 0.20 packs it) but unpacks it with the compressed-tensors it pins, 0.17.0, whose "
            f"unpack_from_int32 reads 10 codes per word with 2 bits of padding (compressors/pack_quantized/"
            f"helpers.py): the two layouts disagree for 3 bits (they agree for 2, 4 and 8). Quantize with int2 or int4")


def _nvfp4_scales(job: Job) -> str | None:
    if job.scheme != "nvfp4":
        return None
    why = fused_scales_differ(job, ("weight_scale_2", "input_scale"))
    if why is None:
        return None
    return (f"{V} fuses q/k/v and gate/up into one NVFP4 Linear with one global scale, the max of the shards' "
            f"(model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py "
            f"process_weights_after_loading), without rescaling the block scales, so the other shards would be "
            f"served rescaled: {why}. Re-quantize the full-precision drafter (specpress quantize shares the global "
            f"scale within a fused group)")


def _serve(job: Job) -> str:
    assert job.route is not None
    spec = {"model": str(job.out), "method": job.route.name, "num_speculative_tokens": job.tokens}
    return f"vllm serve {job.verifier or 'TARGET'} --speculative-config '{json.dumps(spec)}'"


def _notes(job: Job) -> list[str]:
    notes = []
    if job.layout == "speculators" and job.verifier and not _looks_like_hub_id(job.verifier):
        notes.append(f"{V} refuses `vllm serve {job.out}` when the recorded verifier is a local path "
                     f"(transformers_utils/config.py maybe_override_with_speculators): serve the target as above")
    if job.scheme in ("int2", "ternary"):
        notes.append(f"{V} takes {job.scheme}'s pack-quantized num_bits 2 "
                     f"(compressed_tensors/schemes/compressed_tensors_wNa16.py WNA16_SUPPORTED_TYPES_MAP holds 2-8), "
                     f"but on CUDA only its Humming kernel runs 2-bit weights (kernels/linear/__init__.py "
                     f"_POSSIBLE_KERNELS: Marlin, Machete, Conch, Exllama, Triton take 4 / 8 bits; humming-kernels "
                     f"is a dependency vLLM 0.34.0's wheel installs), or VLLM_BATCH_INVARIANT=1 (dequantize + "
                     f"matmul); without either the layer has no kernel")
    if job.scheme in ("mxfp4", "mxfp8"):
        notes.append(f"{V} picks the {job.scheme} kernel by GPU, not by the checkpoint: MXFP4 runs W4A4 on SM100 with "
                     f"FlashInfer and weight-only (Marlin) elsewhere (compressed_tensors_w4a4_mxfp4.py), so the "
                     f"activations served may differ from the {job.act_mode} ones specpress measured")
    return notes


def _looks_like_hub_id(s: str) -> bool:
    from pathlib import Path

    return not Path(s).expanduser().exists() and s.count("/") == 1 and not s.startswith((".", "/", "~"))


SHARED_HEAD = (f"{V} installs the target's WHOLE lm_head when the checkpoint has none (model_executor/models/utils.py "
               f"process_eagle_weight leaves has_own_lm_head false; v1/worker/gpu/spec_decode/eagle/utils.py "
               f"share_target_lm_head), which computes the drafter's logits only when its draft vocabulary is the "
               f"target's")


RULES = Rules(
    refuse=first(unquantized_only(V), _pre_quant, _three_bit,
                 mixed_fused(V, "model_executor/layers/quantization/compressed_tensors/utils.py should_ignore_layer "
                                "raises a ValueError for shards with different schemes"),
                 last_layer_tap(V, "model_executor/models/llama.py LlamaModel.forward collects tap j as hidden + "
                                   "residual after j layers, tap L before the final norm"),
                 _nvfp4_scales),
    notes=_notes,
    serve=_serve,
    ignore=lambda name, job: ct.name_pattern(name),
    label=V,
    shared_head=SHARED_HEAD,
)
