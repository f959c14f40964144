"""`specpress export`: deployable forms of a drafter (and of its target). `export onnx` and `export target`
parse their options, then call specpress.export.pipeline (onnx_export, target_export) and print its lines."""

from __future__ import annotations

from pathlib import Path

import click

from specpress.commands import export_hf, export_trt
from specpress.commands.options import target_dtype, TARGET_FORMS, TARGET_PATH


@click.group()
def export() -> None:
    """Export a drafter for another runtime: ONNX graphs (onnxruntime, TensorRT) or serving formats (hf); or a
    target's forward to ONNX (the whole loop in onnxruntime)."""


@export.command("onnx")
@click.option("--drafter", "drafter_dir", required=True, type=click.Path(path_type=Path),
              help="Drafter artifact directory (float or quantized).")
@click.option("--target", "target_dir", required=True, type=TARGET_PATH,
              help="Its target model dir: the shared embeddings/head are exported from it, beside the graphs." + TARGET_FORMS)
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory to write.")
@click.option("--attention", type=click.Choice(["standard", "plugin"]), default="standard", show_default=True,
              help="standard: ONNX Attention (opset 23); plugin: a specpress::TreeAttention node (TensorRT) "
                   "with a standard-op fallback function inside the file.")
@click.option("--opset", type=click.IntRange(min=1), help="ONNX opset  [default: 23]")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True,
              help="Float type of the graphs (bf16 is refused: onnxruntime's CPU kernels lack it).")
@click.option("--quant-format", type=click.Choice(["matmulnbits", "qdq"]), default="matmulnbits",
              show_default=True, help="Quantized Linears: onnxruntime's MatMulNBits (int4; int8 stays DequantizeLinear + MatMul, "
                   "faster there), or DequantizeLinear + MatMul for all (TensorRT).")
@click.option("--accuracy-level", type=click.IntRange(0, 4), default=0, show_default=True,
              help="MatMulNBits activations: 0 = fp32 (drafts what torch drafts), 4 = int8 (faster CPU kernels).")
@target_dtype("auto", "The target provides the shared embeddings/head, written in --dtype from the values it holds "
                      "(auto: as stored, never rounded first; a real checkpoint is stored in bf16), and verifies the "
                      "validation rounds.")
@click.option("--force", is_flag=True, help="Replace an existing --out.")
def onnx(drafter_dir: Path, target_dir: Path, out: Path, attention: str, opset: int | None, dtype: str,
         quant_format: str, accuracy_level: int, target_dtype: str, force: bool) -> None:
    """Export a drafter to ONNX graphs + manifest.json, validated against torch.

    One graph per computation the runtime calls (the drafting step with past K/V in and present K/V
    out, the tap fusion, DFlash's block pass, each MTP module, the lm forward). Every graph is run in
    onnxruntime against the torch drafter on random inputs, then on real drafting rounds (the family's
    default policy, greedy, prompts the target writes itself) in which the onnxruntime backend must draft
    what the torch drafter drafts, near ties aside; over tolerance nothing is written.

    Weights go to external data beside each graph (`<graph>.onnx.data`, and the target's shared tensors
    in target_shared.bin), streamed as the graph is built: a drafter of any size exports (one ONNX file
    cannot exceed 2 GB), and memory holds the target in --target-dtype, the drafter and one validation
    session's mapped weights (`specpress plan export onnx ...` says how much before you start).

    \b
    Example:
      specpress export onnx --drafter drafters/eagle3 --target ~/.cache/specpress/zoo/small --out onnx/eagle3
      specpress run --backend onnxruntime --drafter onnx/eagle3 --target ~/.cache/specpress/zoo/small ...
    """
    from specpress.export.onnx import ExportOptions
    from specpress.export.pipeline import onnx_export, onnx_lines

    options = ExportOptions(attention=attention, opset=opset, dtype=dtype, quant_format=quant_format,
                            accuracy_level=accuracy_level, force=force)
    rep = onnx_export(drafter_dir, target_dir, out, options, progress=lambda s: click.echo(f"  {s}", err=True),
                      warn=lambda s: click.echo(s, err=True), target_dtype=target_dtype, bar=True)
    for line in onnx_lines(rep, options):
        click.echo(line)


@export.command("target")
@click.option("--target", "target_dir", required=True, type=TARGET_PATH,
              help="Target model directory (HF format: config.json + model.safetensors)." + TARGET_FORMS)
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory to write.")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True,
              help="Float type of the graph (bf16 is refused: onnxruntime's CPU kernels lack it).")
@click.option("--force", is_flag=True, help="Replace an existing --out.")
def target(target_dir: Path, out: Path, dtype: str, force: bool) -> None:
    """Export a target model's forward to one ONNX graph + target_manifest.json, validated against torch.

    The graph takes ids, positions, a tree mask and the past K/V, and returns logits, the final hidden
    state, every hidden-state tap and the present K/V: prefill, plain decoding and tree verification, for
    any drafter's taps. It is checked on random inputs, then by greedy decoding through onnxruntime
    against the torch target; over tolerance nothing is written. `bench --target-backend onnxruntime`
    runs the whole loop in onnxruntime with it (exported on demand when not given).

    The target is loaded once, in --dtype itself (the validation's reference: fp32 is the lossless one),
    its weights stream into target.onnx.data as the graph is built, and the torch target is released
    before onnxruntime maps them, so the peak is about one target in --dtype.

    \b
    Example:
      specpress export target --target ~/.cache/specpress/zoo/small --out onnx/target
    """
    from specpress.export.pipeline import target_export, target_lines
    from specpress.export.target import TargetExportOptions

    options = TargetExportOptions(dtype=dtype, force=force)
    rep = target_export(target_dir, out, options, progress=lambda s: click.echo(f"  {s}", err=True))
    for line in target_lines(rep, options):
        click.echo(line)


export_hf.register(export)
export_trt.register(export)
