"""How the serving engines serve an lm drafter (models/lm.py): a plain HF decoder, each engine's draft-model
mode (vLLM's draft_model, SGLang's STANDALONE, TensorRT-LLM's DraftTarget)."""

from __future__ import annotations

from specpress.export.hf.engines import EDGELLM, SGLANG, TRTLLM, VLLM
from specpress.export.hf.facets import Route, ServingFacet, register_serving

register_serving(ServingFacet(
    "lm",
    routes={
        VLLM: Route("hf", "draft_model",
                    own_head="loads a draft model (method draft_model) as a plain HF decoder whose lm_head is one "
                             "[vocab_size, hidden_size] ParallelLMHead (model_executor/models/llama.py "
                             "LlamaForCausalLM)"),
        SGLANG: Route("hf", "STANDALONE",
                      own_head="loads a STANDALONE draft model as a plain HF decoder whose lm_head is one [vocab_size, "
                               "hidden_size] ParallelLMHead (srt/models/llama.py LlamaForCausalLM)"),
        TRTLLM: Route("hf", "DraftTarget",
                      own_head="loads a DraftTarget draft model as a plain HF decoder whose lm_head is one "
                               "[vocab_size, hidden_size] Linear (_torch/models/modeling_llama.py LlamaForCausalLM)"),
    },
    no_route={
        EDGELLM: "TensorRT Edge-LLM 0.11.0 has no draft-model mode: a draft engine is an EAGLE-3, MTP, DFlash, JetSpec "
                 "or DSpark one (checkpoint/checkpoint_utils.py _determine_spec_decode_type), so an independent lm "
                 "drafter has no route",
    },
    own_head="an lm drafter is served as a plain HF decoder (vLLM's draft-model mode, HF assisted generation, "
             "TensorRT-LLM), whose lm_head is one [vocab_size, hidden_size] Linear",
))
