"""How the serving engines serve a dflash drafter (models/dflash.py): speculators for vLLM, the z-lab DFlash
layout for SGLang, TensorRT-LLM and TensorRT Edge-LLM, all in float only (Edge-LLM: as far as specpress proves)."""

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
        EDGELLM: Route("public", "dflash",
                       no_quant="exports a DFlash draft beside its base (tensorrt-edgellm-export BASE OUT "
                                "--dflash-draft --dflash-draft-dir DRAFT); specpress proves that route in float only "
                                "(tests/export/test_edgellm_exports.py), not its quantized DFlash drafts: export the "
                                "full-precision drafter (quantize --dequantize), or use --for vllm"),
    },
))
