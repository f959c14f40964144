"""Read and write HF-format model directories (config.json + safetensors), safely.

Loading never executes code: safetensors, or `torch.load(weights_only=True)` for legacy `.bin`.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from specpress.errors import CheckpointError

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
MAX_HEADER_BYTES = 100_000_000  # safetensors' own bound on a header
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def read_config(path: Path | str) -> dict[str, Any]:
    """config.json of a model dir (or the file itself) as a dict, with clear errors."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; pass a model directory holding config.json")
    cfg_path = path / "config.json" if path.is_dir() else path
    if not cfg_path.is_file():
        raise CheckpointError(f"{path} holds no config.json; is it a Hugging Face model directory?")
    from specpress.readback import read_json_object

    cfg = read_json_object(cfg_path, "restore or regenerate it", what="config.json")
    archs, mtype = cfg.get("architectures"), cfg.get("model_type")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise CheckpointError(f"{cfg_path}: architectures must be a list of class names, found {archs!r}")
    if mtype is not None and not isinstance(mtype, str):
        raise CheckpointError(f"{cfg_path}: model_type must be a string, found {mtype!r}")
    return cfg


def read_weights(path: Path | str) -> dict[str, Tensor]:
    """All tensors of a model dir: model.safetensors, a sharded index, or a legacy .bin."""
    path = Path(path).expanduser()
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.is_file():
        return _load_safetensors(single)
    if index.is_file():
        out: dict[str, Tensor] = {}
        for shard in _shards(index):
            out.update(_load_safetensors(path / shard))
        return out
    for legacy in ("pytorch_model.bin", "model.pt"):
        f = path / legacy
        if f.is_file():
            from specpress.readback import load_torch

            sd = load_torch(f, "convert it to model.safetensors where it came from, or re-download it", "weight file")
            if not isinstance(sd, Mapping) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                                      for k, v in sd.items()):
                raise CheckpointError(f"{f} holds a {type(sd).__name__}, not a state dict of named tensors; give "
                                      f"the model's weights")
            return dict(sd)
    raise CheckpointError(f"{path} holds no weights (model.safetensors, model.safetensors.index.json "
                          f"or pytorch_model.bin)")


@dataclass(frozen=True)
class TensorInfo:
    """One stored tensor, as its file describes it (no data read)."""

    dtype: str  # safetensors dtype name: F32, BF16, I64, BOOL, …
    shape: tuple[int, ...]
    nbytes: int


def weight_files(path: Path | str) -> list[Path]:
    """The weight files of a model dir in load order ([] when it holds none)."""
    path = Path(path).expanduser()
    if not path.is_dir():
        return []
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return [path / s for s in _shards(index)]
    return [path / f for f in ("pytorch_model.bin", "model.pt") if (path / f).is_file()][:1]


def tensor_index(path: Path | str) -> dict[str, TensorInfo]:
    """Name -> dtype/shape/bytes of every stored tensor, from safetensors headers (legacy .bin: loaded)."""
    out: dict[str, TensorInfo] = {}
    for f in weight_files(path):
        if f.suffix != ".safetensors":
            for k, t in read_weights(path).items():
                out[k] = TensorInfo(str(t.dtype).removeprefix("torch."), tuple(t.shape), t.numel() * t.element_size())
            return out
        out.update(read_header(f))
    return out


def _shards(index: Path) -> list[str]:
    """The shard file names a model.safetensors.index.json names, sorted."""
    from specpress.readback import read_json

    fix = 'it must hold {"weight_map": {tensor name: shard file}}'
    try:
        weight_map = read_json(index, fix)["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (KeyError, AttributeError, TypeError) as exc:
        raise CheckpointError(f"{index} is not a valid safetensors index ({type(exc).__name__}: {exc}); it must "
                              f'hold {{"weight_map": {{tensor name: shard file}}}}') from None
    if not all(isinstance(x, str) and x and "/" not in x for x in shards):
        raise CheckpointError(f"{index}: weight_map values must be shard file names beside it")
    return shards


def read_header(f: Path) -> dict[str, TensorInfo]:
    """Every tensor a safetensors file declares, checked against the file before anything is loaded: the
    header length within the file, the header a JSON object of {dtype, shape, data_offsets} entries, each
    tensor's offsets inside the data and its size equal to shape x dtype (a truncated file fails here)."""
    if not f.is_file():
        raise CheckpointError(f"{f} is missing (named in the shard index)")

    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{f} is not a readable safetensors file: {why}; re-download or rebuild it")

    size = f.stat().st_size
    if size < 8:
        raise bad(f"{size} bytes, shorter than its 8-byte header length")
    with f.open("rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise bad(f"its header length field says {n:,} bytes, but the file holds {size - 8:,} after it")
        raw = fh.read(n)
    from specpress.readback import parse_json

    header = parse_json(raw, f"{f} (its safetensors header)", "re-download or rebuild it")
    if not isinstance(header, dict):
        raise bad(f"its header is a JSON {type(header).__name__}, not an object")
    data_bytes = size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        out[name] = _tensor_info(name, v, data_bytes, bad)
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _tensor_info(name: str, v: Any, data_bytes: int, bad: Any) -> TensorInfo:
    if not isinstance(v, dict):
        raise bad(f"tensor {name!r} is described by a JSON {type(v).__name__}, not an object")
    dtype, shape, offsets = v.get("dtype"), v.get("shape"), v.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad(f"tensor {name!r} has no dtype string")
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise bad(f"tensor {name!r}: shape must be a list of non-negative integers, found {shape!r}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets) \
            or offsets[0] > offsets[1]:
        raise bad(f"tensor {name!r}: data_offsets must be [begin, end] with begin <= end, found {offsets!r}")
    begin, end = offsets
    if end > data_bytes:
        raise bad(f"tensor {name!r} ends at byte {end:,} of the data, which holds {data_bytes:,}: the file is "
                  f"truncated")
    if dtype in DTYPE_BYTES and math.prod(shape) * DTYPE_BYTES[dtype] != end - begin:
        raise bad(f"tensor {name!r}: {dtype} {shape} needs {math.prod(shape) * DTYPE_BYTES[dtype]:,} bytes, "
                  f"its data_offsets span {end - begin:,}")
    return TensorInfo(dtype, tuple(shape), end - begin)


def _load_safetensors(f: Path) -> dict[str, Tensor]:
    read_header(f)
    try:
        return load_file(str(f))
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError) as exc:
        raise CheckpointError(f"{f} is not a readable safetensors file ({exc}); re-download or rebuild it") from None


def check_finite(weights: Mapping[str, Tensor], source: Path | str) -> None:
    for name, t in weights.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CheckpointError(f"{source}: tensor {name!r} holds NaN or inf values; the checkpoint is corrupt")


def load_into(module: nn.Module, weights: Mapping[str, Tensor], source: Path | str,
              *, optional: tuple[str, ...] = ()) -> None:
    """Copy `weights` into `module` (built on any device, meta included) after checking names and shapes.

    `optional` names keys the module has but the checkpoint may omit (tied weights).
    """
    expected = {k: v for k, v in module.state_dict().items()}
    given = {k: v for k, v in weights.items() if not k.endswith(IGNORED_SUFFIXES)}
    missing = [k for k in expected if k not in given and k not in optional]
    unexpected = [k for k in given if k not in expected]
    if missing:
        raise CheckpointError(f"{source}: missing tensor(s) {', '.join(missing[:5])}"
                              f"{' …' if len(missing) > 5 else ''} ({len(missing)} in all)")
    if unexpected:
        raise CheckpointError(f"{source}: unexpected tensor(s) {', '.join(unexpected[:5])}"
                              f"{' …' if len(unexpected) > 5 else ''}; does config.json match the weights?")
    for k, t in given.items():
        if tuple(t.shape) != tuple(expected[k].shape):
            raise CheckpointError(f"{source}: tensor {k!r} has shape {tuple(t.shape)}, "
                                  f"config.json implies {tuple(expected[k].shape)}")
    module.load_state_dict(given, strict=False, assign=True)


def save_weights(weights: Mapping[str, Tensor], f: Path, metadata: Mapping[str, str] | None = None) -> None:
    """safetensors with shared storage broken apart (tied weights are saved once by the caller)."""
    from specpress.artifacts import make_readable

    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(f),
              metadata=dict(metadata or {"format": "pt"}))
    make_readable(Path(f))  # safetensors creates owner-only (0600) files
