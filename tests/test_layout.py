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
    """The specpress modules `path` imports, at its top or inside functions (relative imports resolved)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]  # the package `path` is in: ("specpress", ...)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            module = ".".join(m for m in (base, node.module) if m)
            found |= {module} if module != "specpress" else {f"specpress.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m == "specpress" or m.startswith("specpress.")}


def unit_of(module: str) -> str:
    """The floor unit a dotted specpress module belongs to: its top-level module or package under specpress/
    (`specpress.compress.quantize.gptq` -> compress), or __init__ for a name of specpress/__init__.py itself."""
    top = (module.split(".") + [""])[1]
    return top if (ROOT / "specpress" / top).is_dir() or (ROOT / "specpress" / f"{top}.py").is_file() else "__init__"


# The floors of specpress/, bottom first: every top-level module and package, and the units it may import (at
# its top or inside a function). DESIGN.md's layout: the bottom modules under everything; models/, the one
# home of the networks; the zoo's target on models alone; runtime/ (the decoding) on models; compress/ on
# runtime (calibration and regeneration decode) and on the zoo's corpus; export/ on runtime (its graphs are
# validated by decoding rounds; the TensorRT library and plugin live with the backend); decode/ (run and bench
# from directories) over compress/ and export/; sweep/ over all of those; plan/ over sweep (it plans recipes);
# commands/ on top (Click over the library verbs: nothing below imports it), and cli.py, which loads each
# command by name from the table in specpress/commands/__init__.py (COMMANDS), not by import.
BOTTOM = {"__init__", "errors", "readback", "artifacts", "manifest", "checkpoint", "config", "device", "machine",
          "limits", "optim", "ticker", "stats", "interrupts"}
FLOORS: dict[str, set[str]] = {
    "__init__": set(),  # specpress/__init__.py: __version__
    "errors": set(),
    "readback": {"errors"},
    "artifacts": {"errors", "readback"},
    "manifest": {"errors", "readback", "artifacts"},
    "checkpoint": {"errors", "readback", "artifacts"},  # the lr schedule and training state distill and the zoo share
    "config": {"errors"},
    "device": {"errors"},
    "machine": {"errors"},  # memory figures and load; the refusals reading a target live above models/
    "limits": {"errors", "readback", "machine"},
    "optim": set(),
    "ticker": set(),
    "stats": set(),
    "interrupts": set(),
    "models": BOTTOM,
    "zoo": BOTTOM | {"models"},  # never compress/ (it used to, for two helpers)
    "runtime": BOTTOM | {"models"},
    "compress": BOTTOM | {"models", "zoo", "runtime"},
    "export": BOTTOM | {"models", "runtime"},
    # run / bench from directories: a target compressed by compress/, a drafter exported on demand by export/
    "decode": BOTTOM | {"models", "zoo", "runtime", "compress", "export"},
    "sweep": BOTTOM | {"models", "zoo", "runtime", "compress", "export"},
    "plan": BOTTOM | {"models", "zoo", "runtime", "compress", "export", "sweep"},
    # nothing below imports commands/ (compress/quantize/request.py once took parse_spec from commands/target_quant.py)
    "commands": BOTTOM | {"models", "zoo", "runtime", "compress", "export", "decode", "sweep", "plan"},
    "cli": BOTTOM | {"commands"},  # the COMMANDS table only: commands/__init__.py imports no command
}
# Imports across the floors allowed anyway, each with its reason: (importer under specpress/, module imported) ->
# why. None today (the last eight went with decode/ and the COMMANDS table); an exception no longer needed fails
# the test, so the list only shrinks.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def test_every_module_keeps_to_its_floor():
    """Every module under specpress/ imports (at its top or inside a function) only the units its floor in FLOORS
    allows, or an import listed in EXCEPTIONS; a unit missing from FLOORS fails, and so does an exception no
    longer needed."""
    units = {p.stem for p in (ROOT / "specpress").iterdir() if p.suffix == ".py"} - {"__init__"}
    units |= {p.name for p in (ROOT / "specpress").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    units |= {"__init__"}
    assert units == set(FLOORS), f"units not in FLOORS: {sorted(units - set(FLOORS))}; " \
                                 f"in FLOORS but not under specpress/: {sorted(set(FLOORS) - units)}"
    bad, used = [], set()
    for path in SOURCES:
        rel = path.relative_to(ROOT / "specpress")
        unit = unit_of(".".join(("specpress", *rel.with_suffix("").parts)))
        for module in sorted(specpress_imports(path)):
            to = unit_of(module)
            if to == unit or to in FLOORS[unit]:
                continue
            if (rel.as_posix(), module) in EXCEPTIONS:
                used.add((rel.as_posix(), module))
                continue
            bad.append(f"specpress/{rel} ({unit}) imports {module} ({to})")
    assert not bad, bad
    assert used == set(EXCEPTIONS), f"exceptions no longer needed: {sorted(set(EXCEPTIONS) - used)}"
    assert len(SOURCES) > 100  # the scan saw the package


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
