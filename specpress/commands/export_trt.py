"""`specpress export trt`: TensorRT engines from an `export onnx` directory: the options parsed, then
export.trt.pipeline.engines_from_onnx.

The `export` group lives in commands/export.py; it attaches this command with `register(group)`.
"""

from __future__ import annotations

from pathlib import Path

import click


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
    from specpress.export.trt.pipeline import engines_from_onnx

    engines_from_onnx(onnx_dir, out, probe=probe, target_gpu=target_gpu, max_tree=max_tree, max_context=max_context,
                      axes=axis_specs, flavour=flavour, force=force, verbose=verbose, echo=click.echo)


def register(group: click.Group) -> None:
    """Attach `trt` to the `export` group."""
    group.add_command(trt)
