"""Quantized Linears as compressed-tensors tensors (the format vLLM's quantized loaders read), both ways.

The SAME codes and scales specpress measured, re-laid out, never re-quantized:

    ours (modules.py)                                   compressed-tensors (format)
    int4 IntLinear  qweight uint8 [N, K/2]               pack-quantized: weight_packed int32 [N, ceil(K/8)]
                    (col 2j low nibble, 2j+1 high)       (element i at bits 4i, little-endian words: the
                                                         same bytes, zero-padded to whole int32 words)
                    scales f32 [N, K/G]                  weight_scale f32 [N, K/G] (G = K: [N, 1], "channel")
                    qzeros uint8 [N, K/G] (asym)         weight_zero_point int32 [ceil(N/8), K/G], packed
                                                         along the OUTPUT dim, stored as zero - 8
    int8 IntLinear  qweight int8 (sym: code - 128)       pack-quantized 8-bit: weight_packed int32
                    or uint8 + qzeros (asym)             [N, ceil(K/4)], the unsigned codes as bytes
    fp8 Fp8Linear   weight_fp8 e4m3 [N, K], scales [N]   float-quantized: weight e4m3 [N, K], weight_scale [N, 1]
    all                                                  weight_shape int64 [2] (pack-quantized only)

compressed-tensors stores codes signed (q_s = code - 2^(b-1)) and dequantizes (q_s - zp_s) · scale,
which equals specpress's (code - zero) · scale exactly. bitsandbytes formats (nf4, fp4, bnb int8) have
no compressed-tensors counterpart and are refused. Scales stay float32: vLLM casts them to the model
dtype when it loads them (see serving_notes).
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any, Mapping

import torch
from torch import Tensor

from specpress.errors import CheckpointError, ConfigError
from specpress.models.quantized.modules import checked_tensor

CT_VERSION = "0.20.1"  # the compressed-tensors release this layout was checked against
HOLDS = ("int4 (rtn, gptq; symmetric or asymmetric)", "int8 (rtn, gptq; symmetric or asymmetric)",
         "fp8 (e4m3, per-channel scales)")
VLLM_GROUP_SIZES = (32, 64, 128)  # Marlin / Machete WNA16 group sizes (-1, per channel, too)


def weights_args(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The `weights` QuantizationArgs of a config group for a recorded quantize config."""
    if cfg["name"] == "fp8":
        return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "group_size": None,
                "dynamic": False, "actorder": None, "observer": "minmax", "block_structure": None}
    g = cfg.get("group_size")
    return {"num_bits": int(cfg["bits"]), "type": "int", "symmetric": bool(cfg.get("symmetric", True)),
            "strategy": "channel" if g is None else "group", "group_size": g, "dynamic": False,
            "actorder": None, "observer": "minmax", "block_structure": None}


LAYER_INDEX = re.compile(r"(^|\.)layers\.\d+\.")


def name_pattern(name: str) -> str:
    """A compressed-tensors ignore entry for Linear `name` (checkpoint name) that matches it under any
    serving engine's naming: `re:` + the name anchored at a dotted boundary, with a decoder layer's index
    left open. vLLM prefixes the drafter's modules (`fc` is `model.fc`) and numbers an EAGLE-3 draft
    layer after the target's depth (`model.layers.{num_target_layers}`, vLLM 0.34
    model_executor/models/llama_eagle3.py start_layer_id), and matches `re:` entries against those names
    unrewritten (model_executor/layers/quantization/compressed_tensors/utils.py)."""
    m = LAYER_INDEX.search(name)
    if m is None:
        return r"re:(.*\.)?" + re.escape(name) + "$"
    head, tail = name[:m.end(1)], name[m.end():]
    return r"re:(.*\.)?" + re.escape(head) + r"layers\.\d+\." + re.escape(tail) + "$"


def check_layer_uniform(quantized: list[str], others: list[str]) -> None:
    """A module kept in float in one decoder layer must be float in every layer: the config names modules
    without their layer index (name_pattern), so a per-layer choice cannot be written."""
    qs, fs = {name_pattern(n) for n in quantized}, {name_pattern(n) for n in others}
    both = sorted(qs & fs)
    if both:
        raise ConfigError(f"{', '.join(p[3:] for p in both)}: quantized in some decoder layers and float in others. "
                          f"The compressed-tensors config names a drafter's modules without their layer index "
                          f"(vLLM renumbers the draft layers after the target's depth), so it cannot tell them "
                          f"apart: quantize that module in every layer or in none (--include / --exclude by its "
                          f"name, e.g. --exclude down_proj)")


def quantization_config(group: Mapping[str, Any], quantized: list[str], others: list[str],
                        ignore: list[str] | None = None) -> dict[str, Any]:
    """config.json's `quantization_config` for Linears `quantized` (checkpoint names) in one config group
    (`group`: its weights, input_activations and format, from the scheme's encoding, ct_encodings.py);
    `others` are the Linears left in full precision. The group targets every Linear by class (`Linear`:
    torch's, and vLLM's LinearBase subclasses) and `ignore` lists the float ones, so both match under any
    naming (see name_pattern); an engine that names its modules otherwise gives its own entries (`ignore`)."""
    check_layer_uniform(quantized, others)
    # Engines build a drafter's head as an embedding-like ParallelLMHead that no class target reaches: vLLM 0.34
    # (compressed_tensors.py get_quant_method) and SGLang 0.5.23 (get_lm_head_scheme) quantize it only when a
    # target names it, so a quantized head is targeted by name as well.
    heads = [n for n in quantized if n == "lm_head" or n.endswith(".lm_head")]
    g = {"targets": ["Linear"] + [name_pattern(n) for n in heads], "weights": dict(group["weights"]),
         "input_activations": group.get("input_activations"),
         "output_activations": None, "format": group["format"]}
    return {"quant_method": "compressed-tensors", "format": group["format"], "quantization_status": "compressed",
            "config_groups": {"group_0": g},
            "ignore": sorted(set(ignore) if ignore is not None else {name_pattern(n) for n in others}),
            "kv_cache_scheme": None, "sparsity_config": {}, "version": CT_VERSION}


def _little_endian() -> None:
    if sys.byteorder != "little":
        raise CheckpointError("compressed-tensors packing is written here by reinterpreting bytes as int32 "
                              "words, which needs a little-endian host")


def bytes_to_words(b: Tensor) -> Tensor:
    """uint8 [R, B] -> int32 [R, ceil(B/4)] (zero-padded; byte j of a row is bits 8j.. of its words)."""
    _little_endian()
    r, n = b.shape
    pad = -n % 4
    if pad:
        b = torch.cat([b, b.new_zeros(r, pad)], dim=1)
    return b.contiguous().reshape(-1).view(torch.int32).reshape(r, -1)  # flat: safe for any size-1 dim


def words_to_bytes(w: Tensor, n: int) -> Tensor:
    """int32 [R, W] -> the first n bytes of each row, uint8 [R, n] (inverse of bytes_to_words)."""
    _little_endian()
    return w.contiguous().reshape(-1).view(torch.uint8).reshape(w.shape[0], -1)[:, :n].contiguous()


def _nibbles(q: Tensor) -> Tensor:
    """codes 0..15 [R, C] -> uint8 [R, ceil(C/2)] (element 2j low nibble, 2j+1 high)."""
    q = q.to(torch.uint8)
    if q.shape[1] % 2:
        q = torch.cat([q, q.new_zeros(q.shape[0], 1)], dim=1)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def _unnibble(b: Tensor, c: int) -> Tensor:
    return torch.stack([b & 0x0F, b >> 4], dim=-1).reshape(b.shape[0], -1)[:, :c]


def compress_module(stored: Mapping[str, Tensor], cfg: Mapping[str, Any]) -> dict[str, Tensor]:
    """One quantized Linear's stored tensors (modules.py keys, bias excluded) -> compressed-tensors'."""
    if cfg["name"] == "fp8":
        w8, s = stored["weight_fp8"], stored["scales"]
        return {"weight": w8, "weight_scale": s.reshape(-1, 1)}
    bits, sym = int(cfg["bits"]), bool(cfg.get("symmetric", True))
    q, scales = stored["qweight"], stored["scales"]
    n = q.shape[0]
    k = q.shape[1] * 2 if bits == 4 else q.shape[1]
    # 4-bit: our packed bytes ARE compressed-tensors' byte stream; 8-bit: the unsigned codes (signed + 128)
    codes_bytes = q if bits == 4 or not sym else (q.to(torch.int16) + 128).to(torch.uint8)
    out = {"weight_packed": bytes_to_words(codes_bytes.to(torch.uint8)), "weight_scale": scales,
           "weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    if not sym:
        z = stored["qzeros"].to(torch.uint8).t()  # [K/G, N]: packed along the output dim
        out["weight_zero_point"] = bytes_to_words(_nibbles(z) if bits == 4 else z).t().contiguous()
    return out


def decompress_module(stored: Mapping[str, Tensor], cfg: Mapping[str, Any], shape: tuple[int, int],
                      where: str) -> dict[str, Tensor]:
    """compressed-tensors tensors of one Linear [N, K] -> specpress's stored tensors (modules.py keys)."""
    n, k = shape

    def need(key: str, dtype: torch.dtype, dims: tuple[int, ...]) -> Tensor:
        return checked_tensor(stored, key, dtype, dims, where, "compressed-tensors", "the quantization_config")

    if cfg["name"] == "fp8":
        return {"weight_fp8": need("weight", torch.float8_e4m3fn, (n, k)),
                "scales": need("weight_scale", torch.float32, (n, 1)).reshape(n).contiguous()}
    bits, g = int(cfg["bits"]), cfg.get("group_size")
    ng = 1 if g is None else k // g
    if "weight_shape" in stored and [int(v) for v in stored["weight_shape"].tolist()] != [n, k]:
        raise CheckpointError(f"{where}.weight_shape is {stored['weight_shape'].tolist()}, config.json implies "
                              f"[{n}, {k}]")
    nbytes = k // 2 if bits == 4 else k
    words = need("weight_packed", torch.int32, (n, math.ceil(nbytes / 4)))
    codes_bytes = words_to_bytes(words, nbytes)
    out = {"scales": need("weight_scale", torch.float32, (n, ng)).contiguous()}
    if bits == 4:
        out["qweight"] = codes_bytes
    elif cfg.get("symmetric", True):
        out["qweight"] = (codes_bytes.to(torch.int16) - 128).to(torch.int8)
    else:
        out["qweight"] = codes_bytes
    if not cfg.get("symmetric", True):
        zrows = math.ceil((n if bits == 8 else math.ceil(n / 2)) / 4)
        zw = need("weight_zero_point", torch.int32, (zrows, ng)).t().contiguous()
        zb = words_to_bytes(zw, n if bits == 8 else math.ceil(n / 2))
        out["qzeros"] = (_unnibble(zb, n) if bits == 4 else zb).t().contiguous()
    return out


def parse_quantization_config(qcfg: Mapping[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """(a specpress quantize config dict, the group's target patterns) from a compressed-tensors
    `quantization_config`; what specpress's modules cannot compute is a ConfigError."""
    if qcfg.get("quant_method") != "compressed-tensors":
        raise ConfigError(f"{source}: quantization_config.quant_method {qcfg.get('quant_method')!r} is not read "
                          f"here (compressed-tensors, or ModelOpt's hf_quant_config.json)")
    groups = qcfg.get("config_groups") or {}
    if len(groups) != 1:
        raise ConfigError(f"{source}: {len(groups)} compressed-tensors config groups; specpress reads exactly one "
                          f"(one scheme per drafter)")
    group = next(iter(groups.values()))
    w = group.get("weights") or {}
    if group.get("input_activations") or group.get("output_activations") or w.get("dynamic"):
        raise ConfigError(f"{source}: activation quantization is not supported (weight-only schemes: "
                          f"{'; '.join(HOLDS)})")
    fmt = group.get("format") or qcfg.get("format")
    kind = (w.get("type"), w.get("num_bits"), fmt)
    if kind == ("float", 8, "float-quantized") and w.get("strategy") == "channel":
        return {"name": "fp8", "version": 1, "include": [], "exclude": []}, list(group.get("targets") or [])
    if w.get("type") == "int" and w.get("num_bits") in (4, 8) and fmt == "pack-quantized" and \
            w.get("strategy") in ("group", "channel") and not w.get("actorder"):
        g = w.get("group_size") if w.get("strategy") == "group" else None
        return ({"name": "int", "version": 1, "include": [], "exclude": [], "bits": int(w["num_bits"]),
                 "group_size": g, "symmetric": bool(w.get("symmetric", True))}, list(group.get("targets") or []))
    raise ConfigError(f"{source}: compressed-tensors scheme {w.get('type')}{w.get('num_bits')} "
                      f"{w.get('strategy')} in format {fmt!r} is not one specpress computes; it reads "
                      f"{'; '.join(HOLDS)}")


def matches(patterns: list[str], name: str) -> bool:
    """Whether a Linear `name` matches a compressed-tensors target/ignore entry (`re:` regex, a name, or a
    module class name such as `Linear`)."""
    for p in patterns:
        if p.startswith("re:"):
            if re.match(p[3:], name):
                return True
        elif p == name or p == "Linear" or name.endswith("." + p):
            return True
    return False


def marlin_tiles(out_features: int, in_features: int) -> bool:
    """Whether vLLM 0.34's Marlin takes a [out, in] weight unpadded: (n % 64, k % 128) or (n % 128, k % 64)
    (model_executor/layers/quantization/utils/marlin_utils.py marlin_padded_nk)."""
    return (out_features % 64 == 0 and in_features % 128 == 0) or (out_features % 128 == 0 and in_features % 64 == 0)


def serving_notes(cfg: Mapping[str, Any], shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    """What vLLM's compressed-tensors kernels take that this checkpoint does not (or only with a cast)."""
    notes = ["weight_scale is stored as float32 (the scales specpress measured, bit for bit); vLLM casts it "
             "to the model dtype (bf16/fp16) when it loads the drafter, which rounds the scales: re-measure "
             "tau with the scales rounded (specpress bench on this directory loads them as stored)"]
    if cfg["name"] == "fp8":
        return notes + ["fp8 weight-only (W8A16 fp8): vLLM runs it through its Marlin fp8 kernel on GPUs "
                        "without native fp8, its fp8 GEMM otherwise"]
    g = cfg.get("group_size")
    if g is not None and g not in VLLM_GROUP_SIZES:
        notes.append(f"group size {g}: vLLM 0.34's Marlin / Machete WNA16 kernels take group sizes "
                     f"{', '.join(map(str, VLLM_GROUP_SIZES))} or per-channel (quantization/utils/marlin_utils.py "
                     f"MARLIN_SUPPORTED_GROUP_SIZES); other groups go to Humming (humming-kernels, which vLLM 0.34 "
                     f"installs; kernels/linear/__init__.py choose_mp_linear_kernel), a kernel specpress has not "
                     f"checked: quantize with --group-size 32/64/128")
    if not cfg.get("symmetric", True) and int(cfg["bits"]) == 8:
        notes.append("asymmetric int8: vLLM 0.34 runs 8-bit weights with zero points through Machete on Hopper "
                     "(sm90) only, with groups of 64 or 128 or per channel and in_features a multiple of 64, "
                     "out_features of 128 (quantization/utils/machete_utils.py); Marlin takes zero points for "
                     "4-bit weights only (marlin_utils.py query_marlin_supported_quant_types); any other layer goes "
                     "to the next kernel that accepts it (kernels/linear/__init__.py choose_mp_linear_kernel), "
                     "Humming (humming-kernels, which vLLM 0.34 installs) on CUDA, a kernel specpress has not "
                     "checked: serve it on an sm90 GPU with those groups or quantize symmetric int8")
    small = sorted(n for n, (rows, cols) in shapes.items() if not marlin_tiles(rows, cols))
    if small:
        notes.append(f"{len(small)} quantized Linear(s) ({', '.join(small[:3])}{' …' if len(small) > 3 else ''}) "
                     f"are not whole Marlin tiles (out_features a multiple of 64 and in_features of 128, or of "
                     f"128 and 64): vLLM 0.34's Marlin pads them (quantization/utils/marlin_utils.py "
                     f"marlin_padded_nk; they load and run, the padding costs some compute)")
    return notes
