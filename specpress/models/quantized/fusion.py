"""The Linears serving engines fuse into one: q/k/v into `qkv_proj`, gate/up into `gate_up_proj`.

vLLM (0.34 `model_executor/models/llama.py` packed_modules_mapping), SGLang (0.5.23 the stacked-params mapping
of `srt/models/llama_eagle3.py`) and TensorRT-LLM (`_torch/modules/linear.py` WeightMode.FUSED_QKV_LINEAR /
FUSED_GATE_UP_LINEAR) load each group into one Linear with one quantization scheme and, for the schemes with
a tensor-level scale, ONE such scale: TensorRT-LLM asserts NVFP4's `weight_scale_2` and `input_scale` equal
across the group (NVFP4LinearMethod.load_weight_scales), vLLM takes their max (modelopt.py /
compressed_tensors_w4a4_nvfp4.py process_weights_after_loading) without rescaling the block scales. So a
scheme with a per-tensor scale shares it over each group at quantize time (nvfp4.py), as Model Optimizer's
export does (unified_export_hf.py preprocess_linear_fusion), and the exports check it (export/hf/).
"""

from __future__ import annotations

from collections.abc import Iterable

FUSED: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
FUSED_NAMES = {"qkv_proj": FUSED[0], "gate_up_proj": FUSED[1]}  # the fused module's name -> its members


def fused_groups(names: Iterable[str]) -> list[list[str]]:
    """The groups of `names` an engine fuses: members of one FUSED tuple under one parent, in FUSED order
    (a group of one is not returned)."""
    have = set(names)
    out = []
    for parent in sorted({n.rpartition(".")[0] for n in have}):
        for group in FUSED:
            members = [f"{parent}.{m}" if parent else m for m in group]
            present = [m for m in members if m in have]
            if len(present) > 1:
                out.append(present)
    return out


def group_of(name: str) -> tuple[str, ...] | None:
    """The FUSED tuple `name`'s leaf belongs to, or None."""
    leaf = name.rpartition(".")[2]
    return next((g for g in FUSED if leaf in g), None)
