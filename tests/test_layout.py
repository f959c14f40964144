"""Source-level rules that no behavioural test would catch: the Python floor pyproject declares, one usage-error
class in the commands, in-repo file paths named in docstrings and comments that still exist, and imports that
keep to their floor."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "specpress").rglob("*.py"))
# stdlib names newer than the floor; an import of one would pass here on a newer interpreter only
NEWER_THAN_311 = {"typing": {"override", "TypeAliasType", "ReadOnly", "TypeIs", "NoDefault"},
                  "itertools": {"batched"}, "warnings": {"deprecated"}, "types": {"get_original_bases"}}


def floor() -> tuple[int, int]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = re.fullmatch(r">=(\d+)\.(\d+)", spec.split("#")[0].strip()).groups()
    return int(major), int(minor)


def test_the_package_keeps_to_the_python_pyproject_declares():
    """pyproject says >= 3.11 (typing.Self and the tested dependency versions need it); every module parses
    with 3.11's grammar and imports no stdlib name added after it, so CI on a newer Python cannot hide one."""
    assert floor() == (3, 11) and sys.version_info[:2] >= floor()
    bad = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path), feature_version=floor())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in NEWER_THAN_311:
                bad += [f"{path}:{node.lineno} {node.module}.{a.name}" for a in node.names
                        if a.name in NEWER_THAN_311[node.module]]
            if isinstance(node, getattr(ast, "TypeAlias", ())) or getattr(node, "type_params", None):
                bad.append(f"{path}:{node.lineno} PEP 695 syntax")
    assert not bad, bad


def test_commands_raise_one_usage_error_class():
    """The commands raise specpress.errors.UsageError (printed like Click's own parse errors by cli.main, exit 2),
    never click.UsageError / click.BadOptionUsage, which would print another way."""
    bad = [f"{p}:{i}" for p in SOURCES for i, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"raise click\.(UsageError|BadOptionUsage|ClickException)\(", line)]
    assert not bad, bad


def test_in_repo_paths_named_in_sources_exist():
    """A docstring or comment naming one of the package's files (runtime/backends/base.py, export/onnx.py,
    bench/gpu_check.sh, ...) names one that exists, so a moved file does not leave stale pointers."""
    tops = {p.name for p in (ROOT / "specpress").iterdir() if p.is_dir()} | {"specpress", "bench", "tests", "recipes"}
    named = re.compile(r"(?<![\w/.])((?:" + "|".join(sorted(tops)) + r")/[\w/]*\w+\.(?:py|sh|yaml))")
    files = SOURCES + sorted((ROOT / "bench").glob("*.*")) + sorted((ROOT / "tests").rglob("*.py"))
    bad = []
    for path in files:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for name in named.findall(line):
                if not any((base / name).exists() for base in (ROOT, ROOT / "specpress")):
                    bad.append(f"{path.relative_to(ROOT)}:{i} names {name}")
    assert not bad, bad


def specpress_imports(path: Path) -> set[str]:
    """The specpress modules `path` imports, at its top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} if node.module != "specpress" else {f"specpress.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m == "specpress" or m.startswith("specpress.")}


# the bottom floor: modules every package may import, and what each of them may import from specpress
BOTTOM = {"checkpoint": {"specpress.errors", "specpress.artifacts", "specpress.readback"}}


def test_the_bottom_floor_and_the_zoo_import_nothing_above_them():
    """specpress/checkpoint.py (the lr schedule and training state distill and the zoo share) imports only the
    modules under it, and zoo/ builds its target without importing compress/ (it used to, for two helpers)."""
    bad = []
    for name, allowed in BOTTOM.items():
        path = ROOT / "specpress" / f"{name}.py"
        bad += [f"{path.relative_to(ROOT)} imports {m}" for m in sorted(specpress_imports(path) - allowed)]
    for path in sorted((ROOT / "specpress" / "zoo").rglob("*.py")):
        bad += [f"{path.relative_to(ROOT)} imports {m}" for m in sorted(specpress_imports(path))
                if m == "specpress.compress" or m.startswith("specpress.compress.")]
    assert not bad, bad


def test_only_the_cli_imports_the_commands():
    """specpress/commands/ is the top floor (Click options and output over the library verbs): nothing under
    specpress/ but the commands themselves and cli.py imports it, so the library never reaches up into the CLI
    (compress/quantize/request.py once took parse_spec from commands/target_quant.py)."""
    bad = []
    for path in SOURCES:
        rel = path.relative_to(ROOT / "specpress")
        if rel.parts[0] == "commands" or rel == Path("cli.py"):
            continue
        bad += [f"specpress/{rel} imports {m}" for m in sorted(specpress_imports(path))
                if m == "specpress.commands" or m.startswith("specpress.commands.")]
    assert not bad, bad
    assert any(path.parent.name == "commands" for path in SOURCES)  # the scan saw the commands


def test_the_quantized_lowerings_do_not_import_the_blocks():
    """export/blocks.py calls the quantized lowerings (export/quant/) for a quantized Linear; both take the Ctx of
    export/context.py, which imports neither, so quant/ never imports blocks.py back (it used to, for Ctx)."""
    export = ROOT / "specpress" / "export"
    quant = sorted((export / "quant").rglob("*.py"))
    bad = [f"{p.relative_to(ROOT)} imports {m}" for p in [*quant, export / "context.py"]
           for m in sorted(specpress_imports(p)) if m == "specpress.export.blocks"]
    bad += [f"specpress/export/context.py imports {m}" for m in sorted(specpress_imports(export / "context.py"))
            if m.startswith("specpress.export.quant")]
    assert not bad, bad
    assert len(quant) > 5  # the scan saw the lowerings
