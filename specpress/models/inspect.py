"""`inspect`: what an artifact holds (family, parameter count, bytes as stored, dtype, provenance).

Works on an artifact dir, a public checkpoint dir, or a bare config.json. Parameters are counted on a
model built on the meta device (no memory, seconds even for 8B-scale configs); `params` counts what the
drafter stores itself (shared target embeddings / heads excluded, int buffers such as d2t excluded).
`bytes` is read from the safetensors headers of the drafter's own tensors when weights exist, else the
size its dtype implies; tensors shared with the target that a checkpoint carries anyway are reported
apart as `shared_bytes`, and so are the target's head rows a shared draft head reads in place of a head of
its own (eagle3 `shared_head`: Vd x H at the artifact's float dtype; `shared_head_params`), so that a shared
head's saving is not mistaken for a free one. A quantized artifact (an active `quantize` provenance step) also gets
`quantization`: bytes, params and bits/param per quantized module (params = its Linear's weight + bias,
counted on the full-precision model, so `bits_per_param` is the effective bits per weight).
`target_precision` says which target the drafter was last aligned with (`target_precision`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specpress.errors import ConfigError
from specpress.models.io import read_config, tensor_index

_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
              "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
              "BOOL": "bool"}


def _config_dtype(cfg: dict[str, Any]) -> torch.dtype:
    name = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    dt = getattr(torch, str(name).removeprefix("torch."), None)
    return dt if isinstance(dt, torch.dtype) else torch.float32


def _implied_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of the module's state_dict if floats were stored in `dtype` (other tensors as they are)."""
    size = torch.empty((), dtype=dtype, device="meta").element_size()
    seen: set[int] = set()
    total = 0
    for t in model.state_dict(keep_vars=True).values():
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * (size if t.is_floating_point() else t.element_size())
    return total


def _elem(dtype: str) -> int:
    """Bytes per element of a float dtype name ("bfloat16"); 4 when it is not one."""
    dt = getattr(torch, dtype, None)
    return torch.empty((), dtype=dt, device="meta").element_size() if isinstance(dt, torch.dtype) else 4


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once


def inspect_artifact(path: str | Path) -> dict[str, Any]:
    """Summary dict: path, family, architecture, params, bytes, bytes_source ("weights" | "dtype"),
    shared_bytes, dtype, bits_per_param, format_version, target, provenance (the steps)."""
    from specpress.models.drafter_io import read_drafter_config
    from specpress.models.target import TargetConfig, TargetModel

    from specpress.models import serving_io

    path = Path(path).expanduser()
    cfg = serving_io.to_specpress_config(read_config(path), path)  # speculators / compressed-tensors / ModelOpt
    source = str(path / "config.json" if path.is_dir() else path)
    index = serving_io.rename_index(path, tensor_index(path)) if path.is_dir() else {}
    block = cfg.get("specpress") if isinstance(cfg.get("specpress"), dict) else {}
    is_target = not block and _plain_decoder(cfg, set(index))
    shared: dict[str, str] = {}
    head_rows = 0
    with torch.device("meta"):
        if is_target:
            family = "target"
            model: nn.Module = TargetModel(TargetConfig.from_hf(cfg, source=source))
        else:
            from specpress.models.drafter import get_family

            family, config, _ = read_drafter_config(path)
            model = get_family(family).model_cls(config)  # type: ignore[call-arg]
            shared = model.shared_keys()  # type: ignore[operator]
            head_rows = model.shared_head_params()  # type: ignore[operator]
    params = _params(model)
    own = {k: v for k, v in index.items() if k not in shared}
    if own:
        nbytes, source_kind = sum(v.nbytes for v in own.values()), "weights"
        dtype = _float_dtype(block or {}, own) or str(_config_dtype(cfg)).removeprefix("torch.")
    else:
        dt = _config_dtype(cfg)
        nbytes, source_kind, dtype = _implied_bytes(model, dt), "dtype", str(dt).removeprefix("torch.")
    archs = cfg.get("architectures") or []
    quant = _quantization(block or {}, own, model)
    warnings = []
    bits = 8 * nbytes / params if params else None
    if source_kind == "weights" and bits is not None and not MIN_BITS <= bits <= MAX_BITS:
        warnings.append(f"config.json implies {params:,} parameters but the weights hold {nbytes:,} bytes "
                        f"({bits:.3g} bits per parameter, outside {MIN_BITS}..{MAX_BITS}): the config and the weights "
                        f"disagree (an edited config.json, or weights of another model); the counts above are the "
                        f"config's")
    return {
        "warnings": warnings,
        "path": str(path),
        "family": family,
        "architecture": archs[0] if archs else cfg.get("model_type"),
        "params": params,
        "bytes": nbytes,
        "bytes_source": source_kind,
        "shared_bytes": sum(v.nbytes for k, v in index.items() if k in shared) + head_rows * _elem(dtype),
        "shared_head_params": head_rows,
        "dtype": dtype,
        "bits_per_param": round(8 * nbytes / params, 3) if params else None,
        "format_version": (block or {}).get("format_version"),
        "target": (block or {}).get("target"),
        "provenance": list((block or {}).get("steps") or []),
        "target_precision": target_precision((block or {}).get("steps")),
        **({"quantization": quant} if quant else {}),
    }


def _float_dtype(block: dict[str, Any], own: dict[str, Any]) -> str | None:
    """The dtype the artifact keeps its float weights in: a quantized one's recorded float_dtype (its scales
    and codes are other dtypes, often more tensors), else the float dtype holding the most bytes."""
    from specpress.models.quantized.restore import active_quantize_step

    step = active_quantize_step(block.get("steps"))
    if step is not None and step.get("float_dtype"):
        return str(step["float_dtype"])
    floats: Counter[str] = Counter()
    for v in own.values():
        if v.dtype.startswith(("F", "BF")) and not v.dtype.startswith("F8"):
            floats[v.dtype] += v.nbytes
    return _ST_DTYPES.get(floats.most_common(1)[0][0], "?") if floats else None


MIN_BITS, MAX_BITS = 1, 64  # bits per parameter any stored scheme takes (nf4 ~4.1 ... fp64 64)


def target_precision(steps: Any) -> dict[str, Any] | None:
    """The target precision a drafter was last aligned with: the last provenance step that ran the target on
    data for it (a distill, which trains on its signals; a quantize that calibrated on or was measured against
    it), as {"label", "spec", "step" (1-based), "by" (its kind)}; "float" / "none" when that step ran the float
    target (every step written before --target-quant existed did). None when no step ran a target."""
    for i, step in reversed(list(enumerate(steps if isinstance(steps, list) else (), 1))):
        if not isinstance(step, dict):
            continue
        kind = step.get("step")
        if kind == "distill":
            data = step.get("data")
            tq = data.get("target_quant") if isinstance(data, dict) else None
        elif kind == "quantize" and (step.get("calibration") or step.get("agreement")):
            tq = step.get("target_quant")
        else:
            continue
        if not isinstance(tq, dict):  # absent (the float target), or an edited config's non-object
            return {"label": "float", "spec": "none", "step": i, "by": kind}
        return {"label": str(tq.get("label", "?")), "spec": str(tq.get("spec", "?")), "step": i, "by": kind}
    return None


def _quantization(block: dict[str, Any], index: dict[str, Any], model: nn.Module) -> dict[str, Any] | None:
    """For a quantized artifact: scheme, and bytes / params / bits per param of each quantized module
    (its stored tensors over its Linear's weight + bias) and of everything else."""
    from specpress.models.quantized.restore import active_quantize_step

    step = active_quantize_step(block.get("steps"))
    if step is None or not index:
        return None
    modules: dict[str, Any] = {}
    for name in step.get("quantized") or ():
        try:
            lin = model.get_submodule(name)
        except AttributeError:
            continue
        params = sum(p.numel() for p in lin.parameters())
        nbytes = sum(v.nbytes for k, v in index.items() if k.startswith(name + "."))
        modules[name] = {"params": params, "bytes": nbytes, "bits_per_param": round(8 * nbytes / params, 3)}
        if step.get("module_configs"):  # a mixed step (quantize --budget): each Linear's own scheme
            from specpress.models.quantized.scheme import config_from_dict as _cfg

            modules[name]["scheme"] = _cfg(step["module_configs"].get(name) or {}).storage_label()
    q_params = sum(m["params"] for m in modules.values())
    q_bytes = sum(m["bytes"] for m in modules.values())
    rest = sum(v.nbytes for v in index.values()) - q_bytes
    from specpress.errors import ConfigError
    from specpress.models.quantized.scheme import config_from_dict, scheme_of

    try:
        if step.get("module_configs"):  # mixed: each scheme's, joined (each Linear's scheme is in `modules`)
            cfgs = [config_from_dict(c) for c in step["module_configs"].values()]
            modes = sorted({c.act_mode for c in cfgs})
            acts = modes[0] if len(modes) == 1 else "+".join(modes)
            speed = "; ".join(dict.fromkeys(f"{c.storage_label()}: {scheme_of(c).speed}" for c in cfgs))
        else:
            cfg = config_from_dict(step.get("config") or {})
            acts, speed = cfg.act_mode, scheme_of(cfg).speed
    except ConfigError:
        acts, speed = None, None
    if acts not in (None, "none") and not step.get("module_configs"):
        speed = f"{acts} activations emulated on the CPU (fake-quantized input, dequantized weight): saves bytes, not time"
    return {"scheme": step.get("scheme"), "method": step.get("method"), "config": step.get("config"),
            "activations": acts, "speed": speed,
            "modules": modules, "quantized_params": q_params, "quantized_bytes": q_bytes,
            "quantized_bits_per_param": round(8 * q_bytes / q_params, 3) if q_params else None,
            "other_bytes": rest}


def _plain_decoder(cfg: dict[str, Any], names: set[str]) -> bool:
    """A plain HF decoder config (not any drafter's public layout): inspected as a target."""
    from specpress.models.drafter import get_family
    from specpress.models.drafter_io import detect_family

    try:
        return get_family(detect_family(cfg, names or None)).session == "lm"  # an independent LM: a plain decoder
    except ConfigError:  # not a decoder we know: the drafter path reports it
        return False
