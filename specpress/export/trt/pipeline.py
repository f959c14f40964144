"""The CLI's path for `specpress export trt`: an `export onnx` directory (or the one-node probe) -> engines in OUT.

    manifest = engines_from_onnx("onnx/eagle3-plugin", "engines/eagle3", max_tree=32)
    manifest = engines_from_onnx(None, "/tmp/trt-probe", probe=True)  # does the installed TensorRT work?

`engines_from_onnx` refuses giving both or neither of onnx_dir and probe, claims `out`, writes the probe graph
into a scratch directory when asked, reads the export's manifest for the sizes the engines must cover (the
keywords override them), and builds one engine per graph (builder.build_engines), saying each step on `echo`.
It returns the manifest written in `out`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# keys an `export onnx` manifest may carry for the sizes the engines must cover (first found wins)
TREE_KEYS = ("max_tree", "tree_budget", "max_new_tokens_per_call", "block_size")
CONTEXT_KEYS = ("max_context", "context_length", "max_position_embeddings")
DEFAULT_TREE, DEFAULT_CONTEXT = 64, 2048


def from_manifest(manifest: dict[str, Any] | None, keys: tuple[str, ...]) -> int | None:
    """The first integer under one of `keys`, in the manifest, its budget or its config; None when none."""
    if not manifest:
        return None
    for scope in (manifest, manifest.get("budget") or {}, manifest.get("config") or {}):
        for key in keys:
            if isinstance(scope, dict) and isinstance(scope.get(key), int):
                return int(scope[key])
    return None


def parse_axes(values: Iterable[str]) -> tuple[tuple[str, Any], ...]:
    """--axis NAME=MIN:OPT:MAX values -> (name, AxisRange) pairs; UsageError for one without NAME=."""
    from specpress.errors import UsageError
    from specpress.export.trt.profiles import AxisRange

    out = []
    for v in values:
        name, sep, rng = v.partition("=")
        if not sep or not name:
            raise UsageError(f"--axis takes NAME=MIN:OPT:MAX, got {v!r}")
        out.append((name, AxisRange.parse(rng)))
    return tuple(out)


def engines_from_onnx(onnx_dir: str | Path | None, out: str | Path, *, probe: bool = False, target_gpu: str = "",
                      max_tree: int | None = None, max_context: int | None = None, axes: Iterable[str] = (),
                      flavour: str = "auto", force: bool = False, verbose: bool = False,
                      echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Build TensorRT engines for `onnx_dir` (or the probe graph) into `out`; the manifest written there.

    target_gpu: TensorRT for RTX compute capabilities, comma-separated; max_tree / max_context: the budget
    (default: the export manifest's, else 64 / 2048); axes: NAME=MIN:OPT:MAX overrides; flavour: auto,
    tensorrt or tensorrt_rtx; force: replace `out`; verbose: TensorRT's info messages on `echo`.
    """
    from specpress.artifacts import claim_output, scratch_dir
    from specpress.errors import RequestError, UsageError
    from specpress.export.trt.builder import (
        BuildOptions,
        build_engines,
        read_source_manifest,
    )
    from specpress.export.trt.profiles import Budget

    if (onnx_dir is None) == (not probe):
        raise UsageError("give exactly one of --onnx DIR (an `export onnx` output) or --probe")
    src = None if onnx_dir is None else Path(onnx_dir)
    out = Path(out)
    with claim_output(out, force=force, inputs={"--onnx": src}, writes="specpress-tensorrt-engines"), scratch_dir("specpress-trt-probe-") as scratch:
        if probe:
            from specpress.export.trt.probe import save_probe

            src = Path(scratch)
            save_probe(src / "tree_attention_probe.onnx")
        assert src is not None
        if not src.is_dir():
            raise RequestError(f"--onnx {src} is not a directory; expected an `export onnx` output")
        manifest = read_source_manifest(src)
        tree = max_tree or from_manifest(manifest, TREE_KEYS) or DEFAULT_TREE
        context = max_context or from_manifest(manifest, CONTEXT_KEYS) or DEFAULT_CONTEXT
        options = BuildOptions(budget=Budget(max_tree=tree, max_context=max(context, tree)), axes=parse_axes(axes),
                               targets=tuple(t.strip() for t in target_gpu.split(",") if t.strip()),
                               flavour=None if flavour == "auto" else flavour)
        return build_engines(src, out, options, echo=echo, force=force, verbose=verbose)
