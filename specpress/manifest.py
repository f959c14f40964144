"""The manifest of an `export onnx` directory: what the exported graphs are and how to call them.

Written by specpress/export, read by the runtime backends (onnxruntime, TensorRT), which never import
export/. Loading is strict: an unknown key, a missing key or a newer format version is an error that
says what was expected and how to fix it.

Each graph records its `role`: the runner call it serves and the drafter cache layers it holds, so a
backend drives the graphs of any family without knowing the family. A format 1 manifest (before roles,
and before `files`, so its export could never be opened) is refused with the fix: export again.

Reading an export back goes through `open_export` / `open_target_export`, never through the loaders
alone: besides the manifest they check every file it names (`verify_files`: inside the export, present,
its size and sha256 as recorded in the manifest's `files`), so a damaged export is refused with a
CheckpointError naming the file and the fix before onnxruntime or TensorRT ever opens it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from specpress.errors import CheckpointError
from specpress.readback import check_types, read_json

MANIFEST = "manifest.json"
FORMAT = "specpress-onnx"
FORMAT_VERSION = 3  # 2: every graph records its role; 3: `files` records every file's size and sha256
# the drafter runner call a graph serves (runtime/backends/base.py): fuse_taps, feature_step, block_drafts (its
# block pass, then its Markov head's bias per position), lm_step
CALLS = ("fuse", "feature", "block", "markov", "lm")
EXPORT_FIX = "export the drafter again with `specpress export onnx --drafter DIR --target DIR --out DIR`"
TARGET_FIX = "export the target again with `specpress export target --target DIR --out DIR`"


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, element type ("float32", "float16", "int64", "int32", "bool")
    and shape (ints, or a dimension name for a dynamic axis)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]


@dataclass(frozen=True)
class GraphRole:
    """What a graph is for. `call`: the runner call it serves (CALLS). `cache_layers`: the drafter cache
    layers its past_key.{j} / present_key.{j} hold, j-th entry for j (() = no attention). A family with
    several `feature` graphs has one per draft module: draft level l runs the (l mod n)-th, in manifest order."""

    call: str
    cache_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.call not in CALLS:
            raise CheckpointError(f"graph role call {self.call!r} is not one of {', '.join(CALLS)}")


@dataclass(frozen=True)
class GraphSpec:
    """One exported graph: its file, its I/O, its own bytes (shared tensors excluded) and its role."""

    name: str
    file: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    bytes: int
    role: GraphRole
    uses_shared: bool = False

    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]


@dataclass(frozen=True)
class DrafterInfo:
    """What a runner needs to drive the graphs without the torch module."""

    taps: tuple[int, ...]  # target hidden-state taps (HF indexing) fused on every forward
    vocab_size: int  # the target's vocabulary V
    draft_vocab_size: int  # Vd (= V unless the family drafts over a reduced vocabulary)
    token_map: tuple[int, ...] | None  # [Vd] draft id -> target id; None when Vd == V and ids match
    cache_layers: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    max_positions: int
    block_size: int | None = None  # dflash
    mask_token_id: int | None = None  # dflash
    markov: bool = False  # dflash with a Markov head


@dataclass(frozen=True)
class ExportManifest:
    family: str
    opset: int
    attention: str  # "standard" | "plugin"
    dtype: str  # "fp32" | "fp16"
    quantization: Mapping[str, Any] | None  # {"scheme", "format", "linears": {name: what it became}} or None
    graphs: tuple[GraphSpec, ...]
    drafter: DrafterInfo
    shared_file: str | None  # the target's embeddings/head, referenced by graphs with uses_shared
    shared_bytes: int
    provenance: tuple[Mapping[str, Any], ...]  # the drafter artifact's compression steps
    target: Mapping[str, Any] | None  # fingerprint of the target the shared tensors came from
    validation: Mapping[str, Mapping[str, Mapping[str, float]]]  # graph -> output -> {max_abs, max_rel}
    specpress_version: str
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    plugin: Mapping[str, Any] = field(default_factory=dict)  # the TreeAttention contract when attention=plugin
    # the real-round check (export/rounds.py): policy, prompts, rounds, agree, near_ties, errors per graph
    validation_rounds: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # name -> {bytes, sha256} (file_records)

    def file_names(self) -> list[str]:
        """Every file of the export a backend opens: the graphs, then the shared tensors."""
        return [g.file for g in self.graphs] + ([self.shared_file] if self.shared_file else [])

    @property
    def drafter_bytes(self) -> int:
        """The drafter's own bytes: its graphs, without the target's shared embeddings/head."""
        return sum(g.bytes for g in self.graphs)

    def graphs_for(self, call: str) -> list[GraphSpec]:
        """The graphs serving runner call `call` (CALLS), in manifest order; [] when the export has none."""
        return [g for g in self.graphs if g.role.call == call]

    def graph(self, name: str) -> GraphSpec:
        for g in self.graphs:
            if g.name == name:
                return g
        raise CheckpointError(f"the {self.family} export has no graph {name!r}; it has "
                              f"{', '.join(g.name for g in self.graphs)} (re-export with `specpress export onnx`)")

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def save(self, directory: Path) -> None:
        from specpress.artifacts import write_json

        write_json(Path(directory) / MANIFEST, self.to_dict())


def _strict(cls: type, d: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(d, Mapping):
        raise CheckpointError(f"{where}: expected an object, found {type(d).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise CheckpointError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
    required = {f.name for f in fields(cls) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}  # type: ignore[misc]
    missing = sorted(required - set(d))
    if missing:
        raise CheckpointError(f"{where}: missing key(s) {', '.join(missing)}")
    check_types(cls, d, where)
    return dict(d)


def _tensor(d: Mapping[str, Any], where: str) -> TensorSpec:
    d = _strict(TensorSpec, d, where)
    return TensorSpec(str(d["name"]), str(d["dtype"]), tuple(d["shape"]))


def _role(d: Mapping[str, Any], where: str) -> GraphRole:
    layers = d.get("cache_layers", ()) if isinstance(d, Mapping) else ()
    if not isinstance(layers, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        raise CheckpointError(f"{where}: cache_layers must be a list of layer indices, found {layers!r}")
    d = _strict(GraphRole, d, where)
    try:
        return GraphRole(str(d["call"]), tuple(layers))
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {exc}") from None


def _read_json(path: Path, fix: str) -> Any:
    return read_json(path, fix, what="manifest")


def _check_format(raw: Any, source: str, fmt: str, max_version: int, fix: str) -> int:
    """`raw`'s format_version, when it is a JSON object of format `fmt`, format_version 1..`max_version`;
    else a CheckpointError."""
    version = raw.get("format_version") if isinstance(raw, Mapping) else None
    if not isinstance(raw, Mapping) or raw.get("format") != fmt or not isinstance(version, int) \
            or not 1 <= version <= max_version:
        raise CheckpointError(f"{source}: not a {fmt} manifest of format_version 1..{max_version}{fix}")
    return version


def load_manifest(directory: str | Path, fix: str = EXPORT_FIX) -> ExportManifest:
    """Read and check `directory`/manifest.json (strict; see the module docstring). `fix`: what a refusal
    tells the user to do (the default names `export onnx`; a cache names its own)."""
    path = Path(directory).expanduser() / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{path.parent} is not an ONNX export (no {MANIFEST}); create one with "
                              f"`specpress export onnx --drafter DIR --target DIR --out DIR`")
    raw = _read_json(path, fix)
    if not isinstance(raw, Mapping) or raw.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {raw.get('format') if isinstance(raw, Mapping) else None!r}, "
                              f"expected {FORMAT!r}; {fix}")
    version = raw.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise CheckpointError(f"{path}: unknown export format_version {version!r}; this specpress reads 1.."
                              f"{FORMAT_VERSION} (upgrade specpress, or re-export with this one)")
    try:
        return manifest_from_dict(raw, str(path), fix)
    except CheckpointError as exc:  # a malformed field: the strict loaders name it, this adds the fix
        raise CheckpointError(str(exc) if str(exc).endswith(fix) else f"{exc}; {fix}") from None


def manifest_from_dict(raw: Mapping[str, Any], source: str = MANIFEST, fix: str = EXPORT_FIX) -> ExportManifest:
    """An ExportManifest from its JSON object (strict, as load_manifest)."""
    path = source
    version = _check_format(raw, source, FORMAT, FORMAT_VERSION, f"; {fix}")
    if version < 2:
        again = "re-export with `specpress export onnx`" if fix == EXPORT_FIX else fix
        raise CheckpointError(f"{path}: an export of format_version {version} records no graph roles (nor the files' "
                              f"sha256); {again}")
    d = _strict(ExportManifest, raw, str(path))
    info = _strict(DrafterInfo, d["drafter"], f"{path}: drafter")
    info["taps"] = tuple(info["taps"])
    if info["token_map"] is not None:
        info["token_map"] = tuple(info["token_map"])
    d["drafter"] = DrafterInfo(**info)
    graphs = []
    for i, gd in enumerate(d["graphs"]):
        where = f"{path}: graphs[{i}]"
        gd = _strict(GraphSpec, gd, where)
        gd["inputs"] = tuple(_tensor(t, f"{where}.inputs") for t in gd["inputs"])
        gd["outputs"] = tuple(_tensor(t, f"{where}.outputs") for t in gd["outputs"])
        gd["role"] = _role(gd["role"], f"{where}.role")
        graphs.append(GraphSpec(**gd))
    d["graphs"] = tuple(graphs)
    d["provenance"] = tuple(d["provenance"])
    return ExportManifest(**d)


# ----------------------------------------------------------------------------------------------
# `export target`: the target's forward as one graph (export/target.py writes it, the onnxruntime
# backend's OnnxTarget reads it)
# ----------------------------------------------------------------------------------------------

TARGET_MANIFEST = "target_manifest.json"
TARGET_FORMAT = "specpress-onnx-target"
TARGET_FORMAT_VERSION = 2  # 2: `files` records the graph's and the weights' size and sha256


@dataclass(frozen=True)
class TargetExportManifest:
    """One graph `file` (weights in `data_file` as ONNX external data): ids, positions, mask bool
    [tokens, total] and past_key/value.{i} per layer -> logits [1, T, V], hidden (final normed) [1, T, H],
    hidden_states.{i} (the residual entering layer i, HF's hidden_states[i]) for i < layers, and
    present_key/value.{i} [1, kv_heads, total, head_dim]. `config`: the target's HF config.json."""

    opset: int
    dtype: str  # "fp32" | "fp16"
    file: str
    data_file: str
    bytes: int  # graph + external data
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    layers: int
    kv_heads: int
    head_dim: int
    config: Mapping[str, Any]
    target: Mapping[str, Any]  # the exported target's fingerprint (models.drafter.target_fingerprint)
    validation: Mapping[str, Mapping[str, float]]  # output -> {max_abs, max_rel} on random inputs
    validation_decode: Mapping[str, Any]  # greedy decoding through onnxruntime vs torch: prompts, tokens, agree
    specpress_version: str
    format: str = TARGET_FORMAT
    format_version: int = TARGET_FORMAT_VERSION
    files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # name -> {bytes, sha256} (file_records)

    def file_names(self) -> list[str]:
        return [self.file, self.data_file]

    def save(self, directory: Path) -> None:
        from specpress.artifacts import write_json

        write_json(Path(directory) / TARGET_MANIFEST, json.loads(json.dumps(dataclasses.asdict(self))))


def load_target_manifest(directory: str | Path, fix: str = TARGET_FIX) -> TargetExportManifest:
    """Read and check `directory`/target_manifest.json (strict, as load_manifest)."""
    path = Path(directory).expanduser() / TARGET_MANIFEST
    if not path.is_file():
        hint = " (it is a drafter's export: pass it as --drafter)" if (path.parent / MANIFEST).is_file() else ""
        raise CheckpointError(f"{path.parent} is not a target export (no {TARGET_MANIFEST}){hint}; create one with "
                              f"`specpress export target --target DIR --out DIR`")
    raw = _read_json(path, fix)
    _check_format(raw, str(path), TARGET_FORMAT, TARGET_FORMAT_VERSION, f" (upgrade specpress, or {fix})")
    try:
        d = _strict(TargetExportManifest, raw, str(path))
        d["inputs"] = tuple(_tensor(t, f"{path}: inputs") for t in d["inputs"])
        d["outputs"] = tuple(_tensor(t, f"{path}: outputs") for t in d["outputs"])
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}; {fix}") from None
    return TargetExportManifest(**d)


# ----------------------------------------------------------------------------------------------
# reading an export back: every file it names is inside it and is what the manifest recorded
# ----------------------------------------------------------------------------------------------

_CHUNK = 1 << 20
_DIGESTS: dict[tuple[int, ...], str] = {}  # (dev, inode, size, mtime_ns, ctime_ns) -> sha256: hash a file once


def sha256_file(path: Path) -> str:
    """The sha256 of `path`, streamed in 1 MiB chunks (a real target's weights are gigabytes). A file whose
    stat (inode, size, times) is unchanged since it was last hashed in this process is not read again, so the
    check that reuses a cached export and the backend that then loads it hash each file once."""
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def file_records(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """{name: {bytes, sha256}} of the files `names` in `directory`: what an export's manifest records."""
    return {n: {"bytes": (Path(directory) / n).stat().st_size, "sha256": sha256_file(Path(directory) / n)}
            for n in names}


def member(directory: Path, name: Any, source: str, fix: str) -> Path:
    """`directory`/`name`, refused unless `name` is a relative path that stays inside `directory`: no absolute
    path, no `..`, no symlink out of it."""
    root = Path(directory).resolve()
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise CheckpointError(f"{source} names the file {name!r}, which is not a path inside {root}; refused "
                              f"(an export names only its own files); {fix}")
    path = root / name
    if not path.resolve().is_relative_to(root):
        raise CheckpointError(f"{path} leads out of the export (it resolves to {path.resolve()}); refused "
                              f"(an export names only its own files); {fix}")
    return path


def verify_files(directory: Path, files: Any, names: list[str], source: str, fix: str) -> None:
    """Check that every file `names` lists is recorded in `files` ({name: {bytes, sha256}}) and that every
    recorded file lies inside `directory` with that size and sha256; else a CheckpointError naming the file."""
    for name in names:
        member(directory, name, source, fix)
    if not isinstance(files, Mapping) or not files:
        raise CheckpointError(f"{source} records no sizes or sha256 of its files (it was written by an older "
                              f"specpress), so they cannot be checked; {fix}")
    unrecorded = [n for n in names if n not in files]
    if unrecorded:
        raise CheckpointError(f"{source} names {', '.join(map(repr, unrecorded))} but records no sha256 for it; {fix}")
    for name, rec in files.items():
        path = member(directory, name, source, fix)
        if not (isinstance(rec, Mapping) and isinstance(rec.get("bytes"), int) and isinstance(rec.get("sha256"), str)):
            raise CheckpointError(f"{source}: files[{name!r}] must be {{bytes, sha256}}, found {rec!r}; {fix}")
        if not path.is_file():
            raise CheckpointError(f"{path} is missing from the export (listed in {source}); {fix}")
        size = path.stat().st_size
        if size != rec["bytes"]:
            raise CheckpointError(f"{path} is {size:,} bytes, the manifest records {rec['bytes']:,} (truncated, or "
                                  f"swapped with another file); {fix}")
        if sha256_file(path) != rec["sha256"]:
            raise CheckpointError(f"{path} does not match its sha256 in the manifest (corrupt, or swapped with "
                                  f"another file); {fix}")



def open_export(directory: str | Path, fix: str = EXPORT_FIX) -> ExportManifest:
    """The manifest of the `export onnx` directory `directory`, once every file it names is checked
    (`verify_files`): what a backend or `export trt` reads before opening any graph."""
    directory = Path(directory).expanduser()
    m = load_manifest(directory, fix)
    verify_files(directory, m.files, m.file_names(), str(directory / MANIFEST), fix)
    return m


def open_target_export(directory: str | Path, fix: str = TARGET_FIX) -> TargetExportManifest:
    """As open_export, for an `export target` directory."""
    directory = Path(directory).expanduser()
    m = load_target_manifest(directory, fix)
    verify_files(directory, m.files, m.file_names(), str(directory / TARGET_MANIFEST), fix)
    return m
