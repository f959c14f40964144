"""GGUF targets: a llama.cpp `.gguf` file converted once into the HF directory every command reads.

The file is read by maintained code, never parsed here: `gguf` (llama.cpp's own Python reader) for the header,
so an unsupported architecture or tensor type is refused by name before any work, and transformers' GGUF loader
for the weights (it dequantizes every block type gguf-py knows and undoes llama.cpp's Q/K row permutation) and
for the tokenizer (tokenizer.json and the chat template). The directory is keyed by the file's sha256 under
`$SPECPRESS_CACHE/gguf/`, so a second `--target model.gguf` costs one hash of the file.

    info = read_gguf_info(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))   # header only: architecture, tensor types
    target_dir = convert_gguf(info.path)                              # cached HF directory (config, safetensors, …)

What is written says where it came from: `zoo.json` (format specpress-zoo, source gguf) and the README card record
the file's sha256 and that the weights are the GGUF's blocks dequantized to fp32, not the original checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import platform
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specpress.artifacts import atomic_dir, claim_output, write_file, write_json
from specpress.errors import CheckpointError, RequestError
from specpress.readback import read_json

GGUF_MAGIC = b"GGUF"
# general.architecture -> the HF architecture the target code runs (models/target.py ARCHITECTURES)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
# Tensor types transformers' loader dequantizes (through gguf-py's numpy kernels, gguf 0.19 quants.py).
TENSOR_TYPES = frozenset({"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K",
                          "Q5_K", "Q6_K"})
INSTALL = "pip install gguf 'transformers>=4.45'  (or: pip install -e '.[gguf]')"
_MAX_CHAT_TEMPLATE = 1 << 16  # a chat template is a few KB; a larger one is refused (rendering cost is unbounded)


@dataclass(frozen=True)
class GGUFInfo:
    """What the header of a GGUF file says, read without touching the tensor data."""

    path: Path
    sha256: str
    architecture: str            # general.architecture ("llama", ...)
    name: str                    # general.name ("" when absent)
    tensor_types: dict[str, int] = field(default_factory=dict)   # type name -> number of tensors
    n_tensors: int = 0

    @property
    def weights_note(self) -> str:
        """How the weights were stored: 'Q4_1 (210 tensors), Q8_0 (1), F32 (61)'."""
        return ", ".join(f"{t} ({n} tensor{'s' if n > 1 else ''})" for t, n in
                         sorted(self.tensor_types.items(), key=lambda kv: -kv[1]))


def is_gguf_path(value: str | Path) -> bool:
    return str(value).lower().endswith(".gguf")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise RequestError(f"reading a .gguf target needs the gguf package: {INSTALL}") from None
    return gguf


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception as exc:  # gguf-py raises plain errors for a field whose bytes do not decode
        raise CheckpointError(f"{reader.path}: metadata field {key!r} cannot be read ({exc})") from None


def read_gguf_info(path: Path, *, digest: bool = True) -> GGUFInfo:
    """The header of `path`: its architecture and tensor types, each checked; a bad file is a CheckpointError
    naming the file and what is wrong with it (no traceback from the reader)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise RequestError(f"{path}: no such GGUF file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise CheckpointError(f"{path}: not a GGUF file (it starts with {magic!r}, a GGUF file with {GGUF_MAGIC!r})")
    gguf = _import_gguf()
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except (ValueError, IndexError, KeyError, OverflowError, TypeError, OSError, MemoryError) as exc:
        raise CheckpointError(f"{path}: the GGUF file cannot be read ({type(exc).__name__}: {exc}); it may be "
                              f"truncated or damaged: download or convert it again") from None
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise CheckpointError(f"{path}: no general.architecture in the GGUF metadata")
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} is not supported; supported: "
                              f"{', '.join(ARCHITECTURES)}")
    types = Counter(t.tensor_type.name for t in reader.tensors)
    bad = sorted(set(types) - TENSOR_TYPES)
    if bad:
        raise CheckpointError(f"{path}: tensor type(s) {', '.join(bad)} cannot be dequantized here; supported: "
                              f"{', '.join(sorted(TENSOR_TYPES))}")
    if not reader.tensors:
        raise CheckpointError(f"{path}: the GGUF file holds no tensors")
    template = _field(reader, "tokenizer.chat_template")
    if isinstance(template, str) and len(template) > _MAX_CHAT_TEMPLATE:
        raise CheckpointError(f"{path}: its chat template is {len(template):,} characters (at most "
                              f"{_MAX_CHAT_TEMPLATE:,} are accepted)")
    _check_shapes(path, reader, arch)
    name = _field(reader, "general.name")
    return GGUFInfo(path=path, sha256=file_sha256(path) if digest else "", architecture=arch,
                    name=name if isinstance(name, str) else "", tensor_types=dict(types),
                    n_tensors=len(reader.tensors))


def _check_shapes(path: Path, reader: Any, arch: str) -> None:
    """The metadata's sizes against the tensors' own shapes (a file whose header lies is refused by name)."""
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}  # GGUF order: fastest dimension first
    hidden, layers = _field(reader, f"{arch}.embedding_length"), _field(reader, f"{arch}.block_count")
    emb = shapes.get("token_embd.weight")
    if emb is None:
        raise CheckpointError(f"{path}: no token_embd.weight tensor (the token embedding)")
    if not isinstance(hidden, int) or emb[0] != hidden:
        raise CheckpointError(f"{path}: {arch}.embedding_length says {hidden!r} but token_embd.weight is "
                              f"{emb[::-1]} (vocabulary x hidden): the metadata does not describe these tensors")
    blocks = {int(n.split(".")[1]) for n in shapes if n.startswith("blk.") and n.split(".")[1].isdigit()}
    if not isinstance(layers, int) or blocks != set(range(layers)):
        raise CheckpointError(f"{path}: {arch}.block_count says {layers!r} but the file holds tensors of "
                              f"{len(blocks)} blocks: the metadata does not describe these tensors")


def gguf_cache_dir(info: GGUFInfo) -> Path:
    cache = os.environ.get("SPECPRESS_CACHE")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache" / "specpress"
    return base / "gguf" / info.sha256[:16]


def converted_from(out: Path) -> dict[str, Any] | None:
    """The `source` block of a converted directory's zoo.json (None when `out` is no finished conversion)."""
    f = Path(out) / "zoo.json"
    if not (f.is_file() and (out / "model.safetensors").is_file() and (out / "config.json").is_file()):
        return None
    try:
        meta = read_json(f)
    except CheckpointError:
        return None
    src = meta.get("source") if isinstance(meta, dict) else None
    return src if isinstance(src, dict) and src.get("kind") == "gguf" else None


def convert_gguf(path: Path, out: Path | None = None, *, force: bool = False, card: str | None = None,
                 say: Callable[[str], None] = print, info: GGUFInfo | None = None) -> Path:
    """The HF directory of GGUF file `path` (default: the cache entry of its sha256), converted now if missing.

    card: the model card's opening paragraph (the zoo entry's); the rest (source file, digest, storage types)
    is written for every conversion.
    """
    info = info or read_gguf_info(path)
    out = Path(out).expanduser().absolute() if out is not None else gguf_cache_dir(info)
    src = converted_from(out)
    if src is not None and src.get("sha256") == info.sha256 and not force:
        return out
    with claim_output(out, force=True if out == gguf_cache_dir(info) else force, writes="specpress-zoo",
                      inputs={"the GGUF file": info.path}):
        say(f"converting {info.path.name} ({info.architecture}; {info.weights_note}) to an HF directory at {out} "
            f"(once; cached by the file's sha256)")
        _convert(info, out, card)
    return out


def _convert(info: GGUFInfo, out: Path, card: str | None) -> None:
    import torch  # heavy: only when a conversion runs

    from specpress.models.io import save_weights  # imports torch

    try:
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise RequestError(f"converting a .gguf target needs transformers: {INSTALL}") from None
    folder, name = str(info.path.parent), info.path.name
    transformers.utils.logging.set_verbosity_error()  # its per-tensor bars and notes; our line says what runs
    transformers.utils.logging.disable_progress_bar()
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, RuntimeError, NotImplementedError, OSError, IndexError) as exc:
        raise CheckpointError(f"{info.path}: transformers {transformers.__version__} could not load the GGUF file "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]})") from None
    cfg = model.config.to_dict()
    for k in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "dtype",
              "torch_dtype"):
        cfg.pop(k, None)
    cfg["architectures"] = [ARCHITECTURES[info.architecture]]
    cfg["torch_dtype"] = "float32"
    sd = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        sd.pop("lm_head.weight", None)
    del model
    source = {"kind": "gguf", "file": info.path.name, "sha256": info.sha256, "architecture": info.architecture,
              "name": info.name, "tensor_types": info.tensor_types, "stored_as": "fp32",
              "dequantized_by": f"transformers {transformers.__version__} (gguf {_gguf_version()})"}
    with atomic_dir(out, force=True) as tmp:
        write_json(tmp / "config.json", cfg)
        save_weights(sd, tmp / "model.safetensors")
        tok.save_pretrained(str(tmp))
        if not (tmp / "tokenizer.json").is_file():
            raise CheckpointError(f"{info.path}: transformers wrote no tokenizer.json for its tokenizer")
        write_json(tmp / "zoo.json", {"format": "specpress-zoo", "version": 1, "source": source,
                                      "environment": {"python": platform.python_version(),
                                                      "torch": torch.__version__}})
        write_file(tmp / "README.md", _card(info, cfg, card))


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "?"


def _card(info: GGUFInfo, cfg: dict[str, Any], intro: str | None) -> str:
    params = (cfg.get("hidden_size"), cfg.get("num_hidden_layers"), cfg.get("num_attention_heads"),
              cfg.get("num_key_value_heads"), cfg.get("vocab_size"))
    lines = [f"# {info.name or info.path.stem}", ""]
    if intro:
        lines += [intro, ""]
    lines += [
        f"Converted by specpress from the GGUF file `{info.path.name}` (sha256 `{info.sha256}`).",
        "",
        f"**The weights are the GGUF's blocks dequantized to fp32, not the original checkpoint**: stored as "
        f"{info.weights_note}. Numbers measured on this target are measured on that dequantized model.",
        "",
        "hidden {}, {} layers, {} query / {} KV heads, vocabulary {}. Tokenizer and chat template as the GGUF "
        "metadata gives them (tokenizer.json, chat_template.jinja).".format(*params),
        "",
        "`zoo.json` holds the same facts in JSON.",
        "",
    ]
    return "\n".join(lines)

