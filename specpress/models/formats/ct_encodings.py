"""compressed-tensors encodings of the quantization schemes (facets "compressed-tensors", encodings.py).

Read from compressed-tensors 0.20.1 (`quantization/quant_scheme.py` presets, `compressors/*`): the config
group each scheme is written as, and its tensors per Linear (N = out_features, K = in_features):

    integer, weight-only       pack-quantized (compressed_tensors.py): weight_packed int32, weight_scale, weight_shape
    int8 + activations         int-quantized (preset W8A8 / INT8 with --activations dynamic): weight int8 [N, K]
                               (signed codes), weight_scale f32 [N, 1]; static: strategy tensor + input_scale f32 [1]
    fp8                        float-quantized: weight e4m3 [N, K], weight_scale f32 [N, 1] (channel) or [1]
                               (tensor); input_activations strategy token, dynamic (preset FP8_DYNAMIC), or tensor
                               + input_scale f32 [1] (static; preset FP8 with per-tensor weights)
    nvfp4                      nvfp4-pack-quantized (presets NVFP4A16 / NVFP4): weight_packed uint8 [N, K/2]
                               (element 2j in the low nibble), weight_scale e4m3 [N, K/16], weight_global_scale f32
                               [1] = 1 / ModelOpt's weight_scale_2; W4A4: input_global_scale f32 [1] = 1 / input_scale
    mxfp8 / mxfp4              mxfp8-quantized (presets MXFP8A16 / MXFP8): weight e4m3 [N, K]; mxfp4-pack-quantized
                               (MXFP4A16 / MXFP4): weight_packed uint8 [N, K/2]; both weight_scale uint8 e8m0 [N, K/32];
                               dynamic MX activations as input_activations (group 32, dynamic)
    int3 / int2 / ternary      pack-quantized num_bits 3 / 2 (compressors/pack_quantized: dense, element i at bit
                               i·num_bits of little-endian int32 words, which is specpress's int3 / int2 byte
                               stream; ternary re-packed as 2-bit codes), weight_scale f16 [N, K/G], weight_shape;
                               asymmetric: weight_zero_point int32 packed densely along the output dim

The codes and block scales are specpress's own bytes; an input_scale is the one specpress calibrated
(amax / 448 for fp8, amax / 127 for int8). NVFP4's global scales are stored as reciprocals, so reading them
back rounds once (`exact` False): the weights compressed-tensors dequantizes differ from specpress's by float
rounding of that one division.

Refused: a pre_quant_scale (AWQ, SmoothQuant): compressed-tensors' schemes hold weights, scales, zero points
and input scales only (llm-compressor folds AWQ / SmoothQuant smoothing into the preceding layer's weights
before quantizing, which an EAGLE-3 `fc` fed by concatenated target states has no place for).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from specpress.models.formats import compressed_tensors as ct
from specpress.models.formats.encodings import CT, Encoding
from specpress.models.quantized.modules import checked_tensor
from specpress.models.quantized.scheme import register_facet

V = f"compressed-tensors {ct.CT_VERSION}"
PRE_QUANT_RULE = (f"compressed-tensors has no encoding for a pre_quant_scale (AWQ/SmoothQuant) here: its schemes "
                  f"hold weights, scales, zero points and input scales ({V} quantization/quant_scheme.py), and "
                  f"llm-compressor folds the smoothing into the preceding layer instead, which these codes (of W·s) "
                  f"cannot be re-laid out into. Export with --format modelopt (awq as W4A16_AWQ, smoothquant with static "
                  f"activations as W8A8_SQ_PER_CHANNEL), or quantize with --method rtn / gptq")


def _act(kind: str, mode: str) -> dict[str, Any] | None:
    """input_activations of an 8-bit scheme: per token at run time, or one static scale per tensor."""
    if mode == "none":
        return None
    if mode == "dynamic":
        return {"num_bits": 8, "type": kind, "symmetric": True, "group_size": None, "strategy": "token",
                "dynamic": True}
    return {"num_bits": 8, "type": kind, "symmetric": True, "group_size": None, "strategy": "tensor", "dynamic": False,
            "observer": "static_minmax"}


def _input_scale(stored: Mapping[str, Tensor]) -> dict[str, Tensor]:
    s = stored.get("input_scale")
    return {} if s is None else {"input_scale": s.float().reshape(1).contiguous()}


def _read_input_scale(tensors: Mapping[str, Tensor], config: Any, where: str) -> dict[str, Tensor]:
    if config.act_mode != "static":
        return {}
    s = checked_tensor(tensors, "input_scale", torch.float32, (1,), where, "compressed-tensors", "input_activations")
    return {"input_scale": s.reshape(()).contiguous()}


# ---------------------------------------------------------------------------------------------- integer codes


def _int_refuse(c: Any) -> str | None:
    if c.has_pre_quant_scale:
        return PRE_QUANT_RULE
    if c.act_mode != "none" and (c.group_size is not None or not c.symmetric):
        return (f"compressed-tensors writes int8 with quantized activations as its W8A8 scheme (int-quantized, "
                f"symmetric weights with one scale per output channel; {V} quantization/quant_scheme.py): a "
                f"{'grouped' if c.group_size is not None else 'asymmetric'} int8 drafter with {c.act_mode} "
                f"activations has no form there; re-quantize with --scheme int8 --activations {c.act_mode} without "
                f"--group-size / --asymmetric")
    return None


def _int_spec(c: Any) -> dict[str, Any]:
    w = ct.weights_args(c.to_dict())
    if c.act_mode == "none":
        return {"weights": w, "input_activations": None, "format": "pack-quantized"}
    return {"weights": {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None, "strategy": "channel",
                        "dynamic": False}, "input_activations": _act("int", c.act_mode), "format": "int-quantized"}


def _int_encode(stored: Mapping[str, Tensor], c: Any) -> dict[str, Tensor]:
    if c.act_mode == "none":
        return ct.compress_module(stored, c.to_dict())
    return {"weight": stored["qweight"], "weight_scale": stored["scales"].reshape(-1, 1).contiguous(),
            **_input_scale(stored)}


def _int_decode(tensors: Mapping[str, Tensor], c: Any, shape: tuple[int, int], where: str) -> dict[str, Tensor]:
    if c.act_mode == "none":
        return ct.decompress_module(tensors, c.to_dict(), shape, where)
    n, k = shape
    q = checked_tensor(tensors, "weight", torch.int8, (n, k), where, "compressed-tensors", "the W8A8 scheme")
    s = checked_tensor(tensors, "weight_scale", torch.float32, (n, 1), where, "compressed-tensors", "the W8A8 scheme")
    return {"qweight": q, "scales": s.contiguous(), **_read_input_scale(tensors, c, where)}


def _int_notes(c: Any, shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    if c.act_mode == "none":
        return ct.serving_notes(c.to_dict(), shapes)
    return [(f"int8 W8A8 with {c.act_mode} activations (int-quantized): vLLM's int8 W8A8 kernels take per-channel "
            f"symmetric weights; weight_scale is stored float32 and cast to the model dtype on load")]


register_facet(CT, "integer")(Encoding(
    CT, "int4 / int8 weight-only (rtn, gptq; pack-quantized), int8 with dynamic or static activations "
        "(int-quantized)", _int_refuse, _int_spec, _int_encode, _int_decode, _int_notes))


# ---------------------------------------------------------------------------------------------- fp8


def _fp8_spec(c: Any) -> dict[str, Any]:
    w = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "strategy": c.granularity,
         "dynamic": False}
    if c.act_mode == "none" and c.granularity == "channel":
        w = ct.weights_args(c.to_dict())  # the weight-only form earlier exports wrote
    return {"weights": w, "input_activations": _act("float", c.act_mode), "format": "float-quantized"}


def _fp8_encode(stored: Mapping[str, Tensor], c: Any) -> dict[str, Tensor]:
    s = stored["scales"]
    return {"weight": stored["weight_fp8"], "weight_scale": s.reshape(-1, 1) if c.granularity == "channel"
            else s.reshape(1).contiguous(), **_input_scale(stored)}


def _fp8_decode(tensors: Mapping[str, Tensor], c: Any, shape: tuple[int, int], where: str) -> dict[str, Tensor]:
    n, k = shape
    ns = (n, 1) if c.granularity == "channel" else (1,)
    w = checked_tensor(tensors, "weight", torch.float8_e4m3fn, (n, k), where, "compressed-tensors", "the fp8 scheme")
    s = checked_tensor(tensors, "weight_scale", torch.float32, ns, where, "compressed-tensors", "the fp8 scheme")
    return {"weight_fp8": w, "scales": s.reshape(-1).contiguous(), **_read_input_scale(tensors, c, where)}


def _fp8_notes(c: Any, shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    notes = ct.serving_notes(c.to_dict(), shapes)[:1]
    if c.act_mode == "none":
        return notes + [("fp8 weight-only (W8A16 fp8): vLLM runs it through its Marlin fp8 kernel on GPUs without "
                        "native fp8, its fp8 GEMM otherwise")]
    return notes + [f"fp8 W8A8, {c.granularity} weights, {c.act_mode} activations"
                    + (": input_scale is the one specpress calibrated" if c.act_mode == "static" else " (per token)")]


register_facet(CT, "fp8")(Encoding(
    CT, "fp8 (channel or tensor weights; activations none, dynamic or static; float-quantized)", lambda c: None,
    _fp8_spec, _fp8_encode, _fp8_decode, _fp8_notes))


# ---------------------------------------------------------------------------------------------- nvfp4


def _nvfp4_spec(c: Any) -> dict[str, Any]:
    w = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group",
         "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"}
    a = None if c.act_mode == "none" else {
        "num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group",
        "dynamic": "local", "scale_dtype": "torch.float8_e4m3fn", "observer": "static_minmax"}
    return {"weights": w, "input_activations": a, "format": "nvfp4-pack-quantized"}


def _nvfp4_encode(stored: Mapping[str, Tensor], c: Any) -> dict[str, Tensor]:
    out = {"weight_packed": stored["weight"], "weight_scale": stored["weight_scale"],
           "weight_global_scale": (1.0 / stored["weight_scale_2"].float()).reshape(1)}
    if "input_scale" in stored:
        out["input_global_scale"] = (1.0 / stored["input_scale"].float()).reshape(1)
    return out


def _nvfp4_decode(tensors: Mapping[str, Tensor], c: Any, shape: tuple[int, int], where: str) -> dict[str, Tensor]:
    n, k = shape
    f = "compressed-tensors", "the nvfp4 scheme"
    out = {"weight": checked_tensor(tensors, "weight_packed", torch.uint8, (n, k // 2), where, *f),
           "weight_scale": checked_tensor(tensors, "weight_scale", torch.float8_e4m3fn, (n, k // 16), where, *f),
           "weight_scale_2": (1.0 / checked_tensor(tensors, "weight_global_scale", torch.float32, (1,), where, *f))
           .reshape(())}
    if c.act_mode == "static":
        out["input_scale"] = (1.0 / checked_tensor(tensors, "input_global_scale", torch.float32, (1,), where, *f)).reshape(())
    return out


def _nvfp4_notes(c: Any, shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    return [("nvfp4: compressed-tensors stores the global scales as reciprocals (weight_global_scale = 1 / "
            "weight_scale_2): the weights a server dequantizes differ from specpress's by the float rounding of "
            "that division (the e2m1 codes and e4m3 block scales are specpress's own)")]


register_facet(CT, "nvfp4")(Encoding(
    CT, "nvfp4 (W4A16, or W4A4 with static activations; nvfp4-pack-quantized)", lambda c: None, _nvfp4_spec,
    _nvfp4_encode, _nvfp4_decode, _nvfp4_notes, exact=False))


# ---------------------------------------------------------------------------------------------- MX (OCP)


def _mx_format(c: Any) -> str:
    return "mxfp4-pack-quantized" if c.elements == "e2m1" else "mxfp8-quantized"


def _mx_spec(c: Any) -> dict[str, Any]:
    bits = 4 if c.elements == "e2m1" else 8
    w = {"num_bits": bits, "type": "float", "symmetric": True, "group_size": 32, "strategy": "group",
         "dynamic": False, "scale_dtype": "torch.uint8", "zp_dtype": "torch.uint8"}  # zp_dtype: as its MX presets
    a = None if c.act_mode == "none" else {**w, "dynamic": True}
    return {"weights": w, "input_activations": a, "format": _mx_format(c)}


def _mx_key(c: Any) -> str:
    return "weight_packed" if c.elements == "e2m1" else "weight"


def _mx_encode(stored: Mapping[str, Tensor], c: Any) -> dict[str, Tensor]:
    return {_mx_key(c): stored["weight"], "weight_scale": stored["weight_scale"]}


def _mx_decode(tensors: Mapping[str, Tensor], c: Any, shape: tuple[int, int], where: str) -> dict[str, Tensor]:
    n, k = shape
    f = "compressed-tensors", f"the {c.scheme} scheme"
    w = checked_tensor(tensors, "weight_packed", torch.uint8, (n, k // 2), where, *f) if c.elements == "e2m1" else \
        checked_tensor(tensors, "weight", torch.float8_e4m3fn, (n, k), where, *f)
    return {"weight": w, "weight_scale": checked_tensor(tensors, "weight_scale", torch.uint8, (n, k // 32), where, *f)}


def _mx_notes(c: Any, shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    if c.act_mode == "none":
        return []
    return [(f"{c.scheme} activations are quantized by the server at run time, with its own rule for each block's "
             f"e8m0 exponent; specpress's (minifloat.py) may pick a different exponent for some blocks")]


register_facet(CT, "mx")(Encoding(
    CT, "mxfp4 / mxfp8 (weight-only or dynamic MX activations; mxfp4-pack-quantized, mxfp8-quantized)",
    lambda c: None, _mx_spec, _mx_encode, _mx_decode, _mx_notes))


# ---------------------------------------------------------------------------------------------- low-bit codes


def _lowbit_bits(c: Any) -> int:
    from specpress.models.quantized.lowbit import BITS

    return BITS[c.format]


def _lowbit_spec(c: Any) -> dict[str, Any]:
    w = {"num_bits": _lowbit_bits(c), "type": "int", "symmetric": c.symmetric, "strategy": "group",
         "group_size": c.group_size, "dynamic": False, "actorder": None, "observer": "minmax", "block_structure": None}
    return {"weights": w, "input_activations": None, "format": "pack-quantized"}


def _dense(q: Tensor, bits: int) -> Tensor:
    """Codes [R, C] -> compressed-tensors' dense LSB-first bytes of each row, uint8 [R, ceil(C·bits/8)]."""
    from specpress.models.quantized import primitives as P

    r, cols = q.shape
    padded = torch.cat([q.to(torch.uint8), q.new_zeros(r, -cols % 8, dtype=torch.uint8)], dim=1)
    return P.pack_bits(padded, bits)[:, :-(-cols * bits // 8)].contiguous()


def _lowbit_encode(stored: Mapping[str, Tensor], c: Any) -> dict[str, Tensor]:
    from specpress.models.quantized import primitives as P

    bits, s = _lowbit_bits(c), stored["scales"]
    n, k = s.shape[0], s.shape[1] * c.group_size
    q = stored["qweight"]
    if c.format == "ternary":  # its codes 0..2 (zero 1) as 2-bit codes 1..3 (zero 2): the same weights
        q = _dense(P.unpack_trits(q, k) + 1, bits)
    out = {"weight_packed": ct.bytes_to_words(q), "weight_scale": s, "weight_shape": torch.tensor([n, k])}
    if not c.symmetric:  # packed along the output dim, as compressed-tensors packs zero points
        out["weight_zero_point"] = ct.bytes_to_words(_dense(stored["qzeros"].t(), bits)).t().contiguous()
    return out


def _lowbit_decode(tensors: Mapping[str, Tensor], c: Any, shape: tuple[int, int], where: str) -> dict[str, Tensor]:
    from specpress.models.quantized import primitives as P
    from specpress.models.quantized.lowbit import SCALE_DTYPE

    n, k = shape
    bits, ng = _lowbit_bits(c), k // c.group_size
    f = "compressed-tensors", f"the {c.scheme} scheme"
    nbytes = -(-k * bits // 8)
    words = checked_tensor(tensors, "weight_packed", torch.int32, (n, -(-nbytes // 4)), where, *f)
    q = ct.words_to_bytes(words, nbytes)
    if c.format == "ternary":
        q = P.pack_trits(P.unpack_bits(q, bits, k) - 1)
    out = {"qweight": q, "scales": checked_tensor(tensors, "weight_scale", SCALE_DTYPE, (n, ng), where, *f)}
    if not c.symmetric:
        zbytes = -(-n * bits // 8)
        zw = checked_tensor(tensors, "weight_zero_point", torch.int32, (-(-zbytes // 4), ng), where, *f)
        zb = ct.words_to_bytes(zw.t().contiguous(), zbytes)
        out["qzeros"] = P.unpack_bits(zb, bits, n).t().contiguous()
    return out


def _lowbit_notes(c: Any, shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    bits = _lowbit_bits(c)
    notes = [(f"{c.scheme}: pack-quantized with num_bits {bits}, packed densely as compressed-tensors {ct.CT_VERSION} "
              f"packs it (it decompresses it to specpress's weights; releases before 0.20 pack 3-bit codes 10 to a "
              f"word with padding). Serving engines' kernels mostly take 4 / 8 bits: export with --for ENGINE to "
              f"have an engine's own rules checked")]
    if c.format == "ternary":
        notes.append("ternary is written as 2-bit codes (-1, 0, +1 of int2's -2..1): 2 bits a code in this file, "
                     "1.6 in specpress's own artifact")
    return notes + ["weight_scale is stored as float16, the scales specpress measured"]


register_facet(CT, "lowbit")(Encoding(
    CT, "int3 / int2 / ternary weight-only (pack-quantized, num_bits 3 / 2; ternary as 2-bit codes)",
    lambda c: None, _lowbit_spec, _lowbit_encode, _lowbit_decode, _lowbit_notes))
