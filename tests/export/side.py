"""The side interpreter: a separate venv holding the engines' own code that cannot share the project's env.

speculators 0.9.0 pins transformers <= 5.19 and vLLM 0.34.0 pins compressed-tensors 0.17.0 and a CUDA torch, so
they live in their own venv (CPU torch 2.13.0 first, then these with --no-deps and the runtime modules they
import; .ci/run builds it as .venv-engines and sets SPECPRESS_SPECULATORS_PYTHON). Tests that run their code
are marked `speculators` and skip, naming the variable, when it is unset; CI always sets it.

    run_side(SCRIPT, payload, tmp_path) -> dict   # SCRIPT reads sys.argv[1] (payload .pt), writes sys.argv[2]

TensorRT Edge-LLM's exporter has a venv of its own too (.ci/edgellm-venv, SPECPRESS_EDGELLM_PYTHON; tests marked
`edgellm`): run_side(SCRIPT, payload, tmp_path, env=EDGELLM_ENV).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

ENV = "SPECPRESS_SPECULATORS_PYTHON"
EDGELLM_ENV = "SPECPRESS_EDGELLM_PYTHON"
WHAT = {ENV: ("speculators / vLLM / SGLang", ".ci/engines-venv"), EDGELLM_ENV: ("TensorRT Edge-LLM 0.11.0",
                                                                              ".ci/edgellm-venv")}


def side_python(env: str = ENV) -> str | None:
    exe = os.environ.get(env)
    return exe if exe and Path(exe).is_file() else None


def need_side(env: str = ENV) -> str:
    """The side interpreter named by `env`; a skip naming the variable where there is none, a failure where CI
    requires one (SPECPRESS_REQUIRE_SIDE, set by .ci/run: these tests must run there, not skip)."""
    exe = side_python(env)
    if exe is None:
        what, builder = WHAT[env]
        why = f"no side interpreter with {what}: set {env} ({builder} DIR builds it)"
        if os.environ.get("SPECPRESS_REQUIRE_SIDE"):
            pytest.fail(why)
        pytest.skip(why)
    return exe


def run_side(script: str, payload: dict[str, Any], tmp: Path, timeout: int = 900, env: str = ENV) -> dict[str, Any]:
    """Run `script` in the side interpreter named by `env` on `payload` (saved with torch.save); return what it
    saved."""
    exe = need_side(env)
    tmp.mkdir(parents=True, exist_ok=True)
    src, dst, code = tmp / "payload.pt", tmp / "result.pt", tmp / "side_script.py"
    torch.save(payload, src)
    code.write_text(script)
    environ = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    r = subprocess.run([exe, str(code), str(src), str(dst)], capture_output=True, text=True, timeout=timeout,
                       env=environ, cwd=tmp)
    assert r.returncode == 0, f"side interpreter failed:\n{r.stdout[-2000:]}\n{r.stderr[-6000:]}"
    return torch.load(dst, weights_only=False)
