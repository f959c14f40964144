"""How the serving engines serve an EAGLE-1 drafter (models/eagle.py): its own layout for vLLM and SGLang; no
route in TensorRT-LLM's PyTorch backend."""

from __future__ import annotations

from specpress.export.hf.engines import EDGELLM, SGLANG, TRTLLM, VLLM
from specpress.export.hf.facets import Route, ServingFacet, register_serving

register_serving(ServingFacet(
    "eagle",
    routes={
        VLLM: Route("public", "eagle"),
        # SGLang picks the EAGLE-1 model class by this name (no override of the draft's)
        SGLANG: Route("public", "EAGLE", plain_fc="llama_eagle.py", architectures=("LlamaForCausalLMEagle",)),
    },
    no_route={
        TRTLLM: "TensorRT-LLM's PyTorch backend registers EAGLE-3 draft models only (_torch/models/"
                "modeling_speculative.py: Eagle3ForCausalLM; an Eagle decoding config runs the EAGLE-3 path), so an "
                "EAGLE-1 drafter has no route: distill an eagle3 drafter",
        EDGELLM: "TensorRT Edge-LLM 0.11.0 recognises an EAGLE draft only as EAGLE-3 (config.py: an architecture "
                 "containing Eagle3, or ttt_length; model.py Eagle3DraftModel), so an EAGLE-1 drafter has no route: "
                 "distill an eagle3 drafter",
    },
))
