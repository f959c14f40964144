"""`plan`: the peak memory and the work of a command before it runs, from its inputs' config.json and
safetensors headers alone (models built on the meta device: nothing is loaded, an 8B target plans in
seconds).

    plan_command("distill", params) -> Plan      # params: the command's own parsed options (commands.py)
    plan_recipe("recipes/quickstart.yaml") -> list[Plan]      # one per sweep point (sweep.py)

A command's memory is modelled as phases (loading, a training step, calibration, validation, ...), each a
sum of named parts computed from shapes and dtypes: the target in the dtype asked for, the drafter as it
is held (floats in fp32), optimizer state, the step's activations and logits, GPTQ's Hessians, an ONNX
export's weights as onnxruntime maps them, and so on. The peak is the largest phase plus the process's
own resident memory (`base`: measured here, after importing what the command imports). `holds` is what
the command cannot do without (target + drafter + the state its method keeps): the denominator of the
"peak within 1.3x of what it must hold" goal. The work is the target's forwards and the tokens they
carry. Checked against measured peaks: tests/test_plan.py on a small model, bench/real_scale.py at the
Llama-3.2-1B shape (measured at 5c75a16: export hf, quantize and bench within 1.19x of the plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specpress.machine import DTYPE_BYTES as ES  # noqa: F401  (bytes per element of a dtype word)
from specpress.machine import kv_bytes  # noqa: F401  (the KV cache, as models/kv.py allocates it)

HEAD_BLOCK = 1 << 27  # compress/teacher.py HEAD_BLOCK_BYTES: the full logits computed at a time
SAVE_COPY = 0.0  # safetensors' save_file writes from the tensors' own memory (measured): no copy while saving
ORT_SESSIONS = 64 << 20  # onnxruntime's sessions beyond their weights: arenas, graphs, kernels (measured)


@dataclass
class Plan:
    command: str
    base: int  # this process's resident bytes after the command's imports
    phases: dict[str, dict[str, int]]  # phase -> part -> bytes held together
    holds: dict[str, int]  # what the command must hold (target + drafter + its method's state)
    work: dict[str, Any] = field(default_factory=dict)  # target forwards, target tokens, ...
    notes: list[str] = field(default_factory=list)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: sum(self.phases[p].values()))

    @property
    def peak_bytes(self) -> int:
        return self.base + sum(self.phases[self.peak_phase].values())

    @property
    def holds_bytes(self) -> int:
        return sum(self.holds.values())

    def to_dict(self) -> dict[str, Any]:
        return {"command": self.command, "peak_bytes": self.peak_bytes, "peak_phase": self.peak_phase,
                "base_bytes": self.base, "holds_bytes": self.holds_bytes, "holds": self.holds,
                "phases": self.phases, "work": self.work, "notes": self.notes}


# ---------------------------------------------------------------------------------------------- inputs


def rss() -> int:
    """This process's resident bytes now (/proc; 0 where there is none)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096
    except (OSError, ValueError, IndexError):
        return 0


def base_bytes(onnx: bool = False) -> int:
    """Resident bytes of a process that imported what a command imports (torch, specpress, tokenizers; with
    `onnx` onnxruntime and onnx too), measured in this one."""
    import specpress.compress.distill  # noqa: F401
    import specpress.models.tokenizer  # noqa: F401
    import specpress.runtime.bench  # noqa: F401

    if onnx:
        import onnx as _onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    return rss()


@dataclass(frozen=True)
class TargetFacts:
    cfg: Any  # TargetConfig
    params: int
    dtype: str  # fp32 | bf16 | fp16: as it will be held
    es: int

    @property
    def bytes(self) -> int:
        return self.params * self.es


def word(dt: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dt, "fp32")


def target_facts(path: str | Path, dtype: str) -> TargetFacts:
    """The target of `path` as `load_target(path, dtype=dtype)` holds it (dtype "auto": as stored, or the
    config's torch_dtype when the directory has no weights)."""
    from specpress.models.io import read_config, stored_float_dtype, weight_files
    from specpress.models.target import TargetConfig, TargetModel

    raw = read_config(path)
    cfg = TargetConfig.from_hf(raw, source=str(Path(path) / "config.json"))
    if dtype == "auto":
        if weight_files(path):
            dtype = word(stored_float_dtype(path))
        else:
            dtype = {"float16": "fp16", "bfloat16": "bf16"}.get(str(raw.get("torch_dtype")), "fp32")
    with torch.device("meta"):
        params = sum(p.numel() for p in TargetModel(cfg).parameters())  # a tied head counted once
    return TargetFacts(cfg, params, dtype, ES[dtype])


@dataclass(frozen=True)
class DrafterFacts:
    family: str
    model: Any  # the drafter on the meta device
    params: int  # its own parameters (shared target tensors excluded)
    held: int  # bytes as load_drafter holds it (floats in fp32, quantized codes as stored)
    stored: int  # bytes as stored
    quantized: bool = False

    @property
    def taps(self) -> int:
        """How many target taps it reads (a public EAGLE-3 config leaves them to the target: 3)."""
        from specpress.errors import RequestError

        try:
            return len(self.model.taps)
        except RequestError:
            return int(getattr(self.model.config, "num_taps", 3))


def drafter_facts(path: str | Path) -> DrafterFacts:
    from specpress.models.drafter import get_family
    from specpress.models.drafter_io import read_drafter_config
    from specpress.models.inspect import inspect_artifact

    info = inspect_artifact(path)
    family, config, _ = read_drafter_config(path)
    with torch.device("meta"):
        model = get_family(family).model_cls(config)  # type: ignore[call-arg]
    quant = info.get("quantization")
    if quant:  # quantized modules keep their stored bytes; the rest loads as fp32
        q_bytes, q_params = quant["quantized_bytes"], quant["quantized_params"]
        held = q_bytes + 4 * max(0, info["params"] - q_params)
    else:
        held = 4 * info["params"]
    return DrafterFacts(family, model, int(info["params"]), int(held), int(info["bytes"]), bool(quant))


def forward_bytes(t: TargetFacts, b: int, n: int, logits: bool, taps: int = 0) -> int:
    """One inference forward of the target over [b, n] tokens: a layer's activations (hidden, q/k/v, the
    attention scores, the MLP's three F-wide tensors), the taps kept, and the logits when asked for."""
    c = t.cfg
    act = b * n * (6 * c.hidden_size + 3 * c.intermediate_size) * t.es
    scores = 2 * b * c.num_attention_heads * n * n * 4
    kept = b * n * c.hidden_size * (taps + 1) * 4
    return act + scores + kept + (b * n * c.vocab_size * t.es if logits else 0)


def linear_widths(model: Any) -> dict[str, tuple[int, int]]:
    """name -> (in_features, out_features) of every nn.Linear of a (meta) module."""
    return {n: (m.in_features, m.out_features) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


TOKENIZE_DOC = 14  # resident bytes per byte of text after tokenizing one document and trimming the heap (4 MB ->
#                   53 MB; 450 MB untrimmed)
TOKENIZE_DOCS = 14  # ... of many documents, encoded 64 at a time


def data_bytes(data: Any) -> int:
    """What tokenizing --data leaves resident once compress/data.py's data_stream has returned (its freed
    Encodings given back): about TOKENIZE_DOC x a text file's bytes, TOKENIZE_DOCS x those of a directory,
    a .jsonl or a zoo split (measured)."""
    if data is None:
        return 0
    if str(data) in ("zoo:train", "zoo:val", "zoo-train", "zoo-val"):
        from specpress.zoo.corpus import corpus_files

        try:
            return TOKENIZE_DOCS * sum(f.size for f in corpus_files(str(data)[4:]))  # type: ignore[arg-type]
        except Exception:  # no stdlib corpus here: nothing to plan for it
            return 0
    p = Path(str(data)).expanduser()
    try:
        if p.is_dir():
            return TOKENIZE_DOCS * sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return (TOKENIZE_DOCS if p.suffix in (".jsonl", ".ndjson") else TOKENIZE_DOC) * p.stat().st_size
    except OSError:
        return 0


def plan_command(name: str, params: dict[str, Any]) -> Plan:
    from specpress.errors import UsageError
    from specpress.plan.commands import PLANNERS

    if name not in PLANNERS:
        raise UsageError(f"plan knows no command {name!r}; it plans: {', '.join(sorted(PLANNERS))}")
    return PLANNERS[name](params)


def plan_recipe(recipe: str | Path) -> list[Plan]:
    from specpress.plan.sweep import plan_sweep

    return plan_sweep(recipe)
