"""ModelOpt's unified HF quantized layout (hf_quant_config.json), for the schemes that have a counterpart.

specpress fp8 (e4m3 weights, one float32 scale per output channel, weight-only) ->
ModelOpt `FP8_PER_CHANNEL_PER_TOKEN`: `<name>.weight` float8_e4m3fn [N, K], `<name>.weight_scale` float32
[N] (1-D: what ModelOpt writes and what TensorRT-LLM's FP8 rowwise method and vLLM's ModelOpt per-channel
scheme allocate), the same codes and scales. ModelOpt has no per-channel fp8 WEIGHT-ONLY algorithm (its weight-only
fp8, FP8_PB_WO, scales 128x128 blocks), so a server loading this also quantizes activations per token:
the export's summary says so. The checkpoint keeps the family's public layout (ModelOpt's own EAGLE export
writes `midlayer.*`, `eagle_config`), plus `hf_quant_config.json` and a `quantization_config` in config.json.

No counterpart (refused): int4 / int8 (ModelOpt's INT4_AWQ / INT8_SQ differ in scale rule and packing, and
vLLM's ModelOpt loader rejects INT formats), nf4 / fp4 / bnb int8.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor

from specpress.errors import CheckpointError, ConfigError

QUANT_ALGO = "FP8_PER_CHANNEL_PER_TOKEN"
PRODUCER = {"name": "modelopt", "version": "0.47.0"}  # the ModelOpt release whose layout this follows


def check_scheme(step: Mapping[str, Any]) -> dict[str, Any]:
    cfg = dict(step.get("config") or {})
    if cfg.get("name") == "fp8":
        return cfg
    raise ConfigError(f"ModelOpt's unified layout has no counterpart for a {step.get('scheme')} "
                      f"({step.get('method')}) drafter; it holds fp8 (per-channel e4m3, as {QUANT_ALGO}). "
                      f"Use --format speculators (compressed-tensors holds int4 / int8 / fp8)")


def hf_quant_config(excluded: list[str]) -> dict[str, Any]:
    return {"producer": dict(PRODUCER),
            "quantization": {"quant_algo": QUANT_ALGO, "kv_cache_quant_algo": None, "exclude_modules": excluded}}


def quantization_config(excluded: list[str]) -> dict[str, Any]:
    return {"quant_method": "modelopt", "quant_algo": QUANT_ALGO, "ignore": excluded, "producer": dict(PRODUCER)}


def compress_module(stored: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {"weight": stored["weight_fp8"], "weight_scale": stored["scales"].reshape(-1).contiguous()}


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


def notes() -> list[str]:
    return [f"ModelOpt has no per-channel fp8 weight-only algorithm: written as {QUANT_ALGO}, so TensorRT-LLM / "
            f"vLLM also quantize the drafter's activations per token (dynamic), which specpress did not "
            f"measure; re-measure tau on the server",
            ("not for SGLang: its ModelOpt FP8 config (0.5.x) loads static per-tensor FP8 (quant_algo \"FP8\", one "
             "weight_scale per shard plus an input_scale) only, and its EAGLE-3 fc is a plain Linear that would "
             "drop an fp8 scale")]
