"""The TensorRT modules type-check (mypy) against `tensorrt-stubs`, so a misspelt API or a wrong signature
fails here although standard TensorRT cannot be installed. TRT_STUBS_DIR names a directory holding the stubs
(`pip install --no-deps --target DIR tensorrt-stubs`; never into the venv: its `tensorrt/__init__.pyi` makes
`import tensorrt` succeed as an empty namespace package). CI sets it; elsewhere the test skips.

tensorrt-stubs 10.13 does not parse as published: IPluginV3 methods name a parameter `in` (a keyword) and
`add_scale_nd` puts a parameter without a default after defaulted ones. `_fix_stubs` repairs exactly those
two things in a copy; the stubs' own remaining complaints are silenced, ours are not.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ["specpress/export/trt", "specpress/runtime/backends/tensorrt", "specpress/commands/export_trt.py"]
# only the TensorRT stubs are followed (torch & co. would cost minutes and check nothing of ours)
CONFIG = """[mypy]
ignore_missing_imports = True
follow_imports = skip
[mypy-tensorrt,tensorrt.*,tensorrt_bindings,tensorrt_bindings.*]
follow_imports = silent
ignore_errors = True
"""


def _split(params: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in params:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur] if cur.strip() else out


def _fix_line(line: str) -> str:
    m = re.match(r"^(\s*def \w+\()(.*)(\)\s*->.*)$", line)
    if not m:
        return line
    fixed, seen_default = [], False
    for p in _split(m.group(2)):
        p = re.sub(r"^(\s*)in:", r"\1in_:", p)
        seen_default |= "=" in p
        if seen_default and "=" not in p and not p.strip().startswith("*"):
            p += " = ..."
        fixed.append(p)
    return m.group(1) + ",".join(fixed) + m.group(3)


def _fix_stubs(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for pyi in dst.rglob("*.pyi"):
        pyi.write_text("\n".join(_fix_line(line) for line in pyi.read_text().splitlines()) + "\n")
    return dst


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory):
    pytest.importorskip("mypy", reason="mypy is not installed (pip install mypy)")
    stubs = os.environ.get("TRT_STUBS_DIR")
    if not stubs or not (Path(stubs) / "tensorrt" / "__init__.pyi").is_file():
        pytest.skip("TRT_STUBS_DIR does not name a `pip install --no-deps --target DIR tensorrt-stubs` directory")
    tmp = tmp_path_factory.mktemp("mypy")
    fixed = _fix_stubs(Path(stubs), tmp / "stubs")
    (tmp / "mypy.ini").write_text(CONFIG)

    def run(paths: list[str]) -> subprocess.CompletedProcess:
        env = {**os.environ, "MYPYPATH": str(fixed)}
        return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp / "mypy.ini"),
                               "--cache-dir", str(tmp / "cache"), *paths], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)

    return run


def test_tensorrt_modules_type_check(mypy_run):
    res = mypy_run(CHECKED)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_a_misspelt_tensorrt_call_fails(mypy_run, tmp_path):
    """The check can fail: the builder with one TensorRT method misspelt does not pass."""
    src = (ROOT / "specpress/export/trt/builder.py").read_text()
    assert "builder.build_serialized_network(" in src
    bad = tmp_path / "bad_builder.py"
    bad.write_text(src.replace("builder.build_serialized_network(", "builder.build_serialised_network("))
    res = mypy_run([str(bad)])
    assert res.returncode == 1 and "build_serialised_network" in res.stdout, res.stdout[-2000:]
