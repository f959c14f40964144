"""Read drafters written in serving layouts back into specpress's own (config + tensors), so inspect,
bench, prune and quantize accept them: a drafter trained by speculators or quantized for vLLM / ModelOpt
can be compressed further and measured here.

    speculators           config.json with `speculators_model_type` (eagle3, dflash)
    compressed-tensors    `quantization_config.quant_method == "compressed-tensors"` (any family's layout)
    ModelOpt              `hf_quant_config.json` beside config.json (fp8 per channel)

to_specpress_config turns such a config.json into the family's public config.json with a `specpress`
block whose last step is the quantization the checkpoint holds (rebuilt from its quantization config when
the checkpoint was not written by specpress); to_specpress_weights renames and re-lays the tensors out
under specpress's keys (modules.py), bit for bit. Both return their input unchanged for specpress's own
layout. The writers live in specpress/export/hf/.

A checkpoint specpress wrote records its quantize step: its Linears are read back by that scheme's encoding in
the format (models/formats/encodings.py), after checking that the format's own description (config group /
quant_algo) is the one that encoding writes. Others are read from their quantization config (weight-only
int4 / int8 / fp8 per channel).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor

from specpress.errors import CheckpointError, ConfigError


def _dir(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def layout(cfg: Mapping[str, Any], path: Path) -> str | None:
    """"speculators" / "compressed-tensors" / "modelopt", or None for specpress's own layout."""
    if "speculators_model_type" in cfg:
        return "speculators"
    q = cfg.get("quantization_config") or {}
    if q.get("quant_method") == "compressed-tensors":
        return "compressed-tensors"
    if q.get("quant_method") == "modelopt" or (_dir(path) / "hf_quant_config.json").is_file():
        return "modelopt"
    if q:
        raise ConfigError(f"{path}: quantization_config.quant_method {q.get('quant_method')!r} is not read by "
                          f"specpress (it reads compressed-tensors and ModelOpt fp8)")
    return None


def _hf_quant_config(path: Path) -> dict[str, Any]:
    f = _dir(path) / "hf_quant_config.json"
    if not f.is_file():
        raise CheckpointError(f"{_dir(path)}: a ModelOpt quantization_config without hf_quant_config.json")
    from specpress.readback import read_json_object

    return read_json_object(f, "restore it (ModelOpt writes it beside config.json)")


def _quant(cfg: Mapping[str, Any], path: Path, mine: Mapping[str, Any] | None = None
           ) -> tuple[str, dict[str, Any] | None, list[str]]:
    """(kind, specpress quantize config dict or None, target/exclude patterns); `mine`: the quantize step
    specpress recorded, whose config is the one read (checked against the file by _check_recorded)."""
    kind = layout({k: v for k, v in cfg.items() if k != "speculators_model_type"}, path)
    if mine is not None and kind != "none":
        return kind, dict(mine.get("config") or {}), []
    if kind == "compressed-tensors":
        from specpress.models.formats.compressed_tensors import parse_quantization_config

        q, pats = parse_quantization_config(cfg["quantization_config"], str(path))
        return kind, q, pats
    if kind == "modelopt":
        from specpress.models.formats.modelopt import parse

        q, pats = parse(_hf_quant_config(path), str(path))
        return kind, q, pats
    return "none", None, []


def _stored_names(path: Path, kind: str) -> list[str]:
    """Checkpoint names of the quantized Linears, from the tensor names alone (no data read)."""
    from specpress.models.io import tensor_index

    if not _dir(path).is_dir() or not path.is_dir():
        return []
    idx = tensor_index(path)
    if kind == "compressed-tensors":
        names = [k[: -len(".weight_packed")] for k in idx if k.endswith(".weight_packed")]
        return names or [k[: -len(".weight")] for k, v in idx.items() if k.endswith(".weight") and v.dtype == "F8_E4M3"]
    return [k[: -len(".weight")] for k, v in idx.items() if k.endswith(".weight") and v.dtype == "F8_E4M3"]


def _num_target_layers(block: Mapping[str, Any], cfg: Mapping[str, Any]) -> int | None:
    fp = block.get("target") or {}
    if fp.get("num_hidden_layers"):
        return int(fp["num_hidden_layers"])
    ver = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    if ver and (Path(ver).expanduser() / "config.json").is_file():
        from specpress.models.io import read_config

        layers = read_config(Path(ver).expanduser()).get("num_hidden_layers")
        return layers if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0 else None
    return None


def to_specpress_config(cfg: dict[str, Any], path: Path | str) -> dict[str, Any]:
    """A serving-layout config.json -> the public config.json + `specpress` block specpress reads."""
    path = Path(path).expanduser()
    kind = layout(cfg, path)
    if kind is None:
        return cfg
    from specpress.models.formats import speculators as sp

    block = dict(cfg.get("specpress") or {})
    if kind == "speculators":
        out = sp.to_public_config(cfg, str(path), _num_target_layers(block, cfg))
        block.setdefault("family", sp.family_of(cfg["speculators_model_type"]))
        block["verifier"] = dict(cfg["speculators_config"]["verifier"])
        rename = lambda n: sp.rename_in(cfg["speculators_model_type"], n)  # noqa: E731
    else:
        out = {k: v for k, v in cfg.items() if k not in ("quantization_config", "specpress")}
        rename = lambda n: n  # noqa: E731
    steps = list(block.get("steps") or [])
    from specpress.models.drafter_io import active_quantize_step

    qkind, qcfg, _ = _quant(cfg, path, active_quantize_step(steps))

    mine = active_quantize_step(steps)
    if qcfg is not None and mine is not None:
        _check_recorded(cfg, path, qkind, mine)
    if qcfg is not None and mine is None:
        names = [rename(n) for n in _stored_names(path, qkind)]
        scheme = "fp8" if qcfg["name"] == "fp8" else f"int{qcfg['bits']}"
        steps.append({"step": "quantize", "scheme": scheme, "method": "rtn", "config": qcfg, "quantized": names,
                      "skipped": [], "notes": [f"imported from a {qkind} checkpoint"], "dequantized": False})
    elif qcfg is None and mine is not None:
        raise CheckpointError(f"{path}: the specpress block records a {mine.get('scheme')} quantization but the "
                              f"checkpoint has no quantization_config; the file was edited: re-export it")
    block["steps"] = steps
    block.pop("exported_as", None)
    out["specpress"] = block
    return out


def to_specpress_weights(path: Path | str, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """Tensors of a serving-layout checkpoint -> specpress's keys (renamed, quantized ones re-laid out)."""
    from specpress.models.io import read_config

    path = Path(path).expanduser()
    cfg = read_config(path)
    kind = layout(cfg, path)
    if kind is None:
        return weights
    from specpress.models.drafter_io import active_quantize_step
    from specpress.models.formats import compressed_tensors as ct
    from specpress.models.formats import modelopt as mo
    from specpress.models.formats import speculators as sp

    mtype = cfg.get("speculators_model_type")
    mine = active_quantize_step((cfg.get("specpress") or {}).get("steps"))
    qkind, qcfg, _ = _quant(cfg, path, mine)
    if qcfg is None:
        names: list[str] = []
    elif mine is not None:
        form = sp.FORMS.get(mtype)
        names = [form.rename_out(n) if form else n for n in mine.get("quantized") or ()]
    else:
        names = _stored_names(path, qkind)
    enc = config = None
    if qcfg is not None and mine is not None:
        from specpress.models.formats.encodings import encoding
        from specpress.models.quantized.scheme import config_from_dict

        config = config_from_dict(qcfg)
        enc = encoding(qkind if qkind == "compressed-tensors" else "modelopt", config)
    out: dict[str, Tensor] = {}
    for name in names:
        stored = {k[len(name) + 1:]: v for k, v in weights.items() if k.startswith(name + ".") and k != name + ".bias"}
        where = f"{path}: {name}"
        if enc is not None:
            mine_t = enc.decode(stored, config, _linear_shape(stored, where), where)
        elif qkind == "compressed-tensors":
            mine_t = ct.decompress_module(stored, qcfg, _shape(stored, qcfg, where), where)
        else:
            mine_t = mo.decompress_module(stored, _shape(stored, qcfg, where), where)
        out.update({f"{name}.{s}": t for s, t in mine_t.items()})
    prefixes = tuple(n + "." for n in names)
    out.update({k: v for k, v in weights.items() if not k.startswith(prefixes) or k.endswith(".bias")})
    return sp.to_public_weights(mtype, out) if mtype else out


def _linear_shape(stored: Mapping[str, Tensor], where: str) -> tuple[int, int]:
    """(out_features, in_features) of a Linear from its encoded tensors: weight_shape, or the weight's rows and
    the columns its packing implies (uint8 codes two per byte; W4A16_AWQ's two output rows per byte)."""
    if "weight_shape" in stored:
        n, k = (int(v) for v in stored["weight_shape"].tolist())
        return n, k
    for key in ("weight", "weight_packed"):
        w = stored.get(key)
        if w is not None and w.dim() == 2:
            n, k = int(w.shape[0]), int(w.shape[1])
            if w.dtype.is_floating_point or w.dtype == torch.int8:
                return n, k
            s = stored.get("weight_scale")
            if s is not None and s.dim() == 2 and s.shape[0] == 2 * n:  # W4A16_AWQ: [N/2, K]
                return 2 * n, k
            return n, 2 * k  # e2m1 / int4 codes, two per byte along the input
    raise CheckpointError(f"{where}: cannot tell the Linear's shape (no weight_shape or 2-D weight stored)")


def _check_recorded(cfg: Mapping[str, Any], path: Path, kind: str, mine: Mapping[str, Any]) -> None:
    """The format's own description of the quantization equals what the recorded scheme's encoding writes."""
    from specpress.models.formats.encodings import encoding
    from specpress.models.quantized.scheme import config_from_dict

    config = config_from_dict(mine.get("config") or {})
    fmt = "compressed-tensors" if kind == "compressed-tensors" else "modelopt"
    try:
        spec = encoding(fmt, config).spec(config)
    except ConfigError as exc:
        raise CheckpointError(f"{path}: the specpress block records a {mine.get('scheme')} quantization that "
                              f"{fmt} cannot hold ({exc}); the file was edited: re-export it") from None
    if fmt == "compressed-tensors":
        groups = (cfg.get("quantization_config") or {}).get("config_groups") or {}
        g = next(iter(groups.values()), {}) if len(groups) == 1 else {}
        got = {k: g.get(k) for k in spec}
    else:
        q = _hf_quant_config(path).get("quantization") or {}
        got = {k: q.get(k) for k in spec}
    if got != spec:
        raise CheckpointError(f"{path}: the specpress block records {mine.get('scheme')} ({mine.get('method')}) but "
                              f"the {fmt} config holds {got}, not {spec}; the file was edited: re-export it")


def rename_index(path: Path | str, index: dict[str, Any]) -> dict[str, Any]:
    """A tensor index (name -> stored dtype/shape/bytes) under specpress's module names: speculators'
    keys renamed; sizes stay as stored (what the checkpoint costs)."""
    from specpress.models.formats.speculators import rename_in
    from specpress.models.io import read_config

    mtype = read_config(path).get("speculators_model_type")
    return {rename_in(mtype, k): v for k, v in index.items()} if mtype else index


def _shape(stored: Mapping[str, Tensor], qcfg: Mapping[str, Any], where: str) -> tuple[int, int]:
    if "weight_shape" in stored:
        n, k = (int(v) for v in stored["weight_shape"].tolist())
        return n, k
    w = stored.get("weight")
    if w is None or w.dim() != 2:
        raise CheckpointError(f"{where}: cannot tell the Linear's shape (no weight_shape or 2-D weight stored)")
    return int(w.shape[0]), int(w.shape[1])


def check_verifier(cfg: Mapping[str, Any], target_architecture: str, source: str) -> None:
    """A speculators drafter names its verifier's architectures: the target it is loaded with must be one."""
    archs = list(((cfg.get("specpress") or {}).get("verifier") or {}).get("architectures") or [])
    if archs and target_architecture not in archs:
        name = (cfg.get("specpress") or {}).get("verifier", {}).get("name_or_path")
        raise CheckpointError(f"{source}: this drafter was made for verifier {name!r} ({', '.join(archs)}), but the "
                              f"target given is a {target_architecture}; pass --target the verifier it names")
