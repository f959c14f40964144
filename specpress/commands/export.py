"""`specpress export`: deployable forms of a drafter (and of its target). `export onnx` and `export target` are
thin layers over specpress.export."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import click

from specpress.commands import export_hf, export_trt


@click.group()
def export() -> None:
    """Export a drafter for another runtime: ONNX graphs (onnxruntime, TensorRT) or serving formats (hf); or a
    target's forward to ONNX (the whole loop in onnxruntime)."""


@export.command("onnx")
@click.option("--drafter", "drafter_dir", required=True, type=click.Path(path_type=Path),
              help="Drafter artifact directory (float or quantized).")
@click.option("--target", "target_dir", required=True, type=click.Path(path_type=Path),
              help="Its target model dir: the shared embeddings/head are exported from it, beside the graphs.")
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
@click.option("--force", is_flag=True, help="Replace an existing --out.")
def onnx(drafter_dir: Path, target_dir: Path, out: Path, attention: str, opset: int | None, dtype: str,
         quant_format: str, accuracy_level: int, force: bool) -> None:
    """Export a drafter to ONNX graphs + manifest.json, validated against torch.

    One graph per computation the runtime calls (the drafting step with past K/V in and present K/V
    out, the tap fusion, DFlash's block pass, each MTP module, the lm forward). Every graph is run in
    onnxruntime against the torch drafter on random inputs, then on real drafting rounds (the family's
    default policy, greedy, prompts the target writes itself) in which the onnxruntime backend must draft
    what the torch drafter drafts, near ties aside; over tolerance nothing is written.

    \b
    Example:
      specpress export onnx --drafter drafters/eagle3 --target ~/.cache/specpress/zoo/small --out onnx/eagle3
      specpress run --backend onnxruntime --drafter onnx/eagle3 --target ~/.cache/specpress/zoo/small ...
    """
    from specpress.artifacts import claim_output
    from specpress.export.onnx import ExportOptions, export_from_dirs

    options = ExportOptions(attention=attention, opset=opset, dtype=dtype, quant_format=quant_format,
                            accuracy_level=accuracy_level, force=force)
    with claim_output(out, force=force, inputs={"--drafter": drafter_dir, "--target": target_dir}):
        rep = export_from_dirs(drafter_dir, target_dir, out, options,
                               progress=lambda s: click.echo(f"  {s}", err=True),
                               warn=lambda s: click.echo(s, err=True))
    own = sum(rep.graphs.values())
    click.echo(f"exported {len(rep.graphs)} graph(s) -> {rep.out}  ({rep.seconds:.1f} s, attention {attention}, "
               f"{dtype})")
    rounds = rep.rounds.errors if rep.rounds else {}
    click.echo(f"  {'graph':<10} {'bytes':>14}   max_rel / max_abs over outputs: random inputs | real rounds")
    for name, size in rep.graphs.items():
        click.echo(f"  {name:<10} {size:>12,} B   {_worst(rep.errors[name])} | {_worst(rounds.get(name))}")
    if rep.rounds:
        r = rep.rounds
        click.echo(f"  real rounds: {r.policy} greedy, {r.prompts} prompts, {r.rounds} rounds: {r.agree} drafted the "
                   f"same tokens, {r.near_ties} near ties, {r.disagree} differ")
    click.echo(f"  drafter graphs {own:,} B; shared target embeddings/head {rep.shared_bytes:,} B (counted apart); "
               f"tolerance max_rel {rep.tolerance:g}")
    if rep.quantization:
        q = rep.quantization
        ops = Counter(note.split(" -> ", 1)[-1] for note in q["linears"])  # "<linear>: <scheme> -> <ops>"
        click.echo(f"  quantized Linears ({', '.join(q['schemes'])}, --quant-format {q['format']}): "
                   + "; ".join(f"{n} as {op}" for op, n in ops.items()))


@export.command("target")
@click.option("--target", "target_dir", required=True, type=click.Path(path_type=Path),
              help="Target model directory (HF format: config.json + model.safetensors).")
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

    \b
    Example:
      specpress export target --target ~/.cache/specpress/zoo/small --out onnx/target
    """
    from specpress.artifacts import check_space, claim_output
    from specpress.export.target import TargetExportOptions, export_target_from_dir
    from specpress.models.io import tensor_index

    options = TargetExportOptions(dtype=dtype, force=force)
    with claim_output(out, force=force, inputs={"--target": target_dir}):
        params = sum(math.prod(t.shape) for t in tensor_index(target_dir).values())  # from the headers alone
        check_space(out, params * (2 if dtype == "fp16" else 4), f"the target's {params:,} parameters at {dtype}")
        rep = export_target_from_dir(target_dir, out, options, progress=lambda s: click.echo(f"  {s}", err=True))
    d = rep.decode
    click.echo(f"exported the target -> {rep.out}  ({rep.seconds:.1f} s, {dtype}, {rep.bytes:,} B)")
    click.echo(f"  random inputs: {_worst(rep.errors)}; tolerance max_rel {rep.tolerance:g}")
    click.echo(f"  greedy decoding, {d['prompts']} prompts x {d['tokens']} tokens: {d['agree']} identical, "
               f"{d['near_ties']} near ties, {d['differ']} differ")


def _worst(errors: dict | None) -> str:
    """'max_rel / max_abs (output)' of the output with the largest max_rel; '-' when not run."""
    if not errors:
        return "-"
    name, e = max(errors.items(), key=lambda kv: kv[1]["max_rel"])
    return f"{e['max_rel']:.1e} / {max(x['max_abs'] for x in errors.values()):.1e} ({name})"


export_hf.register(export)
export_trt.register(export)
