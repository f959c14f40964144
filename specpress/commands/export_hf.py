"""`specpress export hf`: a drafter (float or quantized) as a serving engine loads it: the options parsed, then
export.hf.pipeline.hf_export, and its summary printed.

A standalone Click command; `register(group)` adds it to the `export` group (specpress/commands/export.py).
"""

from __future__ import annotations

import click

from specpress.export.hf.engines import ENGINES, help_text


@click.command("hf")
@click.option("--drafter", "drafter", required=True, type=click.Path(exists=True, file_okay=False),
              help="Drafter directory (specpress's, or a speculators / compressed-tensors / ModelOpt one).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory (written atomically).")
@click.option("--for", "engine", type=click.Choice(list(ENGINES)), default=None,
              help="Write what this serving engine loads for the drafter: its layout, its quantized-Linear format, the "
                   "config fields and float-Linear names it reads; refuse (naming its rule and the fix) what it "
                   "cannot load, before writing anything. The summary prints the command that serves it. "
                   + help_text() + ". MTP drafters have no route in any of them.")
@click.option("--format", "fmt", type=click.Choice(["speculators", "modelopt"]), default=None,
              help="Write a layout alone, without an engine's rules (with --for: only the engine's own layout). "
                   "speculators: the speculators layout (lm drafters as a plain HF dir), quantized Linears as "
                   "compressed-tensors: int4 / int8 weight-only as pack-quantized; int8 with --activations dynamic / "
                   "static as int-quantized; fp8 as float-quantized with input_activations; nvfp4 as "
                   "nvfp4-pack-quantized; mxfp8 / mxfp4 as mxfp8-quantized / mxfp4-pack-quantized. modelopt: the "
                   "family's public layout + hf_quant_config.json: fp8 as FP8 or FP8_PER_CHANNEL_PER_TOKEN; nvfp4 as "
                   "NVFP4 or W4A16_NVFP4; int4 as W4A16_AWQ; int8 as W8A16 or W8A8_SQ_PER_CHANNEL; mxfp8 (dynamic) as "
                   "MXFP8. Refused with the format's rule (compressed-tensors 0.20.1 quantization/quant_scheme.py, "
                   "ModelOpt 0.47 torch/export/quant_utils.py): a pre_quant_scale (awq, smoothquant) in "
                   "compressed-tensors; per-channel fp8 with static activations, per-token int8 activations, zero "
                   "points, mxfp4 and weight-only mxfp8 in ModelOpt; bitsandbytes and --kv-cache fp8 in both "
                   "(README: the scheme x engine table).")
@click.option("--target", default=None, metavar="NAME_OR_PATH",
              help="The target the server loads (a model id or a local directory): the speculators layout (--format "
                   "speculators, --for vllm with eagle3 / dflash) records it as the verifier and requires it, and "
                   "the printed serve command names it. A local directory is checked against the target the "
                   "drafter was built for (and eagle3 / dflash speculators layouts copy its embedding / head).")
@click.option("--verifier", default=None, hidden=True, help="Deprecated spelling of --target.")
@click.option("--policy", default=None,
              help="Draft policy to record as the proposal method (chain:K; tree / dynamic are written as the "
                   "nearest chain; block:B for dflash). Default: chain of 3, dflash block_size - 1.")
@click.option("--materialize-head", is_flag=True,
              help="Write a low-rank head (prune --head-rank) as its dense product, or a shared head over a reduced "
                   "draft vocabulary (prune --share-head) as the target's rows (read from --target, a local "
                   "directory), as one lm_head: vLLM, SGLang and TensorRT-LLM load no other head. Costs the bytes "
                   "the head saved (the export says how many); without it such a head is refused with the engine's "
                   "rule. A shared head over the whole vocabulary needs no flag: it is written as the engine shares "
                   "the target's head.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def hf(drafter: str, out: str, engine: str | None, fmt: str | None, target: str | None, verifier: str | None,
       policy: str | None, materialize_head: bool, force: bool) -> None:
    """Export a drafter as vLLM, SGLang, TensorRT-LLM or Edge-LLM's exporter reads it (--for), or in a serving layout
    (--format): the same codes and scales specpress measured, re-laid out. Give --for, --format, or both.

    \b
    Examples:
      specpress export hf --drafter drafters/eagle3-int4 --out served/eagle3-int4 --for vllm \\
          --target ~/models/L31-8B
      specpress export hf --drafter drafters/eagle3-fp8 --out served/eagle3-fp8 --for trtllm --target ~/models/L31-8B
      specpress export hf --drafter drafters/eagle3-nvfp4 --out served/eagle3-edge --for edgellm
      specpress export hf --drafter drafters/eagle3-int4 --out served/eagle3-int4 --format speculators \\
          --target ~/.cache/specpress/zoo/small
    """
    from specpress.export.hf.pipeline import hf_export

    summary = hf_export(drafter, out, fmt, engine=engine, target=target, legacy_verifier=verifier, policy=policy,
                        force=force, materialize_head=materialize_head)
    for line in summary.lines():
        click.echo(line)


def register(group: click.Group) -> None:
    """Add `hf` to the `export` group."""
    group.add_command(hf)
