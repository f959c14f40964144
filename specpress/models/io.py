"""Read and write HF-format model directories (config.json + safetensors), safely.

Loading never executes code: safetensors, or `torch.load(weights_only=True)` for legacy `.bin`.

safetensors files are memory-mapped, never read whole: a tensor wanted in the dtype it is stored in is a
view of the file's pages (a private, copy-on-write mapping: nothing is read until used, and an 8B target
in bf16 costs its 16 GB once, as file pages the kernel may drop and re-read); one wanted in another float
dtype is read and converted one tensor at a time, so the stored and the converted weights never both
exist whole.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from specpress.errors import CheckpointError

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
MAX_HEADER_BYTES = 100_000_000  # safetensors' own bound on a header
ST_DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "F8_E4M3": torch.float8_e4m3fn,
             "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu, "I16": torch.int16, "U16": torch.uint16,
             "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "U32": torch.uint32,
             "F32": torch.float32, "I64": torch.int64, "U64": torch.uint64, "F64": torch.float64}
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


def read_weights(path: Path | str, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """All tensors of a model dir: model.safetensors, a sharded index, or a legacy .bin.

    dtype: what floating-point tensors become (None: as stored). safetensors are memory-mapped (module
    docstring); a tensor already in `dtype` is not copied, any other float is converted as it is read.
    """
    path = Path(path).expanduser()
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.is_file():
        return _load_safetensors(single, dtype)
    if index.is_file():
        out: dict[str, Tensor] = {}
        for shard in _shards(index):
            out.update(_load_safetensors(path / shard, dtype))
        return out
    for legacy in ("pytorch_model.bin", "model.pt"):
        f = path / legacy
        if f.is_file():
            from specpress.readback import load_torch

            sd = load_torch(f, "convert it to model.safetensors where it came from, or re-download it", "weight file",
                            mmap=True)
            if not isinstance(sd, Mapping) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                                      for k, v in sd.items()):
                raise CheckpointError(f"{f} holds a {type(sd).__name__}, not a state dict of named tensors; give "
                                      f"the model's weights")
            return {k: _as(v, dtype) for k, v in sd.items()}
    raise CheckpointError(f"{path} holds no weights (model.safetensors, model.safetensors.index.json "
                          f"or pytorch_model.bin)")


def _as(t: Tensor, dtype: torch.dtype | None) -> Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() and t.dtype != dtype else t


@dataclass(frozen=True)
class TensorInfo:
    """One stored tensor, as its file describes it (no data read)."""

    dtype: str  # safetensors dtype name: F32, BF16, I64, BOOL, …
    shape: tuple[int, ...]
    nbytes: int
    offset: int = 0  # of its first byte in the file (safetensors; 0 for a legacy .bin)


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


def stored_float_dtype(path: Path | str) -> torch.dtype:
    """The float dtype holding most of a model dir's weight bytes, from the file headers (fp32 when none)."""
    by: dict[str, int] = {}
    for info in tensor_index(path).values():
        if info.dtype in ("F32", "F16", "BF16", "F64", "float32", "float16", "bfloat16", "float64"):
            by[info.dtype] = by.get(info.dtype, 0) + info.nbytes
    if not by:
        return torch.float32
    name = max(by, key=by.__getitem__)
    return ST_DTYPES.get(name) or getattr(torch, name)


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
        out[name] = _tensor_info(name, v, data_bytes, bad, 8 + n)
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _tensor_info(name: str, v: Any, data_bytes: int, bad: Any, start: int = 0) -> TensorInfo:
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
    return TensorInfo(dtype, tuple(shape), end - begin, start + begin)


def _load_safetensors(f: Path, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """Every tensor of one file: views of a private memory map where no conversion is needed, the rest read
    (pread) and converted one at a time. The map lives as long as a tensor viewing it."""
    header = read_header(f)
    for name, info in header.items():
        if info.dtype not in ST_DTYPES:
            raise CheckpointError(f"{f} is not a readable safetensors file: tensor {name!r} has dtype "
                                  f"{info.dtype!r}, not one of {', '.join(ST_DTYPES)}; re-download or rebuild it")
    out: dict[str, Tensor] = {}
    try:
        with f.open("rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) if f.stat().st_size else None
            for name, info in header.items():
                out[name] = _tensor(fh, mm, info, dtype)
    except (OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{f} is not a readable safetensors file ({exc}); re-download or rebuild it") from None
    return out


def _tensor(fh: Any, mm: mmap.mmap | None, info: TensorInfo, dtype: torch.dtype | None) -> Tensor:
    stored = ST_DTYPES[info.dtype]
    n = math.prod(info.shape)
    if n == 0 or mm is None:
        return torch.empty(info.shape, dtype=_target_dtype(stored, dtype))
    want = _target_dtype(stored, dtype)
    if want == stored and info.offset % stored.itemsize == 0:
        return torch.frombuffer(mm, dtype=stored, count=n, offset=info.offset).view(info.shape)
    buf = bytearray(info.nbytes)
    fh.seek(info.offset)
    if fh.readinto(buf) != info.nbytes:
        raise ValueError(f"short read at byte {info.offset}")
    return torch.frombuffer(buf, dtype=stored, count=n).view(info.shape).to(want)


def _target_dtype(stored: torch.dtype, dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and stored.is_floating_point and stored.itemsize > 1 else stored


def stored_rows(path: Path | str, name: str, rows: int = 4096) -> Any:
    """Yield tensor `name` of a model dir as stored, `rows` rows at a time (read from the file, never mapped
    whole): for digests of large tensors without holding a second copy."""
    for f in weight_files(path):
        if f.suffix != ".safetensors":
            yield read_weights(path)[name]
            return
        info = read_header(f).get(name)
        if info is None:
            continue
        stored = ST_DTYPES[info.dtype]
        row_bytes = info.nbytes // max(1, info.shape[0]) if info.shape else info.nbytes
        with f.open("rb") as fh:
            for r0 in range(0, max(1, info.shape[0] if info.shape else 1), rows):
                r1 = min(r0 + rows, info.shape[0]) if info.shape else 1
                buf = bytearray((r1 - r0) * row_bytes)
                fh.seek(info.offset + r0 * row_bytes)
                fh.readinto(buf)
                yield torch.frombuffer(buf, dtype=stored).view((r1 - r0, *info.shape[1:]) if info.shape else ())
        return
    raise CheckpointError(f"{path}: no tensor {name!r}")


FINITE_CHUNK = 1 << 24  # elements per isfinite check: a bounded temporary, whatever the tensor's size


def check_finite(weights: Mapping[str, Tensor], source: Path | str) -> None:
    for name, t in weights.items():
        if not t.is_floating_point():
            continue
        flat = t.reshape(-1)
        for i in range(0, flat.numel(), FINITE_CHUNK):
            if not torch.isfinite(flat[i:i + FINITE_CHUNK].abs().amax()):  # amax propagates NaN; 3x isfinite's speed
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
    """safetensors with shared storage broken apart (tied weights are saved once by the caller); save_file
    writes from the tensors' own memory (no serialized copy: measured, safetensors 0.8)."""
    from specpress.artifacts import make_readable

    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(f),
              metadata=dict(metadata or {"format": "pt"}))
    make_readable(Path(f))  # safetensors creates owner-only (0600) files
