"""Shared by the real-scale tests: a random target of a chosen shape written straight to safetensors (one
tensor at a time, nothing held whole), and a child process's peak RSS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch


def write_target(out: Path, *, hidden: int, layers: int, ffn: int, vocab: int, heads: int = 8, kv_heads: int = 2,
                 dtype: torch.dtype = torch.bfloat16, tie: bool = False, seed: int = 0) -> int:
    """A random Llama target in `dtype` at `out` (config.json + model.safetensors); returns its parameters."""
    from safetensors.torch import save_file

    from specpress.models.target import TargetConfig, TargetModel

    cfg = TargetConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                       tie_word_embeddings=tie, eos_token_id=0)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in TargetModel(cfg).state_dict().items()}
    if tie:
        shapes.pop("lm_head.weight")
    g = torch.Generator().manual_seed(seed)
    weights = {k: (torch.ones(s) if k.endswith("norm.weight") else torch.randn(s, generator=g) * 0.02).to(dtype)
               for k, s in shapes.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf = cfg.to_hf()
    hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(hf))
    return sum(t.numel() for t in weights.values())


PEAK = """
import json as _json
for _line in open("/proc/self/status"):
    if _line.startswith("VmHWM:"):
        result["peak_rss"] = int(_line.split()[1]) * 1024
print(_json.dumps(result))
"""


def run_peak(code: str, env: dict[str, str] | None = None) -> dict:
    """Run Python `code` in a fresh process (this checkout on its path); it leaves a dict in `result`.
    Returns it with "peak_rss": the process's resident high-water mark (VmHWM, bytes), which exec resets
    (wait4's ru_maxrss does not: a child starts from its parent's)."""
    root = str(Path(__file__).resolve().parents[1])
    e = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1",
         **(env or {})}
    p = subprocess.run([sys.executable, "-c", code + PEAK], env=e, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])
