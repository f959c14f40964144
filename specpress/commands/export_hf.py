"""`specpress export hf`: a drafter (float or quantized) as a serving engine loads it.

A standalone Click command; `register(group)` adds it to the `export` group (specpress/commands/export.py).
"""

from __future__ import annotations

import click


@click.command("hf")
@click.option("--drafter", "drafter", required=True, type=click.Path(exists=True, file_okay=False),
              help="Drafter directory (specpress's, or a speculators / compressed-tensors / ModelOpt one).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory (written atomically).")
@click.option("--format", "fmt", required=True, type=click.Choice(["speculators", "modelopt"]),
              help="speculators: vLLM's drafter layout, quantized Linears as compressed-tensors (lm drafters as a "
                   "plain HF dir): int4 / int8 weight-only as pack-quantized; int8 with --activations dynamic / static "
                   "as int-quantized (symmetric, per channel); fp8 (any activations, channel or tensor) as "
                   "float-quantized with input_activations; nvfp4 as nvfp4-pack-quantized; mxfp8 / mxfp4 as "
                   "mxfp8-quantized / mxfp4-pack-quantized. modelopt: ModelOpt's "
                   "unified layout for TensorRT-LLM (hf_quant_config.json): fp8 as FP8 (per-tensor + static) or "
                   "FP8_PER_CHANNEL_PER_TOKEN; nvfp4 as NVFP4 (W4A4) or W4A16_NVFP4; int4 as W4A16_AWQ (awq's "
                   "pre_quant_scale kept); int8 as W8A16 or W8A8_SQ_PER_CHANNEL (smoothquant's pre_quant_scale "
                   "kept); mxfp8 with dynamic activations as MXFP8. Refused with the format's rule (read from compressed-tensors 0.20.1 quantization/"
                   "quant_scheme.py and ModelOpt 0.47 torch/export/quant_utils.py): a pre_quant_scale (awq, "
                   "smoothquant) in compressed-tensors; grouped / asymmetric int8 with activations; per-channel fp8 "
                   "with static activations, per-token int8 activations, zero points, mxfp4 and weight-only mxfp8 in "
                   "ModelOpt; bitsandbytes and --kv-cache fp8 in both (README: the scheme x format table). Neither is a tested "
                   "SGLang route when quantized (read from SGLang 0.5.x): it reads no speculators layout, its "
                   "ModelOpt FP8 config takes static per-tensor FP8 (quant_algo \"FP8\") only and its EAGLE-3 fc is "
                   "a plain Linear that would drop an fp8 scale (keep it in float with --exclude fc); SGLang reads a "
                   "float drafter's own directory.")
@click.option("--target", default=None, metavar="NAME_OR_PATH",
              help="The target the server loads (a model id or a local directory), required by --format "
                   "speculators, which records it as the verifier; a local directory is checked against the "
                   "target the drafter was built for (and eagle3 / dflash layouts copy its embedding / head).")
@click.option("--verifier", default=None, hidden=True, help="Deprecated spelling of --target.")
@click.option("--policy", default=None,
              help="Draft policy to record as the proposal method (chain:K; tree / dynamic are written as the "
                   "nearest chain; block:B for dflash). Default: chain of 3, dflash block_size - 1.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def hf(drafter: str, out: str, fmt: str, target: str | None, verifier: str | None, policy: str | None,
       force: bool) -> None:
    """Export a drafter for vLLM (speculators) or TensorRT-LLM (modelopt): the same codes and scales, re-laid out.

    SGLang has no quantized route here (see --format); it reads a float drafter's own directory.

    \b
    Examples:
      specpress export hf --drafter drafters/eagle3-int4 --out served/eagle3-int4 --format speculators \\
          --target ~/.cache/specpress/zoo/small
      specpress export hf --drafter drafters/eagle3-fp8 --out served/eagle3-fp8 --format modelopt
    """
    from pathlib import Path

    from specpress.artifacts import claim_output
    from specpress.errors import UsageError, deprecated
    from specpress.export.hf import export_hf

    if verifier is not None:
        if target is not None:
            raise UsageError("--verifier is the old spelling of --target; give --target only")
        deprecated("--verifier", "use --target")
        target = verifier
    local = target if target is not None and Path(target).expanduser().exists() else None  # not a model id
    with claim_output(out, force=force, inputs={"--drafter": drafter, "--target": local}):
        summary = export_hf(drafter, out, fmt, verifier=target, policy=policy, force=force)
    for line in summary.lines():
        click.echo(line)


def register(group: click.Group) -> None:
    """Add `hf` to the `export` group."""
    group.add_command(hf)
