"""How the serving engines serve an eagle3 drafter (models/eagle3.py): speculators for vLLM, the public EAGLE-3
layout for SGLang, TensorRT-LLM and TensorRT Edge-LLM (with a top-level target_layer_ids). The rules are read from
the engine versions in export/hf/engines.py."""

from __future__ import annotations

from specpress.export.hf.engines import EDGELLM, SGLANG, TRTLLM, VLLM
from specpress.export.hf.facets import Route, ServingFacet, register_serving

register_serving(ServingFacet(
    "eagle3",
    routes={
        VLLM: Route("speculators", "eagle3",
                    own_head="builds an EAGLE-3 drafter's lm_head as one ParallelLMHead(draft_vocab_size, hidden_size) "
                             "(model_executor/models/llama_eagle3.py Eagle3LlamaForCausalLM), which has no place for "
                             "two factors"),
        SGLANG: Route("public", "EAGLE3",
                      own_head="builds an EAGLE-3 drafter's lm_head as one ParallelLMHead(draft_vocab_size, "
                               "hidden_size) (srt/models/llama_eagle3.py LlamaForCausalLMEagle3), which has no place "
                               "for two factors",
                      plain_fc="llama_eagle3.py"),
        TRTLLM: Route("public", "Eagle3",
                      own_head="builds an EAGLE-3 drafter's lm_head as one [draft_vocab_size, hidden_size] Linear "
                               "(_torch/models/modeling_speculative.py Eagle3ForCausalLM), which has no place for two "
                               "factors",
                      serve_taps=True),
        EDGELLM: Route("public", "eagle3",
                       own_head="builds an EAGLE-3 draft's lm_head as one [draft_vocab_size, hidden_size] Linear "
                                "(tensorrt_edgellm/models/eagle3/modeling_eagle3_draft.py Eagle3DraftModel), which "
                                "has no place for two factors"),
    },
    own_head="vLLM builds an EAGLE-3 drafter's lm_head as one ParallelLMHead(draft_vocab_size, hidden_size) and "
             "TensorRT-LLM as one LMHead (vLLM model_executor/models/llama_eagle3.py, TensorRT-LLM "
             "_torch/models/modeling_speculative.py)",
    residual_taps=True,
    fused_input_norms=("input_layernorm", "hidden_norm"),
))
