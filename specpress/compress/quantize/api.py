"""`quantize(model, config, calibration=None) -> model`: the one verb, dispatched on the config's type.

    from specpress.compress.quantize.api import quantize
    from specpress.models.quantized.scheme import config_for
    quantize(drafter, config_for("int4", group_size=64))
    quantize(drafter, config_for("int4", "gptq"), calibration=DrafterCalibration(target, drafter, sampler))

The config's scheme (specpress/models/quantized/scheme.py) checks the layers and, for calibration-free
configs, quantizes them; calibrated methods are registered by config type (handlers.py).

Which modules: every nn.Linear of the drafter, except (reported in the step's `skipped`)
  - a draft `lm_head` (EAGLE-3's reduced-vocab head, an lm drafter's own head; both factors of a low-rank
    head, `lm_head.down` / `lm_head.up`): full precision unless the config's `include` names it (`lm_head`
    names both factors); an lm_head tied to the embeddings is never quantized;
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
from typing import Any, Mapping

import torch
from torch import nn

from specpress.compress.quantize import gptq, smoothing  # noqa: F401  (register the calibrated methods' handlers)
from specpress.compress.quantize.activations import calibrate_inputs
from specpress.compress.quantize.handlers import ForwardLoop, handler_for
from specpress.errors import ConfigError, RequestError, UsageError
from specpress.models.quantized import primitives as P
from specpress.models.quantized.configs import QuantizeConfig
from specpress.models.quantized.modules import quantized_modules
from specpress.models.quantized.restore import active_quantize_step, quantized_keys, replace_module
from specpress.models.quantized.scheme import scheme_of

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
        elif "lm_head" in n.split(".") and not any(matches(p, n) for p in config.include):  # low-rank factors too
            skipped.append({"module": n, "reason": "draft head (full precision unless --include lm_head)"})
        else:
            chosen.append(n)
    return chosen, skipped


def check_quantizable(model: nn.Module, names: list[str], config: QuantizeConfig) -> None:
    """Raise a clear error for a layer / platform this config cannot handle (before touching anything)."""
    for n in names:
        w = model.get_submodule(n).weight
        if w.dtype not in FLOAT_DTYPES:
            raise RequestError(f"{n}: weight dtype {w.dtype} cannot be quantized; load the drafter in fp32, bf16 or "
                               f"fp16")
    scheme_of(config).check(model, names, config)


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
                # a block at a time: no whole-tensor temporaries (a 32k x 2048 head: 0.4 GB)
                for block in (v.view(-1).split(1 << 20) if v.is_contiguous() else (v,)):
                    block.copy_(block.to(float_dtype).to(v.dtype))


def resolve_float_dtype(choice: str | torch.dtype | None, source: torch.dtype) -> torch.dtype:
    """The dtype kept float tensors are stored in. "auto" (or None): the source's dtype when it is
    16-bit, else bfloat16 (what deployments store; the issue prices bytes against the 16-bit drafter);
    otherwise a dtype name (fp32 / bf16 / fp16 or their long names)."""
    from specpress.device import parse_dtype

    if choice in (None, "auto"):
        return source if source in (torch.bfloat16, torch.float16) else torch.bfloat16
    return parse_dtype(choice)  # type: ignore[arg-type]


def quantize_linears(model: nn.Module, names: list[str], config: QuantizeConfig, calibration: ForwardLoop | None,
                     notes: list[str]) -> None:
    """Replace the named Linears by `config`'s quantized modules (codes, then the activation mode), nothing else:
    no checks, no provenance (what `quantize` and the budget's sensitivity pass share)."""
    with torch.no_grad():
        handler_for(config)(model, names, config, calibration, notes)
        for n in names:  # the activation mode, for handlers that only chose codes (GPTQ)
            m = model.get_submodule(n)
            if m.act_mode != config.act_mode:
                m.configure_input(config.act_mode, m.pre_quant_scale)


def quantize(model: nn.Module, config: QuantizeConfig, calibration: ForwardLoop | None = None, *,
             float_dtype: torch.dtype | None = None,
             per_module: Mapping[str, QuantizeConfig | None] | None = None) -> nn.Module:
    """Quantize `model`'s Linears in place per `config`; append the provenance step; return the model.

    calibration: a forward loop (called with the model; runs it on calibration data), required by
    configs that need data (calibrated methods such as GPTQ, static activation scales). float_dtype: the dtype the kept float tensors will be stored
    in: the byte counts use it and those tensors are rounded to it (default: left as they are).
    per_module: a scheme per selected Linear (None: keep it in float), as `quantize --budget` allocates them;
    `config` then only selects the modules. More than one scheme makes a "mixed" step: its `config` is
    {"name": "mixed", include, exclude} and `module_configs` holds each quantized Linear's config.
    """
    if active_quantize_step(getattr(model, "provenance", ())) or quantized_modules(model):
        raise RequestError("this drafter is already quantized; quantize its full-precision artifact (or one written "
                           "with --dequantize)")
    if config.needs_data() and calibration is None and per_module is None:
        what = f"--method {config.method}" if config.needs_calibration else "--activations static"
        raise UsageError(f"{what} calibrates on the activations entering each Linear: pass --target DIR and --data "
                         f"PATH (Python: calibration=DrafterCalibration(...))")
    names, skipped = select_modules(model, config)
    groups: dict[QuantizeConfig, list[str]] = {config: names}
    if per_module is not None:
        missing = [n for n in names if n not in per_module]
        if missing:
            raise UsageError(f"per_module names no scheme for {', '.join(missing)}; give one per selected Linear "
                             f"(None keeps it in float)")
        skipped += [{"module": n, "reason": "kept in float by the budget's allocation"} for n in names
                    if per_module[n] is None]
        groups = {}
        for n in names:
            if per_module[n] is not None:
                groups.setdefault(per_module[n], []).append(n)  # type: ignore[index]
        names = [n for n in names if per_module[n] is not None]
        if any(c.needs_data() for c in groups):
            raise UsageError("a per-module scheme that needs calibration data cannot be allocated; use "
                             "calibration-free candidates")
    if not names:
        raise RequestError("nothing to quantize: every Linear is excluded or skipped "
                           f"({', '.join(s['module'] for s in skipped)})")
    for cfg, group in groups.items():
        check_quantizable(model, group, cfg)
    before = stored_bytes(model, float_dtype)
    # the float weights, for the SQNR: the replaced Linears' own tensors (no copy: 4 bytes a quantized parameter at
    # the 1B shape); no handler writes into them, which the version counters confirm below
    originals = {n: model.get_submodule(n).weight.detach() for n in names}
    versions = {n: w._version for n, w in originals.items()}
    notes: list[str] = []
    for cfg, group in groups.items():
        quantize_linears(model, group, cfg, calibration, notes)
    input_amax = calibrate_inputs(model, names, config, calibration, notes) if per_module is None else {}
    if float_dtype is not None:
        round_floats(model, float_dtype)
    sq = {}
    for n in names:
        assert originals[n]._version == versions[n], f"quantizing {n} wrote into its float weight"
        v = P.sqnr(originals[n], model.get_submodule(n).dequantize(torch.float32))
        sq[n] = None if math.isinf(v) else round(v, 2)
    mods = [model.get_submodule(n) for n in names]
    q_params = sum(m.in_features * m.out_features + (0 if m.bias is None else m.bias.numel()) for m in mods)
    fsize = None if float_dtype is None else torch.empty((), dtype=float_dtype).element_size()
    q_bytes = sum(t.numel() * (fsize if k == "bias" and fsize else t.element_size())
                  for m in mods for k, t in m.state_dict().items())
    only = next(iter(groups)) if len(groups) == 1 else None
    if only is not None and per_module is not None:  # one scheme (or float) everywhere: an ordinary step
        only = type(only).from_dict({**only.to_dict(), "include": list(config.include),
                                     "exclude": list(config.exclude)})
    head: dict[str, Any] = ({"scheme": only.scheme, "method": only.method, "config": only.to_dict()} if only else
                            {"scheme": "mixed", "method": "+".join(dict.fromkeys(c.method for c in groups)),
                             "config": {"name": "mixed", "include": list(config.include),
                                        "exclude": list(config.exclude)},
                             "module_configs": {n: c.to_dict() for c, g in groups.items() for n in g}})
    step = {"step": "quantize", **head,
            "quantized": names, "skipped": skipped, "bytes_before": before,
            "bytes_after": stored_bytes(model, float_dtype), "quantized_params": q_params,
            "quantized_bytes": q_bytes, "weight_sqnr_db": sq, "notes": notes, "dequantized": False,
            **({"input_amax": input_amax} if input_amax else {}),
            **({"kv_cache": config.kv_cache} if config.kv_cache != "none" else {})}
    if hasattr(model, "kv_cache_format"):
        model.kv_cache_format = config.kv_cache
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
        raise RequestError("this drafter holds no quantized modules to dequantise")
    if getattr(model, "kv_cache_format", "none") != "none":
        raise RequestError("--dequantize writes plain float weights, which cannot carry an fp8 KV cache: drop "
                           "--kv-cache")
    for name, m in mods.items():
        replace_module(model, name, m.to_linear())
    if active_quantize_step(getattr(model, "provenance", ())):
        update_step(model, dequantized=True)
    return model
