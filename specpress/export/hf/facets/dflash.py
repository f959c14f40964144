"""How the serving engines serve a dflash drafter (models/dflash.py): speculators for vLLM, the z-lab DFlash
layout for SGLang and TensorRT-LLM, both of which serve its layers in float only."""

from __future__ import annotations

from specpress.export.hf.engines import EDGELLM, SGLANG, TRTLLM, VLLM
from specpress.export.hf.facets import Route, ServingFacet, register_serving

register_serving(ServingFacet(
    "dflash",
    routes={
        VLLM: Route("speculators", "dflash"),
        SGLANG: Route("public", "DFLASH",
                      no_quant="builds DFlash draft layers unquantized (srt/models/dflash.py "
                               "DFlashDraftModel.supports_quantization is False: only Nemotron-3.5 drafts take a "
                               "quantization config), so a quantized dflash drafter has no route: export the "
                               "full-precision drafter (quantize --dequantize), or use --for vllm"),
        TRTLLM: Route("public", "DFlash",
                      no_quant="stacks every DFlash layer's K/V rows of qkv_proj.weight into one float buffer after "
                               "loading (_torch/models/modeling_dflash.py _build_fused_kv_buffers), which a quantized "
                               "Linear has no float weight for: export the full-precision drafter (quantize "
                               "--dequantize), or use --for vllm"),
    },
    no_route={
        EDGELLM: ("TensorRT Edge-LLM 0.11.0 exports a DFlash draft beside its base (tensorrt-edgellm-export BASE OUT "
                  "--dflash-draft --dflash-draft-dir DRAFT), a route specpress's --for edgellm does not write or "
                  "prove yet: it writes eagle3 drafters (that exporter has read --for sglang's z-lab layout)"),
    },
))
