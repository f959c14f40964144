"""`specpress export trt`: TensorRT engines from an `export onnx` directory (thin over export.trt.builder).

The `export` group lives in commands/export.py; it attaches this command with `register(group)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

# keys an `export onnx` manifest may carry for the sizes the engines must cover (first found wins)
TREE_KEYS = ("max_tree", "tree_budget", "max_new_tokens_per_call", "block_size")
CONTEXT_KEYS = ("max_context", "context_length", "max_position_embeddings")


def _from_manifest(manifest: dict[str, Any] | None, keys: tuple[str, ...]) -> int | None:
    if not manifest:
        return None
    for scope in (manifest, manifest.get("budget") or {}, manifest.get("config") or {}):
        for key in keys:
            if isinstance(scope, dict) and isinstance(scope.get(key), int):
                return int(scope[key])
    return None


def _axes(values: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    from specpress.errors import UsageError
    from specpress.export.trt.profiles import AxisRange

    out = []
    for v in values:
        name, sep, rng = v.partition("=")
        if not sep or not name:
            raise UsageError(f"--axis takes NAME=MIN:OPT:MAX, got {v!r}")
        out.append((name, AxisRange.parse(rng)))
    return tuple(out)


@click.command("trt")
@click.option("--onnx", "onnx_dir", type=click.Path(path_type=Path, file_okay=False),
              help="An `specpress export onnx` output directory.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Engine directory to write.")
@click.option("--target-gpu", default="",
              help="TensorRT for RTX compute capabilities, comma-separated (e.g. sm86,sm89)  [default: the "
                   "builder's]. Standard TensorRT builds for the GPU it runs on.")
@click.option("--max-tree", type=click.IntRange(min=1),
              help="Most new positions per drafter call (tree budget / block size)  [default: the export "
                   "manifest's, else 64].")
@click.option("--max-context", type=click.IntRange(min=1),
              help="Most positions the drafter's K/V holds  [default: the export manifest's, else 2048].")
@click.option("--axis", "axis_specs", multiple=True, metavar="NAME=MIN:OPT:MAX",
              help="Range of one dynamic axis, overriding the budget (repeatable).")
@click.option("--flavour", type=click.Choice(["auto", "tensorrt", "tensorrt_rtx"]), default="auto", show_default=True,
              help="Which TensorRT builds: auto = standard TensorRT when importable, else TensorRT for RTX.")
@click.option("--probe", is_flag=True,
              help="Build a one-node TreeAttention graph instead of --onnx: checks that the installed TensorRT "
                   "maps specpress's plugin node onto the plugin.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--verbose", is_flag=True, help="Show TensorRT's info messages.")
def trt(onnx_dir: Path | None, out: Path, target_gpu: str, max_tree: int | None, max_context: int | None,
        axis_specs: tuple[str, ...], flavour: str, probe: bool, force: bool, verbose: bool) -> None:
    """Build TensorRT engines (one per exported graph) with the tree-attention plugin.

    --onnx is an `export onnx --attention plugin` directory (the standard form parses too). Standard
    TensorRT builds for the GPU it runs on; TensorRT for RTX builds ahead of time, on any machine, for the
    --target-gpu list. The engines' profiles cover --max-tree new positions per call over --max-context
    cached ones (the export's budget by default): larger ranges build slower and take more memory.
    `bench --backend tensorrt --drafter OUT` runs them (a CUDA GPU; the target stays on torch).

    \b
    Examples:
      specpress export onnx --drafter drafters/eagle3 --target $T --out onnx/eagle3-plugin \\
          --attention plugin --dtype fp16
      specpress export trt --onnx onnx/eagle3-plugin --out engines/eagle3                # standard TensorRT, this GPU
      specpress export trt --onnx onnx/eagle3-plugin --out engines/eagle3-rtx --flavour tensorrt_rtx --target-gpu sm89
      specpress export trt --probe --out /tmp/trt-probe                                  # does the install work?
    """
    from specpress.artifacts import claim_output, scratch_dir
    from specpress.errors import RequestError, UsageError
    from specpress.export.trt.builder import BuildOptions, read_source_manifest, build_engines
    from specpress.export.trt.profiles import Budget

    if (onnx_dir is None) == (not probe):
        raise UsageError("give exactly one of --onnx DIR (an `export onnx` output) or --probe")
    with claim_output(out, force=force, inputs={"--onnx": onnx_dir}), \
            scratch_dir("specpress-trt-probe-") as scratch:
        if probe:
            from specpress.export.trt.probe import save_probe

            onnx_dir = Path(scratch)
            save_probe(onnx_dir / "tree_attention_probe.onnx")
        assert onnx_dir is not None
        if not onnx_dir.is_dir():
            raise RequestError(f"--onnx {onnx_dir} is not a directory; expected an `export onnx` output")
        manifest = read_source_manifest(onnx_dir)
        tree = max_tree or _from_manifest(manifest, TREE_KEYS) or 64
        context = max_context or _from_manifest(manifest, CONTEXT_KEYS) or 2048
        options = BuildOptions(budget=Budget(max_tree=tree, max_context=max(context, tree)), axes=_axes(axis_specs),
                               targets=tuple(t.strip() for t in target_gpu.split(",") if t.strip()),
                               flavour=None if flavour == "auto" else flavour)
        build_engines(onnx_dir, out, options, echo=click.echo, force=force, verbose=verbose)


def register(group: click.Group) -> None:
    """Attach `trt` to the `export` group."""
    group.add_command(trt)
