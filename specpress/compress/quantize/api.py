"""`quantize(model, config, calibration=None) -> model`: the one verb, dispatched on the config's type.

    from specpress.compress.quantize import IntWeightOnlyConfig, GPTQConfig, quantize
    quantize(drafter, IntWeightOnlyConfig(bits=4, group_size=64))
    quantize(drafter, GPTQConfig(bits=4), calibration=DrafterCalibration(target, drafter, sampler))

Which modules: every nn.Linear of the drafter, except (reported in the step's `skipped`)
  - a draft `lm_head` (EAGLE-3's reduced-vocab head, an lm drafter's own head): full precision unless
    the config's `include` names it; an lm_head tied to the embeddings is never quantized;
  - embeddings (an lm drafter's embed_tokens): never (these schemes are for Linears);
  - whatever `exclude` names.
The target's shared embed_tokens / lm_head are not the drafter's modules and are never touched. Norms,
biases, d2t / t2d stay as they are. EAGLE-3's and DFlash's `fc` (fusing the target's hidden states) IS
quantized by default, as ModelOpt's drafter PTQ does; `exclude=("fc",)` keeps it in full precision.

The step appended to `model.provenance`:
  {"step": "quantize", "scheme", "method", "config": config.to_dict(), "quantized": [names],
   "skipped": [{"module", "reason"}], "bytes_before", "bytes_after", "weight_sqnr_db": {name: dB},
   "notes": [...], "dequantized": false}
load_drafter reads it back (models/quantized/restore.py) and rebuilds the quantized modules before loading.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any, Callable, Mapping

import torch
from torch import nn

from specpress.compress.quantize.gptq import ForwardLoop, call_groups, collect_hessians, gptq_codes
from specpress.errors import ConfigError, UsageError
from specpress.models.quantized import primitives as P
from specpress.models.quantized.configs import (BNB_BLOCKSIZES, BnbConfig, Fp8WeightOnlyConfig, GPTQConfig,
                                                IntWeightOnlyConfig, QuantizeConfig)
from specpress.models.quantized.modules import (Bnb4bitLinear, Bnb8bitLinear, Fp8Linear, IntLinear, import_bnb,
                                                quantized_modules)
from specpress.models.quantized.restore import active_quantize_step, quantized_keys, replace_module

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ----------------------------------------------------------------------------------------------
# Handler registry
# ----------------------------------------------------------------------------------------------

Quantizer = Callable[[nn.Module, list[str], Any, "ForwardLoop | None", list[str]], None]
# (model, names, config, calibration, notes) -> None; replaces the named Linears. Loading them back is
# models/quantized/restore.py's (one restorer per config type).

_HANDLERS: dict[type, Quantizer] = {}


def register_handler(config_cls: type[QuantizeConfig]) -> Callable[[Quantizer], Quantizer]:
    """Decorator: the quantizer for configs of exactly `config_cls` (registering one twice is an error)."""

    def deco(fn: Quantizer) -> Quantizer:
        if config_cls in _HANDLERS:
            raise ValueError(f"a quantize handler for {config_cls.__name__} is already registered")
        _HANDLERS[config_cls] = fn
        return fn

    return deco


def handler_for(config: QuantizeConfig) -> Quantizer:
    try:
        return _HANDLERS[type(config)]
    except KeyError:
        known = ", ".join(sorted(c.__name__ for c in _HANDLERS))
        raise ConfigError(f"no quantize handler for {type(config).__name__}; known configs: {known}") from None


@register_handler(IntWeightOnlyConfig)
def _rtn(model: nn.Module, names: list[str], config: IntWeightOnlyConfig, calibration: ForwardLoop | None,
         notes: list[str]) -> None:
    for name in names:
        lin = model.get_submodule(name)
        q, s, z = P.quantize_int(lin.weight.detach(), config.bits, config.group_size, config.symmetric)
        replace_module(model, name, IntLinear.from_codes(lin, q, s, z, bits=config.bits, group_size=config.group_size,
                                                         symmetric=config.symmetric))


@register_handler(GPTQConfig)
def _gptq(model: nn.Module, names: list[str], config: GPTQConfig, calibration: ForwardLoop | None,
          notes: list[str]) -> None:
    assert calibration is not None
    groups, uncalled = call_groups(model, names, calibration)
    if uncalled:
        notes.append(f"gptq: {', '.join(uncalled)} never ran in the calibration forward: rounded to nearest")
        _rtn(model, uncalled, config, None, notes)
    if not config.sequential:
        hs = collect_hessians(model, [g[0] for g in groups], calibration)
    thin = []
    for group in groups:
        h, rows = collect_hessians(model, [group[0]], calibration)[group[0]] if config.sequential else hs[group[0]]
        k = model.get_submodule(group[0]).in_features
        if rows < 2 * k:
            thin.append(f"{'/'.join(group)} ({rows} rows for {k} inputs)")
        for name in group:
            lin = model.get_submodule(name)
            q, s, z = gptq_codes(lin.weight, h, bits=config.bits, group_size=config.group_size,
                                 symmetric=config.symmetric, damp=config.damp, block_size=config.block_size)
            replace_module(model, name, IntLinear.from_codes(lin, q, s, z, bits=config.bits,
                                                             group_size=config.group_size, symmetric=config.symmetric))
    if thin:
        notes.append(f"gptq: few calibration rows for {', '.join(thin)}; with fewer than 2x in_features rows the "
                     f"codes can overfit the calibration windows: give more --calib-batches / --seq-len")


@register_handler(BnbConfig)
def _bnb(model: nn.Module, names: list[str], config: BnbConfig, calibration: ForwardLoop | None,
         notes: list[str]) -> None:
    for name in names:
        lin = model.get_submodule(name)
        new = Bnb8bitLinear.from_linear(lin) if config.quant_type == "int8" else \
            Bnb4bitLinear.from_linear(lin, config.quant_type, config.blocksize)  # type: ignore[arg-type]
        replace_module(model, name, new)
    if config.quant_type == "int8":
        notes.append("bnb int8 is weight-only here: computed by dequantising (bitsandbytes int8_vectorwise_dequant)")


@register_handler(Fp8WeightOnlyConfig)
def _fp8(model: nn.Module, names: list[str], config: Fp8WeightOnlyConfig, calibration: ForwardLoop | None,
         notes: list[str]) -> None:
    for name in names:
        replace_module(model, name, Fp8Linear.from_linear(model.get_submodule(name)))
    notes.append("fp8: weights stored as float8_e4m3fn and computed by dequantising to the activation dtype "
                 "(no native fp8 matmul is used, on any device)")


# ----------------------------------------------------------------------------------------------
# Which modules
# ----------------------------------------------------------------------------------------------


def matches(pattern: str, name: str) -> bool:
    """`pattern` is the full dotted name, a run of its segments, or a glob over the full name."""
    return f".{pattern}." in f".{name}." or fnmatch.fnmatchcase(name, pattern)


def select_modules(model: nn.Module, config: QuantizeConfig) -> tuple[list[str], list[dict[str, str]]]:
    """(names of the Linears to quantize, [{"module", "reason"}] of the weight modules left alone)."""
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    embeds = [n for n, m in model.named_modules() if isinstance(m, nn.Embedding)]
    tied = {n for n in linears if any(model.get_submodule(n).weight is model.get_submodule(e).weight for e in embeds)}
    for field, pats in (("include", config.include), ("exclude", config.exclude)):
        for p in pats:
            if not any(matches(p, n) for n in linears):
                hint = " (embeddings are never quantized)" if any(matches(p, e) for e in embeds) else ""
                raise ConfigError(f"--{field} {p!r} matches no Linear of this drafter{hint}; its Linears: "
                                  f"{', '.join(linears)}")
    both = [p for p in config.include if p in config.exclude]
    if both:
        raise ConfigError(f"{', '.join(both)} is both included and excluded; name it once")
    chosen: list[str] = []
    skipped: list[dict[str, str]] = [{"module": e, "reason": "embedding (kept in full precision)"} for e in embeds]
    for n in linears:
        if n in tied:
            skipped.append({"module": n, "reason": "tied to the embeddings (kept in full precision)"})
        elif any(matches(p, n) for p in config.exclude):
            skipped.append({"module": n, "reason": "excluded"})
        elif n.rpartition(".")[2] == "lm_head" and not any(matches(p, n) for p in config.include):
            skipped.append({"module": n, "reason": "draft head (full precision unless --include lm_head)"})
        else:
            chosen.append(n)
    return chosen, skipped


def _suggest_group_size(ks: list[int], wanted: int) -> int:
    g = math.gcd(*ks)
    best = 1
    for cand in range(2, min(g, wanted) + 1, 2):
        if g % cand == 0:
            best = cand
    return best


def check_quantizable(model: nn.Module, names: list[str], config: QuantizeConfig) -> None:
    """Raise a clear error for a layer / platform this config cannot handle (before touching anything)."""
    for n in names:
        w = model.get_submodule(n).weight
        if w.dtype not in FLOAT_DTYPES:
            raise UsageError(f"{n}: weight dtype {w.dtype} cannot be quantized; load the drafter in fp32, bf16 or "
                             f"fp16")
    if isinstance(config, IntWeightOnlyConfig):
        ks = [model.get_submodule(n).in_features for n in names]
        g = config.group_size
        for n, k in zip(names, ks):
            if g is not None and k % g:
                raise ConfigError(f"group size {g} does not divide {n}'s in_features {k}; use --group-size "
                                  f"{_suggest_group_size(ks, g)} (divides every quantized layer) or --exclude {n}")
            if config.bits == 4 and k % 2:
                raise ConfigError(f"{n}: in_features {k} is odd; int4 packs two codes per byte ({n} can be excluded)")
    if isinstance(config, BnbConfig) and config.blocksize is not None:
        # bitsandbytes 0.50's CPU dequantize_4bit kernel walks blocks row by row: a block that crosses a
        # row end decodes wrongly (SQNR ~10 dB instead of ~20), so blocks must tile each row.
        ks = [model.get_submodule(n).in_features for n in names]
        for n, k in zip(names, ks):
            if k % config.blocksize:
                ok = [b for b in BNB_BLOCKSIZES if all(kk % b == 0 for kk in ks)]
                fix = f"use --group-size {ok[-1]} or --exclude {n}" if ok else \
                    f"no bitsandbytes block size divides every layer: --exclude {n}"
                raise ConfigError(f"bitsandbytes block size {config.blocksize} does not divide {n}'s in_features "
                                  f"{k} (blocks must tile each row); {fix}")
    if isinstance(config, Fp8WeightOnlyConfig) and not hasattr(torch, "float8_e4m3fn"):
        raise UsageError(f"this torch ({torch.__version__}) has no float8_e4m3fn dtype; fp8 needs torch >= 2.1")
    if isinstance(config, BnbConfig) and names:
        bnb = import_bnb()
        w = model.get_submodule(names[0]).weight
        probe = torch.randn(4, 64, dtype=w.dtype, device=w.device)
        try:
            if config.quant_type == "int8":
                bnb.functional.int8_vectorwise_quant(probe)
            else:
                bnb.functional.quantize_4bit(probe, blocksize=config.blocksize, quant_type=config.quant_type)
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            raise UsageError(f"bitsandbytes {config.quant_type} cannot run on {w.device} with {w.dtype} weights here "
                             f"({exc}); try --scheme int4/int8 (torch-only) or another dtype/device") from None


# ----------------------------------------------------------------------------------------------
# The verb
# ----------------------------------------------------------------------------------------------


def stored_bytes(model: nn.Module, float_dtype: torch.dtype | None = None) -> int:
    """Bytes of the tensors the drafter stores itself (public_state_dict), floats at `float_dtype`
    (default: as they are); quantized tensors always as they are."""
    sd = model.public_state_dict() if hasattr(model, "public_state_dict") else model.state_dict()
    frozen = quantized_keys(model)
    total = 0
    for k, v in sd.items():
        size = v.element_size()
        if float_dtype is not None and v.is_floating_point() and k not in frozen:
            size = torch.empty((), dtype=float_dtype).element_size()
        total += v.numel() * size
    return total


def round_floats(model: nn.Module, float_dtype: torch.dtype) -> None:
    """Round the drafter's own float tensors (everything but quantized codes and scales) to `float_dtype`
    in place, keeping their dtype: the in-memory model then computes exactly what a reload of the
    artifact saved with floats in `float_dtype` computes, so acceptance is measured on what is stored."""
    frozen = quantized_keys(model)
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if v.is_floating_point() and k not in frozen and v.dtype != float_dtype:
                v.copy_(v.to(float_dtype).to(v.dtype))


def resolve_float_dtype(choice: str | torch.dtype | None, source: torch.dtype) -> torch.dtype:
    """The dtype kept float tensors are stored in. "auto" (or None): the source's dtype when it is
    16-bit, else bfloat16 (what deployments store; the issue prices bytes against the 16-bit drafter);
    otherwise a dtype name (fp32 / bf16 / fp16 or their long names)."""
    from specpress.device import parse_dtype

    if choice in (None, "auto"):
        return source if source in (torch.bfloat16, torch.float16) else torch.bfloat16
    return parse_dtype(choice)  # type: ignore[arg-type]


def quantize(model: nn.Module, config: QuantizeConfig, calibration: ForwardLoop | None = None, *,
             float_dtype: torch.dtype | None = None) -> nn.Module:
    """Quantize `model`'s Linears in place per `config`; append the provenance step; return the model.

    calibration: a forward loop (called with the model; runs it on calibration data), required by
    configs with needs_calibration (GPTQ). float_dtype: the dtype the kept float tensors will be stored
    in: the byte counts use it and those tensors are rounded to it (default: left as they are).
    """
    handler = handler_for(config)
    if active_quantize_step(getattr(model, "provenance", ())) or quantized_modules(model):
        raise UsageError("this drafter is already quantized; quantize its full-precision artifact (or one written "
                         "with --dequantize)")
    if config.needs_calibration and calibration is None:
        raise UsageError(f"--method {config.method} calibrates on the activations entering each Linear: pass "
                         f"--target DIR and --data PATH (Python: calibration=DrafterCalibration(...))")
    names, skipped = select_modules(model, config)
    if not names:
        raise UsageError("nothing to quantize: every Linear is excluded or skipped "
                         f"({', '.join(s['module'] for s in skipped)})")
    check_quantizable(model, names, config)
    before = stored_bytes(model, float_dtype)
    originals = {n: model.get_submodule(n).weight.detach().clone() for n in names}
    notes: list[str] = []
    with torch.no_grad():
        handler(model, names, config, calibration, notes)
    if float_dtype is not None:
        round_floats(model, float_dtype)
    sq = {}
    for n in names:
        v = P.sqnr(originals[n], model.get_submodule(n).dequantize(torch.float32))
        sq[n] = None if math.isinf(v) else round(v, 2)
    mods = [model.get_submodule(n) for n in names]
    q_params = sum(m.in_features * m.out_features + (0 if m.bias is None else m.bias.numel()) for m in mods)
    fsize = None if float_dtype is None else torch.empty((), dtype=float_dtype).element_size()
    q_bytes = sum(t.numel() * (fsize if k == "bias" and fsize else t.element_size())
                  for m in mods for k, t in m.state_dict().items())
    step = {"step": "quantize", "scheme": config.scheme, "method": config.method, "config": config.to_dict(),
            "quantized": names, "skipped": skipped, "bytes_before": before,
            "bytes_after": stored_bytes(model, float_dtype), "quantized_params": q_params,
            "quantized_bytes": q_bytes, "weight_sqnr_db": sq, "notes": notes, "dequantized": False}
    model.provenance = (*tuple(getattr(model, "provenance", ()) or ()), step)
    return model


def update_step(model: nn.Module, **fields: Any) -> dict[str, Any]:
    """Add fields (e.g. agreement) to the model's last quantize step; returns the updated step."""
    steps = list(model.provenance)
    idx = max(i for i, s in enumerate(steps) if isinstance(s, Mapping) and s.get("step") == "quantize")
    steps[idx] = {**steps[idx], **fields}
    model.provenance = tuple(steps)
    return steps[idx]


def dequantize(model: nn.Module) -> nn.Module:
    """Replace every quantized module by an nn.Linear holding its dequantised weight (in place); the
    quantize step stays in the provenance, marked "dequantized": true."""
    mods = quantized_modules(model)
    if not mods:
        raise UsageError("this drafter holds no quantized modules to dequantise")
    for name, m in mods.items():
        replace_module(model, name, m.to_linear())
    if active_quantize_step(getattr(model, "provenance", ())):
        update_step(model, dequantized=True)
    return model
