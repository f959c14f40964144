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
@click.option("--verifier", default=None,
              help="The target the server loads (model id or path); recorded in speculators_config. A local "
                   "directory is checked against the target the drafter was built for.")
@click.option("--policy", default=None,
              help="Draft policy to record as the proposal method (chain:K; tree / dynamic are written as the "
                   "nearest chain; block:B for dflash). Default: chain of 3, dflash block_size - 1.")
@click.option("--materialize-head", is_flag=True,
              help="Write a low-rank head (prune --head-rank) as its dense product, or a shared head over a reduced "
                   "draft vocabulary (prune --share-head) as the target's rows (read from --verifier, a local "
                   "directory), as one lm_head: vLLM and TensorRT-LLM load no other head. Costs the bytes the head "
                   "saved (the export says how many); without it such a head is refused with the engines' rule.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def hf(drafter: str, out: str, fmt: str, verifier: str | None, policy: str | None, materialize_head: bool,
       force: bool) -> None:
    """Export a drafter for vLLM (speculators) or TensorRT-LLM (modelopt): the same codes and scales, re-laid out.

    SGLang has no quantized route here (see --format); it reads a float drafter's own directory."""
    from pathlib import Path

    from specpress.artifacts import claim_output
    from specpress.export.hf import export_hf

    local = verifier if verifier is not None and Path(verifier).expanduser().exists() else None  # not a model id
    with claim_output(out, force=force, inputs={"--drafter": drafter, "--verifier": local}):
        summary = export_hf(drafter, out, fmt, verifier=verifier, policy=policy, force=force,
                            materialize_head=materialize_head)
    for line in summary.lines():
        click.echo(line)


def register(group: click.Group) -> None:
    """Add `hf` to the `export` group."""
    group.add_command(hf)
