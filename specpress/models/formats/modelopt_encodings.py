"""ModelOpt unified-checkpoint encodings of the quantization schemes (facets "modelopt", encodings.py).

Read from nvidia-modelopt 0.47 `torch/export/quant_utils.py` (`get_quantization_format`, which names a
Linear's format from its quantizers; `process_layer_quant_config`, which turns it into hf_quant_config.json's
`quant_algo`; `to_quantized_weight`, `pack_int4_in_uint8`) and `torch/export/unified_export_hf.py` (the
scale tensors it registers). Per Linear (N = out_features, K = in_features):

    quant_algo                  specpress config                  tensors
    FP8                         fp8, tensor weights, static acts  weight e4m3 [N, K], weight_scale f32 [], input_scale f32 []
    FP8_PER_CHANNEL_PER_TOKEN   fp8, dynamic (or none: noted)     weight e4m3 [N, K], weight_scale f32 [N] (a per-tensor
                                                                  scale repeated N times: the same products)
    NVFP4 (group_size 16)       nvfp4, static acts (W4A4)         weight uint8 [N, K/2], weight_scale e4m3 [N, K/16],
                                                                  weight_scale_2 f32 [], input_scale f32 []
    W4A16_NVFP4                 nvfp4, weight-only                the same, without input_scale
    W4A16_AWQ (group_size G)    int4 symmetric, groups G          weight uint8 [N/2, K]: signed codes, output rows 2i in
                                (awq: + pre_quant_scale f32 [K])  the low nibble, 2i+1 high; weight_scale f32 [N, K/G]
    W8A16                       int8 symmetric per channel        weight int8 [N, K], weight_scale f32 [N]
    W8A8_SQ_PER_CHANNEL         int8 per channel, static acts     the same + input_scale f32 [] (smoothquant: +
                                                                  pre_quant_scale f32 [K])
    MXFP8 (group_size 32)       mxfp8, dynamic MX activations     weight e4m3 [N, K], weight_scale uint8 e8m0 [N, K/32]

Every code and scale is specpress's own, re-laid out. Refused with the rule: fp8 per-channel weights with
static activations, dynamic int8 activations, grouped or asymmetric int8, asymmetric or per-channel int4,
mxfp4 (no MXFP4 quant_algo for a Linear) and weight-only mxfp8 (MXFP8 quantizes the inputs too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from specpress.errors import CheckpointError
from specpress.models.formats.encodings import MODELOPT, Encoding
from specpress.models.quantized import primitives as P
from specpress.models.quantized.modules import checked_tensor
from specpress.models.quantized.scheme import register_facet

V = "ModelOpt 0.47 torch/export/quant_utils.py"
PC_PT = "FP8_PER_CHANNEL_PER_TOKEN"
SGLANG = ("not for SGLang: its ModelOpt FP8 config (0.5.x) loads static per-tensor FP8 (quant_algo \"FP8\") only, "
          "and its EAGLE-3 fc is a plain Linear that would drop an fp8 scale (keep fc in float with --exclude fc)")


def _get(tensors: Mapping[str, Tensor], key: str, dtype: torch.dtype, shape: tuple[int, ...], where: str,
         algo: str) -> Tensor:
    return checked_tensor(tensors, key, dtype, shape, where, "ModelOpt", f"quant_algo {algo}")


def _scalar(t: Tensor) -> Tensor:
    return t.float().reshape(()).contiguous()


def _input_scale(stored: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {"input_scale": _scalar(stored["input_scale"])} if "input_scale" in stored else {}


def _read_input_scale(tensors: Mapping[str, Tensor], c: Any, where: str, algo: str) -> dict[str, Tensor]:
    return {"input_scale": _get(tensors, "input_scale", torch.float32, (), where, algo)} if c.act_mode == "static" \
        else {}


def _pre_quant_scale(stored: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {"pre_quant_scale": stored["pre_quant_scale"].float()} if "pre_quant_scale" in stored else {}


# ---------------------------------------------------------------------------------------------- fp8


def _fp8_refuse(c: Any) -> str | None:
    if c.act_mode == "static" and c.granularity == "channel":
        return (f"ModelOpt's unified checkpoint has no per-channel fp8 with a static input_scale: its static fp8 "
                f"(quant_algo FP8) scales weights per tensor, and {PC_PT} quantizes activations per token ({V}: "
                f"get_quantization_format, process_layer_quant_config). Re-quantize with per-tensor weights "
                f"(Fp8Config granularity \"tensor\", --activations static), or export with --format speculators")
    return None


def _fp8_algo(c: Any) -> str:
    return "FP8" if c.act_mode == "static" else PC_PT


def _fp8_encode(stored: Mapping[str, Tensor], c: Any) -> dict[str, Tensor]:
    w, s = stored["weight_fp8"], stored["scales"].float()
    if _fp8_algo(c) == "FP8":
        return {"weight": w, "weight_scale": _scalar(s), **_input_scale(stored)}
    return {"weight": w, "weight_scale": s.expand(w.shape[0]).contiguous()}


def _fp8_decode(tensors: Mapping[str, Tensor], c: Any, shape: tuple[int, int], where: str) -> dict[str, Tensor]:
    n, k = shape
    algo = _fp8_algo(c)
    w = _get(tensors, "weight", torch.float8_e4m3fn, (n, k), where, algo)
    if algo == "FP8":
        return {"weight_fp8": w, "scales": _get(tensors, "weight_scale", torch.float32, (), where, algo).reshape(1),
                **_read_input_scale(tensors, c, where, algo)}
    s = _get(tensors, "weight_scale", torch.float32, (n,), where, algo)
    if c.granularity == "tensor":
        if not torch.equal(s, s[:1].expand(n)):
            raise CheckpointError(f"{where}.weight_scale: the recorded fp8 config is per tensor but the {n} stored "
                                  f"scales differ; the file was edited: re-export it")
        s = s[:1]
    return {"weight_fp8": w, "scales": s.contiguous()}


def _fp8_notes(c: Any, shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    if c.act_mode == "none":
        return [(f"ModelOpt has no per-channel fp8 weight-only algorithm: written as {PC_PT}, so TensorRT-LLM / vLLM "
                f"also quantize the drafter's activations per token (dynamic), which specpress did not measure; "
                f"re-measure tau on the server"), SGLANG]
    if _fp8_algo(c) == "FP8":
        return [("quant_algo FP8: per-tensor e4m3 weights and the static input_scale specpress calibrated (what "
                "SGLang's ModelOpt FP8 config reads; its EAGLE-3 fc is a plain Linear: keep fc in float with "
                "--exclude fc for SGLang)")]
    return [f"{PC_PT}: per-channel e4m3 weights, activations per token at run time (what specpress measured)", SGLANG]


register_facet(MODELOPT, "fp8")(Encoding(
    MODELOPT, f"fp8 (FP8: per-tensor weights + static activations; {PC_PT}: dynamic or weight-only)", _fp8_refuse,
    lambda c: {"quant_algo": _fp8_algo(c)}, _fp8_encode, _fp8_decode, _fp8_notes))


# ---------------------------------------------------------------------------------------------- nvfp4


def _nvfp4_spec(c: Any) -> dict[str, Any]:
    return {"quant_algo": "NVFP4" if c.act_mode == "static" else "W4A16_NVFP4", "group_size": 16}


def _nvfp4_encode(stored: Mapping[str, Tensor], c: Any) -> dict[str, Tensor]:
    return {"weight": stored["weight"], "weight_scale": stored["weight_scale"],
            "weight_scale_2": _scalar(stored["weight_scale_2"]), **_input_scale(stored)}


def _nvfp4_decode(tensors: Mapping[str, Tensor], c: Any, shape: tuple[int, int], where: str) -> dict[str, Tensor]:
    n, k = shape
    algo = _nvfp4_spec(c)["quant_algo"]
    return {"weight": _get(tensors, "weight", torch.uint8, (n, k // 2), where, algo),
            "weight_scale": _get(tensors, "weight_scale", torch.float8_e4m3fn, (n, k // 16), where, algo),
            "weight_scale_2": _get(tensors, "weight_scale_2", torch.float32, (), where, algo),
            **_read_input_scale(tensors, c, where, algo)}


def _nvfp4_notes(c: Any, shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    return [("nvfp4: q/k/v and gate/up each share one weight_scale_2 when specpress quantized them (as ModelOpt 0.47's "
            "export does, unified_export_hf.py preprocess_linear_fusion: the engines fuse them under one global scale); "
            "export hf --for checks it and refuses a drafter whose fused Linears differ")]


register_facet(MODELOPT, "nvfp4")(Encoding(
    MODELOPT, "nvfp4 (NVFP4: W4A4 with static activations; W4A16_NVFP4: weight-only)", lambda c: None, _nvfp4_spec,
    _nvfp4_encode, _nvfp4_decode, _nvfp4_notes))


# ---------------------------------------------------------------------------------------------- integer codes


def _int_refuse(c: Any) -> str | None:
    if not c.symmetric:
        return (f"ModelOpt's integer formats have no zero points (W4A16_AWQ has_zero_point false, W8A16 / "
                f"W8A8_SQ_PER_CHANNEL symmetric; {V} process_layer_quant_config): quantize symmetric, or export "
                f"with --format speculators")
    if c.bits == 4 and c.group_size is None:
        return (f"ModelOpt's int4 format (W4A16_AWQ) is block-wise ({V} pack_int4_in_uint8 takes a block size): "
                f"quantize int4 with --group-size 64 or 128")
    if c.bits == 8 and c.group_size is not None:
        return (f"ModelOpt's int8 formats (W8A16, W8A8_SQ_PER_CHANNEL) scale each output channel ({V} "
                f"to_quantized_weight): quantize int8 without --group-size")
    if c.act_mode == "dynamic":
        return (f"ModelOpt's int8 with quantized activations is W8A8_SQ_PER_CHANNEL, a static per-tensor input_scale "
                f"({V} get_quantization_format: INT8_SQ); it has no per-token int8 activations: quantize with "
                f"--activations static, or export with --format speculators")
    return None


def _int_algo(c: Any) -> str:
    if c.bits == 4:
        return "W4A16_AWQ"
    return "W8A8_SQ_PER_CHANNEL" if c.act_mode == "static" else "W8A16"


def _int_spec(c: Any) -> dict[str, Any]:
    algo = _int_algo(c)
    if algo == "W4A16_AWQ":
        return {"quant_algo": algo, "group_size": c.group_size, "has_zero_point": False, "pre_quant_scale": True}
    return {"quant_algo": algo}


def pack_int4_rows(codes: Tensor) -> Tensor:
    """Unsigned int4 codes [N, K] (zero point 8) -> ModelOpt's W4A16_AWQ weight uint8 [N/2, K]: the signed code of
    output row 2i in the low nibble, row 2i+1 in the high (pack_int4_in_uint8)."""
    s = (codes.to(torch.int16) - 8).to(torch.uint8) & 0x0F
    return (s[0::2] | (s[1::2] << 4)).contiguous()


def unpack_int4_rows(b: Tensor) -> Tensor:
    """pack_int4_rows' inverse: uint8 [N/2, K] -> unsigned codes [N, K] (uint8)."""
    lo, hi = (b & 0x0F).to(torch.int16), (b >> 4).to(torch.int16)
    signed = torch.stack([lo, hi], dim=1).reshape(-1, b.shape[1])
    signed = torch.where(signed > 7, signed - 16, signed)
    return (signed + 8).to(torch.uint8)


def _int_encode(stored: Mapping[str, Tensor], c: Any) -> dict[str, Tensor]:
    q, s = stored["qweight"], stored["scales"]
    extra = {**_input_scale(stored), **_pre_quant_scale(stored)}
    if c.bits == 4:
        if q.shape[0] % 2:
            from specpress.errors import ConfigError

            raise ConfigError(f"ModelOpt's W4A16_AWQ packs two output rows per byte ({V} pack_int4_in_uint8): an "
                              f"int4 Linear with {q.shape[0]} output features cannot be written; exclude it")
        return {"weight": pack_int4_rows(P.unpack_int4(q)), "weight_scale": s.float().contiguous(), **extra}
    return {"weight": q, "weight_scale": s.float().reshape(-1).contiguous(), **extra}


def _int_decode(tensors: Mapping[str, Tensor], c: Any, shape: tuple[int, int], where: str) -> dict[str, Tensor]:
    n, k = shape
    algo = _int_algo(c)
    out = _read_input_scale(tensors, c, where, algo)
    if c.has_pre_quant_scale:
        # ModelOpt writes it in the model's dtype; specpress in float32, or float16 for Edge-LLM (export/hf/edgellm.py)
        pqs = tensors.get("pre_quant_scale")
        dt = pqs.dtype if pqs is not None and pqs.dtype in (torch.float16, torch.bfloat16) else torch.float32
        out["pre_quant_scale"] = _get(tensors, "pre_quant_scale", dt, (k,), where, algo).float()
    if c.bits == 4:
        w = _get(tensors, "weight", torch.uint8, (n // 2, k), where, algo)
        ng = P.num_groups(k, c.group_size)
        return {"qweight": P.pack_int4(unpack_int4_rows(w)),
                "scales": _get(tensors, "weight_scale", torch.float32, (n, ng), where, algo), **out}
    return {"qweight": _get(tensors, "weight", torch.int8, (n, k), where, algo),
            "scales": _get(tensors, "weight_scale", torch.float32, (n,), where, algo).reshape(n, 1).contiguous(), **out}


def _int_notes(c: Any, shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    return [(f"quant_algo {_int_algo(c)} is read by TensorRT-LLM; vLLM's and SGLang's ModelOpt loaders take its fp8 / "
            f"nvfp4 algorithms, not the integer ones: for vLLM use --format speculators")]


register_facet(MODELOPT, "integer")(Encoding(
    MODELOPT, "int4 symmetric in groups (W4A16_AWQ, with awq's pre_quant_scale), int8 symmetric per channel (W8A16; "
              "W8A8_SQ_PER_CHANNEL with static activations, smoothquant's pre_quant_scale)", _int_refuse, _int_spec,
    _int_encode, _int_decode, _int_notes))


# ---------------------------------------------------------------------------------------------- MX (OCP)


def _mx_refuse(c: Any) -> str | None:
    if c.elements == "e2m1":
        return (f"ModelOpt's unified checkpoint names no MXFP4 quant_algo for a Linear ({V} "
                f"process_layer_quant_config passes the format through as the lower-case 'mxfp4', which no engine "
                f"rule here is read for): export mxfp4 with --format speculators")
    if c.act_mode == "none":
        return (f"ModelOpt's MXFP8 is named from the weight quantizer alone ({V} get_quantization_format) and its "
                f"MXFP8 recipe quantizes the inputs the same way, so a weight-only mxfp8 drafter written as MXFP8 "
                f"would be served with MX activations: quantize with --activations dynamic, or export with "
                f"--format speculators")
    return None


def _mx_encode(stored: Mapping[str, Tensor], c: Any) -> dict[str, Tensor]:
    return {"weight": stored["weight"], "weight_scale": stored["weight_scale"]}


def _mx_decode(tensors: Mapping[str, Tensor], c: Any, shape: tuple[int, int], where: str) -> dict[str, Tensor]:
    n, k = shape
    return {"weight": _get(tensors, "weight", torch.float8_e4m3fn, (n, k), where, "MXFP8"),
            "weight_scale": _get(tensors, "weight_scale", torch.uint8, (n, k // 32), where, "MXFP8")}


register_facet(MODELOPT, "mx")(Encoding(
    MODELOPT, "mxfp8 with dynamic MX activations (MXFP8)", _mx_refuse, lambda c: {"quant_algo": "MXFP8", "group_size": 32},
    _mx_encode, _mx_decode,
    lambda c, shapes: ["MXFP8 activations are quantized by the server at run time with its own e8m0 exponent rule"]))
