"""Save and load drafter artifacts: config.json in the family's public layout + a `specpress` block,
and model.safetensors under the public key names.

A drafter whose provenance ends in an active `quantize` step holds quantized modules: load_drafter
rebuilds them (specpress.models.quantized.restore) before loading, and their tensors
(packed codes, scales, fp8 weights; each scheme file under models/quantized/ documents its keys) keep their stored dtypes both ways.

The `specpress` block: {family, format_version, config_version, target (fingerprint of the target it
was built for), steps (the ordered compression steps applied, each a JSON object)}. Public checkpoints
without it load too: the family is told from `architectures` and telltale fields, by each family's
detection rule (see detect_family).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

import torch
from torch import nn

from specpress.artifacts import atomic_dir, write_json
from specpress.errors import CheckpointError, ConfigError, RequestError
from specpress.models.drafter import Drafter, detection_rules, families_where, get_family
from specpress.models.io import check_finite, read_config, read_weights, save_weights, tensor_index
from specpress.models.layers import Rotary
from specpress.models.quantized.restore import active_quantize_step, quantized_keys, restore_quantized

if TYPE_CHECKING:
    from specpress.models.target import TargetModel

FORMAT_VERSION = 1
FLOAT8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


def detect_family(cfg: Mapping[str, Any], weight_names: Collection[str] | None = None,
                  source: str = "config.json") -> str:
    """The drafter family of a config.json (+ the tensor names, when known).

    A `specpress` block wins. Else the first family whose detection rule (its `detection` trait,
    models/family.py Detection) claims the config, asked in priority order; the built-ins: EAGLE-3
    architectures or `draft_vocab_size` -> eagle3; `DFlashDraftModel` / `dflash_config` -> dflash;
    `num_nextn_predict_layers` -> mtp; weights holding `fc.weight` (or, with no weights, EAGLE-1's `bias`
    field) -> eagle; any other supported HF decoder -> lm.
    """
    block = cfg.get("specpress")
    if isinstance(block, Mapping) and block.get("family"):
        return str(block["family"])
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ConfigError(f"{source}: 'architectures' must be a list of class names (strings), found {archs!r}")
    if not isinstance(cfg.get("model_type", ""), str):
        raise ConfigError(f"{source}: 'model_type' must be a string, found {cfg['model_type']!r}")
    arch = archs[0] if archs else ""
    rules = detection_rules()
    for name, rule in rules:
        if rule.claims(cfg, arch, weight_names):
            return name
    names = families_where(lambda f: f.detection is not None)
    known = sorted(set().union(*(rule.known_architectures() for _, rule in rules)))
    raise ConfigError(f"{source}: cannot tell which drafter family this is: none claims architectures {archs}; "
                      f"known families: {', '.join(names)} (architectures {', '.join(known)})")


def save_drafter(model: Drafter, out: str | Path, *, provenance: Sequence[Mapping[str, Any]] | None = None,
                 force: bool = False, dtype: torch.dtype | None = None, include_shared: bool = False) -> Path:
    """Write `out`/config.json + model.safetensors atomically; return `out`.

    provenance: the ordered compression steps (default: model.provenance, what it was loaded with);
    dtype: the stored float dtype (default: the drafter's); include_shared: also store the target's
    embedding/head under the family's public names (for loaders that expect them, e.g. vLLM EAGLE-1).
    """
    fam = get_family(model.family)
    steps = [dict(s) for s in (model.provenance if provenance is None else provenance)]
    try:
        json.dumps(steps)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"provenance steps must be JSON objects ({exc})") from None
    sd = model.public_state_dict()
    if include_shared:
        for key, role in model.shared_keys().items():
            sd[key] = getattr(model.shared, role).weight.detach().clone()
    dt = dtype or model.compute_param().dtype
    frozen = quantized_keys(model)
    sd = {k: (v.to(dt) if v.is_floating_point() and k not in frozen else v) for k, v in sd.items()}
    cfg = fam.writer(model.config)
    cfg["torch_dtype"] = str(dt).removeprefix("torch.")
    cfg["specpress"] = {"family": model.family, "format_version": FORMAT_VERSION,
                        "config_version": model.config.version, "target": model.target_fingerprint,
                        "steps": steps}
    out = Path(out).expanduser()
    with atomic_dir(out, force=force) as tmp:
        write_json(tmp / "config.json", cfg)
        save_weights(sd, tmp / "model.safetensors")
    return out


def read_drafter_config(path: str | Path) -> tuple[str, Any, dict[str, Any]]:
    """(family, family config, the raw config.json) of a drafter dir or a bare config.json."""
    from specpress.models import serving_io

    path = Path(path).expanduser()
    cfg = serving_io.to_specpress_config(read_config(path), path)  # speculators / compressed-tensors / ModelOpt
    source = str(path / "config.json" if path.is_dir() else path)
    names = set(tensor_index(path)) if path.is_dir() else None
    block = check_block(cfg.get("specpress"), source)
    family = detect_family(cfg, names, source)
    if block.get("format_version", FORMAT_VERSION) > FORMAT_VERSION:
        raise CheckpointError(f"{source}: artifact format_version {block['format_version']} is newer than this "
                              f"specpress reads ({FORMAT_VERSION}); upgrade specpress")
    reader = get_family(family).reader
    try:
        return family, reader(cfg, source), cfg
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as exc:
        # the family's reader met a field of the wrong type or shape (a hand-edited config.json)
        why = f"{type(exc).__name__}: {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0][:200]
        raise ConfigError(f"{source}: not a readable {family} config ({why}); restore it, or compare it with one "
                          f"specpress wrote") from None


def check_drafter_config(path: str | Path | None) -> None:
    """Read a drafter artifact's config.json (config.json beside safetensors weights; anything else is left
    to its loader) so that its sizes and fields are checked before a command builds the target: a refusal
    that needs one JSON read must not wait for a multi-GB target to load."""
    if path is None:
        return
    path = Path(path).expanduser()
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        read_drafter_config(path)


def check_block(block: Any, source: str) -> dict[str, Any]:
    """The `specpress` block of a drafter's config.json (what specpress wrote), its fields of the types
    specpress writes; {} when there is none."""
    if block is None:
        return {}
    fix = "restore it (or remove the `specpress` block to read the config as a public checkpoint)"
    if not isinstance(block, dict):
        raise CheckpointError(f"{source}: the `specpress` block must be an object, found {block!r:.60}; {fix}")
    types = {"family": str, "format_version": int, "config_version": int, "target": (dict, type(None)),
             "steps": list}
    for key, want in types.items():
        if key in block and (not isinstance(block[key], want) or isinstance(block[key], bool)):
            raise CheckpointError(f"{source}: specpress.{key} has the wrong type ({block[key]!r:.60}); {fix}")
    if not all(isinstance(step, dict) for step in block.get("steps", [])):
        raise CheckpointError(f"{source}: specpress.steps must be a list of objects (the compression steps); {fix}")
    return block


def load_drafter(path: str | Path, target: "TargetModel | None" = None, *,
                 dtype: torch.dtype | str = torch.float32, device: torch.device | str | None = None) -> Drafter:
    """Load a drafter dir (ours or a public one), checking names, shapes and finiteness.

    With `target`, the drafter is attached to it (its dims, vocab and layer count must match).
    Tensors the drafter shares with the target (embed_tokens, lm_head) are dropped if present.
    """
    from specpress.device import parse_dtype, pick_device

    path = Path(path).expanduser()
    family, config, raw = read_drafter_config(path)
    fam = get_family(family)
    from specpress.models import serving_io

    weights = serving_io.to_specpress_weights(path, read_weights(path))
    check_finite({k: (v.float() if v.dtype in FLOAT8 else v) for k, v in weights.items()}, path)
    dt = parse_dtype(dtype)
    with torch.device("meta"):
        model = fam.model_cls(config)  # type: ignore[call-arg]
    block = raw.get("specpress") or {}
    frozen: set[str] = set()
    step = active_quantize_step(block.get("steps"))
    if step is not None:  # swap in the quantized modules; their tensors load in their stored dtypes
        frozen = restore_quantized(model, step, weights, dt, str(path))
    shared = model.shared_keys()
    weights = {k: (v.to(dt) if v.is_floating_point() and k not in frozen else v) for k, v in weights.items()
               if k not in shared}
    model.load_public(weights, str(path))
    _rebuild_rotaries(model)
    model.provenance = tuple(block.get("steps") or ())
    model.kv_cache_format = str((step or {}).get("kv_cache", "none"))
    model.target_fingerprint = block.get("target")
    dev = target.lm_head.weight.device if target is not None and device is None else pick_device(
        None if device is None else str(device))
    model = model.to(dev).eval()
    if target is None:
        return model
    saved = model.target_fingerprint
    serving_io.check_verifier(raw, target.config.architecture, str(path))
    model.attach_target(target)
    model.fingerprint_mismatch = fingerprint_diff(saved, model.target_fingerprint)
    return model


def load_drafter_for(target: "TargetModel", path: str | Path, *, strict: bool = False,
                     warn: Callable[[str], None] = print, device: torch.device | str | None = None) -> Drafter:
    """`load_drafter(path, target)` for decoding against `target`: a drafter built for another target (its
    recorded fingerprint differs) warns through `warn`, or fails with `strict`, since acceptance will suffer."""
    drafter = load_drafter(path, target, device=device)
    if drafter.fingerprint_mismatch:
        msg = (f"drafter {path} was built for a different target (differs in "
               f"{', '.join(drafter.fingerprint_mismatch)}); acceptance will suffer")
        if strict:
            raise RequestError(msg + "; drop --strict to run it anyway")
        warn("warning: " + msg)
    return drafter


def fingerprint_diff(saved: dict | None, current: dict | None) -> list[str]:
    """Fields on which the target a drafter was built for differs from `current` (both recorded)."""
    if not saved or not current:
        return []
    return [k for k in sorted(set(saved) & set(current)) if saved[k] != current[k]]


def _rebuild_rotaries(model: nn.Module) -> None:
    """Rotary tables are non-persistent buffers: rebuild them off the meta device after loading."""
    for name, mod in list(model.named_modules()):
        if isinstance(mod, Rotary):
            parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            setattr(parent, name.rpartition(".")[2], Rotary(mod.rope, mod.head_dim, mod.max_positions))
