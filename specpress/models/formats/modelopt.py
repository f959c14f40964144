"""ModelOpt's unified HF quantized layout (hf_quant_config.json): the config files, and the reader for foreign
checkpoints.

The tensors of each scheme are its "modelopt" facet (modelopt_encodings.py: FP8, FP8_PER_CHANNEL_PER_TOKEN,
NVFP4, W4A16_NVFP4, W4A16_AWQ, W8A16, W8A8_SQ_PER_CHANNEL). The checkpoint keeps the family's public layout
(ModelOpt's own EAGLE export writes `midlayer.*`, `eagle_config`), plus `hf_quant_config.json` and a
`quantization_config` in config.json. A checkpoint ModelOpt wrote (no specpress block) is read back here
when it is FP8_PER_CHANNEL_PER_TOKEN: `<name>.weight` float8_e4m3fn [N, K], `<name>.weight_scale` float32 [N].
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor

from specpress.errors import CheckpointError, ConfigError

QUANT_ALGO = "FP8_PER_CHANNEL_PER_TOKEN"
PRODUCER = {"name": "modelopt", "version": "0.47.0"}  # the ModelOpt release whose layout this follows


def hf_quant_config(spec: Mapping[str, Any], excluded: list[str]) -> dict[str, Any]:
    """hf_quant_config.json for the encoding's `spec` (quant_algo and its fields), `excluded` Linears in float."""
    return {"producer": dict(PRODUCER),
            "quantization": {**spec, "kv_cache_quant_algo": None, "exclude_modules": excluded}}


def quantization_config(spec: Mapping[str, Any], excluded: list[str]) -> dict[str, Any]:
    """config.json's quantization_config (what vLLM's ModelOpt loaders read): modelopt_fp4 for the NVFP4 algorithms,
    as ModelOpt's drafter script writes it."""
    method = "modelopt_fp4" if "NVFP4" in str(spec["quant_algo"]) else "modelopt"
    return {"quant_method": method, **spec, "ignore": excluded, "producer": dict(PRODUCER)}


def decompress_module(stored: Mapping[str, Tensor], shape: tuple[int, int], where: str) -> dict[str, Tensor]:
    n, k = shape
    w, s = stored.get("weight"), stored.get("weight_scale")
    if w is None or s is None:
        raise CheckpointError(f"{where}: a ModelOpt fp8 Linear needs 'weight' and 'weight_scale'")
    if w.dtype != torch.float8_e4m3fn or tuple(w.shape) != (n, k):
        raise CheckpointError(f"{where}.weight: stored {w.dtype} {tuple(w.shape)}, expected float8_e4m3fn {(n, k)}")
    if s.dtype != torch.float32 or s.numel() != n:
        raise CheckpointError(f"{where}.weight_scale: stored {s.dtype} {tuple(s.shape)}, expected float32 per "
                              f"output channel ({n} values); per-tensor or block scales are not read here")
    return {"weight_fp8": w, "scales": s.reshape(n).contiguous()}


def parse(hq: Mapping[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """(specpress quantize config dict, excluded module names) from hf_quant_config.json."""
    q = hq.get("quantization") or {}
    algo = str(q.get("quant_algo") or "").upper()
    if algo != QUANT_ALGO:
        raise ConfigError(f"{source}: ModelOpt quant_algo {q.get('quant_algo')!r} is not read by specpress "
                          f"(it reads {QUANT_ALGO})")
    if q.get("kv_cache_quant_algo"):
        raise ConfigError(f"{source}: a quantized KV cache ({q['kv_cache_quant_algo']}) is not computed by specpress")
    return {"name": "fp8", "version": 1, "include": [], "exclude": []}, list(q.get("exclude_modules") or [])
