"""Why no serving engine serves specpress's mtp drafter (models/mtp.py): each engine's MTP routes load the MTP
layers of the target's own architecture."""

from __future__ import annotations

from specpress.export.hf.engines import EDGELLM, SGLANG, TRTLLM, VLLM
from specpress.export.hf.facets import ServingFacet, register_serving

_MTP = ("{label}'s MTP routes load the MTP layers of the target's own architecture ({where}); specpress's mtp "
        "drafter is a DeepSeek-style module on a dense Llama/Qwen3 block over a Llama target, which none of them "
        "builds. Serve an eagle3 or dflash drafter instead")

register_serving(ServingFacet(
    "mtp",
    no_route={
        VLLM: _MTP.format(label="vLLM 0.34", where="config/speculative.py hf_config_override maps deepseek_v3 to "
                                                  "DeepSeekMTPModel (MLA/MoE), mimo to MiMoMTP, qwen3_next, "
                                                  "glm4_moe, "
                                                  "... to their own MTP modules"),
        SGLANG: _MTP.format(label="SGLang 0.5.23", where="srt/models/deepseek_nextn.py, qwen3_next_mtp.py, "
                                                        "mimo_mtp.py, glm4_moe_nextn.py: each its target's block"),
        TRTLLM: _MTP.format(label="TensorRT-LLM", where="_torch/models/modeling_deepseekv3.py and its kin load the "
                                                       "nextn layers from the target checkpoint"),
        EDGELLM: _MTP.format(label="TensorRT Edge-LLM 0.11.0", where="model.py: MTP base only for Qwen3.5 and "
                                                                    "Nemotron-H checkpoints"),
    },
))
