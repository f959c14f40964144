"""The engines' own code reads what `export hf` writes for the activation and NVFP4 schemes, on CPU:

- compressed-tensors 0.20.1: `QuantizationConfig` parses our quantization_config; the format it infers for the
  parsed scheme (`infer_module_format`) is the one we wrote; where it has a preset for the scheme (FP8,
  FP8_DYNAMIC, W8A8, NVFP4, NVFP4A16, MXFP8(A16), MXFP4(A16)) ours equals it; its compressors decompress our tensors to our dequantized
  weights; its `fake_quantize` with our input_scale (or per-token scales) quantizes activations as ours do.
- nvidia-modelopt 0.47: `process_layer_quant_config` (the writer of hf_quant_config.json) gives our quant_algo
  and fields for the format ModelOpt would name the layer; `NVFP4QTensor` / `FP8QTensor` / `MXFP8QTensor` dequantize our
  tensors to our weights bit for bit; `pack_int4_in_uint8` / `to_quantized_weight` (its INT4-AWQ / INT8 export)
  give our bytes from our weights and scales.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from drafters_common import randomize
from safetensors.torch import load_file

from specpress.compress.quantize.api import quantize
from specpress.export.hf import export_hf
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import save_drafter
from specpress.models.lm import LMConfig
from specpress.models.quantized import minifloat as M
from specpress.models.quantized.activations import per_token_amax
from specpress.models.quantized.modules import quantized_modules
from specpress.models.quantized.scheme import config_for

CFG = LMConfig(vocab_size=61, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)
IDS = torch.randint(1, 61, (2, 12), generator=torch.Generator().manual_seed(3))


def fp8(act: str, granularity: str = "channel"):
    return replace(config_for("fp8", activations=act), granularity=granularity)


def exported(cfg, fmt, tmp_path):
    """(the quantized drafter, its export's tensors, the export dir)."""
    d = randomize(build_drafter(CFG), 1)
    quantize(d, cfg, calibration=lambda m: m(IDS))
    out = export_hf(save_drafter(d, tmp_path / "src"), tmp_path / "out", fmt).out
    return d, load_file(str(out / "model.safetensors")), out


def local(tensors, name):
    return {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".") and not k.endswith(".bias")}


# ---------------------------------------------------------------------------------------------- compressed-tensors

CT_CELLS = {  # name -> (config, compressed-tensors preset it equals or None)
    "fp8-none": (fp8("none"), None), "fp8-dynamic": (fp8("dynamic"), "FP8_DYNAMIC"), "fp8-static": (fp8("static"), None),
    "fp8-tensor-none": (fp8("none", "tensor"), None), "fp8-tensor-dynamic": (fp8("dynamic", "tensor"), None),
    "fp8-tensor-static": (fp8("static", "tensor"), "FP8"),
    "int8-dynamic": (config_for("int8", activations="dynamic"), "W8A8"),
    "int8-static": (config_for("int8", activations="static"), None),
    "int8-gptq-static": (config_for("int8", "gptq", activations="static"), None),
    "nvfp4": (config_for("nvfp4"), "NVFP4A16"), "nvfp4-static": (config_for("nvfp4", activations="static"), "NVFP4"),
    "mxfp8": (config_for("mxfp8", activations="none"), "MXFP8A16"), "mxfp8-dynamic": (config_for("mxfp8"), "MXFP8"),
    "mxfp4": (config_for("mxfp4", activations="none"), "MXFP4A16"), "mxfp4-dynamic": (config_for("mxfp4"), "MXFP4"),
}


@pytest.mark.parametrize("cell", list(CT_CELLS))
def test_compressed_tensors_reads_our_activation_and_nvfp4_schemes(cell, tmp_path):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.compressors.format import infer_module_format
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import (
        QuantizationConfig,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.lifecycle.forward import (
        dequantize,
        fake_quantize,
    )

    cfg, preset = CT_CELLS[cell]
    d, tensors, out = exported(cfg, "speculators", tmp_path)
    qc = QuantizationConfig.model_validate(json.loads((out / "config.json").read_text())["quantization_config"])
    scheme = qc.config_groups["group_0"]
    inferred = infer_module_format(torch.nn.Linear, scheme.model_copy(update={"format": None})).value
    # weight-only fp8: compressed-tensors infers its naive-quantized (float-quantized needs input_activations);
    # we keep float-quantized, the format earlier exports carried; both compressors decode the same tensors
    assert inferred == scheme.format or (cell.endswith("-none") and inferred == "naive-quantized"), inferred
    if preset:
        ref = preset_name_to_scheme(preset, ["Linear"])
        assert ref.weights == scheme.weights and ref.input_activations == scheme.input_activations
    assert (scheme.input_activations is None) == (cfg.act_mode == "none")
    compressor = BaseCompressor.load_from_registry(scheme.format)
    mods = quantized_modules(d)
    assert len(mods) == 7
    for name, mod in mods.items():
        loc, ours = local(tensors, name), mod.dequantize(torch.float32)
        dense = compressor.decompress(dict(loc), scheme)["weight"]
        if inferred != scheme.format:
            assert torch.equal(BaseCompressor.load_from_registry(inferred).decompress(dict(loc), scheme)["weight"], dense)
        if cfg.scheme in ("mxfp4", "mxfp8"):  # decompressed in bf16 (its e8m0 scales as bf16, exact powers of 2)
            assert torch.equal(dense, ours.to(dense.dtype)), name
            continue
        if cfg.scheme != "nvfp4":
            assert torch.equal(dense.float(), ours), name
        else:  # decompressed in bf16 by design; in fp32: our codes exactly, the scale product within one rounding
            assert dense.dtype == torch.bfloat16 and torch.allclose(dense.float(), ours, rtol=2 ** -8, atol=0), name
            n, half = loc["weight_packed"].shape
            vals = unpack_fp4_from_uint8(loc["weight_packed"], n, 2 * half, dtype=torch.float32)
            assert torch.equal(vals, M.e2m1_values(mod.codes())), name
            deq = dequantize(vals, loc["weight_scale"].float(), args=scheme.weights,
                             global_scale=loc["weight_global_scale"], dtype=torch.float32)
            assert torch.allclose(deq, ours, rtol=2.5e-7, atol=0), name
            if cfg.act_mode == "static":
                assert torch.allclose(1 / loc["input_global_scale"], mod.input_scale.reshape(1), rtol=1.2e-7, atol=0)
            continue
        if cfg.act_mode == "none":
            continue
        a = scheme.input_activations
        x = torch.randn(3, 5, mod.in_features, generator=torch.Generator().manual_seed(0)) * 2
        if a.dynamic:
            scale = per_token_amax(x) / (448.0 if a.type == "float" else 127.0)
        else:
            scale = loc["input_scale"]
            assert torch.equal(scale.reshape(()), mod.input_scale), name
        zp = torch.zeros_like(scale) if a.type == "int" else None
        assert torch.equal(fake_quantize(x, scale, zp, a), mod.quantize_input(x)), name


# ---------------------------------------------------------------------------------------------- ModelOpt

MO_CELLS = {  # name -> (config, the quantization format ModelOpt's get_quantization_format names such a layer)
    "fp8-tensor-static": (fp8("static", "tensor"), "fp8"), "fp8-dynamic": (fp8("dynamic"), "fp8_pc_pt"),
    "fp8-tensor-dynamic": (fp8("dynamic", "tensor"), "fp8_pc_pt"),
    "nvfp4-static": (config_for("nvfp4", activations="static"), "nvfp4"),
    "nvfp4": (config_for("nvfp4"), "w4a16_nvfp4"),
    "int4-awq": (config_for("int4", "awq"), "int4_awq"), "int4-rtn": (config_for("int4"), "int4_awq"),
    "int8-smoothquant": (config_for("int8", "smoothquant"), "int8_sq"),
    "int8-static": (config_for("int8", activations="static"), "int8_sq"), "int8": (config_for("int8"), "int8_wo"),
    "mxfp8-dynamic": (config_for("mxfp8"), "mxfp8"),
}


@pytest.mark.parametrize("cell", list(MO_CELLS))
def test_modelopt_reads_our_unified_checkpoint(cell, tmp_path):
    pytest.importorskip("modelopt.torch.quantization.qtensor")
    from modelopt.torch.export.quant_utils import (
        pack_int4_in_uint8,
        process_layer_quant_config,
        to_quantized_weight,
    )
    from modelopt.torch.quantization.qtensor import (
        FP8QTensor,
        MXFP8QTensor,
        NVFP4QTensor,
    )

    cfg, fmt = MO_CELLS[cell]
    d, tensors, out = exported(cfg, "modelopt", tmp_path)
    hq = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    block = 16 if "nvfp4" in fmt else 32 if fmt == "mxfp8" else (cfg.group_size or 0) if fmt == "int4_awq" else 0
    ref = process_layer_quant_config({"m.l.quantization": fmt, "m.l.awq_block_size": block})
    assert {k: hq.get(k) for k in ref if k not in ("exclude_modules", "kv_cache_quant_algo")} == \
        {k: v for k, v in ref.items() if k not in ("exclude_modules", "kv_cache_quant_algo")}
    for name, mod in quantized_modules(d).items():
        loc, ours = local(tensors, name), mod.dequantize(torch.float32)
        if cfg.scheme == "nvfp4":
            q = NVFP4QTensor(ours.shape, torch.float32, loc["weight"])
            got = q.dequantize(torch.float32, scale=loc["weight_scale"], double_scale=loc["weight_scale_2"],
                               block_sizes={-1: 16})
            assert torch.equal(got, ours), name
        elif cfg.scheme == "fp8":
            s = loc["weight_scale"]
            got = FP8QTensor(ours.shape, torch.float32, loc["weight"]).dequantize(
                torch.float32, scale=s if s.dim() == 0 else s[:, None])
            assert torch.equal(got, ours), name
        elif cfg.scheme == "mxfp8":
            got = MXFP8QTensor(ours.shape, torch.float32, loc["weight"]).dequantize(torch.float32, scale=loc["weight_scale"])
            assert torch.equal(got, ours), name
        elif cfg.scheme == "int4":
            assert torch.equal(pack_int4_in_uint8(ours, loc["weight_scale"], cfg.group_size), loc["weight"]), name
        else:
            assert torch.equal(to_quantized_weight(ours, loc["weight_scale"], fmt), loc["weight"]), name
        assert ("input_scale" in loc) == (cfg.act_mode == "static"), name
        assert ("pre_quant_scale" in loc) == cfg.has_pre_quant_scale, name
        if cfg.act_mode == "static":
            assert loc["input_scale"].shape == () and torch.equal(loc["input_scale"], mod.input_scale), name
        if cfg.has_pre_quant_scale:
            assert torch.equal(loc["pre_quant_scale"], mod.pre_quant_scale), name
