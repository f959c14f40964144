"""README's smoke path, run as written: the bash block under "**Smoke path**" with `.venv/bin/specpress`
replaced by this interpreter's specpress script, in a temporary directory. Each command must succeed, and the
bench it ends with must be lossless and report a drafter that accepts something (tau > 1) and the int4 copy's
paired delta."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def smoke_block() -> str:
    text = README.read_text()
    start = text.index("**Smoke path**")
    match = re.search(r"```bash\n(.*?)```", text[start:], re.DOTALL)
    assert match, "README's smoke path has no bash block"
    return match.group(1)


def test_the_smoke_block_uses_only_the_installed_script():
    """Every command of the block is `$S ...` after its first line, so the slow test runs exactly it."""
    lines = [ln for ln in smoke_block().splitlines() if ln.strip()]
    assert lines[0].startswith("S=.venv/bin/specpress ")
    assert all(ln.startswith("$S ") for ln in lines[1:]), lines


@pytest.mark.slow  # ~3.5 min on 2 cores; .ci/run runs it
def test_readme_smoke_path_runs(tmp_path):
    script = Path(sys.executable).parent / "specpress"
    block = smoke_block().replace(".venv/bin/specpress", str(script), 1)
    env = {**os.environ, "SPECPRESS_CACHE": str(tmp_path / "cache")}
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", block], check=False, cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr[-4000:]
    result = json.loads((tmp_path / "runs" / "smoke" / "bench.json").read_text())
    assert result["lossless_mismatches"] == 0
    assert result["tau"] > 1.0
    compare = result["compare"]
    assert compare["lossless_mismatches"] == 0
    assert "delta_tau" in compare["paired"]
