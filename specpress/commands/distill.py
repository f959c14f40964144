"""`specpress distill`: parse the options, run specpress.compress.distill_pipeline, print its report."""

from __future__ import annotations

from pathlib import Path

import click

from specpress.commands.options import target_dtype as target_dtype_option, TARGET_FORMS, TARGET_PATH
from specpress.commands.target_quant import target_quant_options


def _int_list(value: str | None, flag: str) -> tuple[int, ...] | None:
    """'2,4,7' -> (2, 4, 7); a clear error for anything else."""
    if value is None:
        return None
    try:
        out = tuple(int(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 2,4,7",
                                 param_hint=flag) from None
    if any(i < 0 for i in out):
        raise click.BadParameter(f"{value!r}: indices must be >= 0", param_hint=flag)
    return out

FAMILIES_HELP = "eagle, eagle3, mtp, dflash, lm"


@click.command()
@click.option("--target", "target_dir", required=True, type=TARGET_PATH,
              help="Target model directory (HF format with tokenizer.json)." + TARGET_FORMS)
@click.option("--family", required=True, help=f"Drafter family: {FAMILIES_HELP}.")
@click.option("--data", "data_path", required=True, type=click.Path(path_type=Path),
              help="Text file, .jsonl (\"text\" or chat \"messages\"), a directory of text/code files, "
                   "or zoo:train (the zoo's training split of this interpreter's stdlib).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Drafter directory to write.")
@click.option("--steps", type=click.IntRange(min=1), help="Optimizer steps (the lr schedule's length).")
@click.option("--minutes", type=click.FloatRange(min=0.01),
              help="Wall-clock budget. Alone, the lr schedule follows the share of the budget used (warmup, "
                   "then cosine to the floor at the end of the budget); with --steps, a cap.")
@click.option("--from", "from_dir", type=click.Path(path_type=Path),
              help="A larger drafter of the same family to distill into the student (its outputs are matched).")
@click.option("--init", "init_dir", type=click.Path(path_type=Path),
              help="Fine-tune this drafter (same family) instead of starting from a fresh one: its shape, taps "
                   "and draft vocabulary are kept, so shape flags are refused.")
@click.option("--resume", is_flag=True, help="Continue from <out>.partial/ left by an interrupted run.")
@click.option("--force", is_flag=True, help="Replace an existing --out.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True),
              help="Peak learning rate [eagle3 2e-3 (measured here), others 1e-3; dflash: 3e-3 measured better].")
@click.option("--optimizer", type=click.Choice(["adamw", "muon"]),
              help="muon: Muon on the weight matrices inside the drafter's transformer layers, AdamW on the rest "
                   "(learning rate matched to AdamW's update size) [eagle3 muon, others adamw].")
@click.option("--batch", type=click.IntRange(min=1), default=8, show_default=True, help="Windows per step.")
@click.option("--seq-len", type=click.IntRange(min=4), default=128, show_default=True, help="Tokens per window.")
@click.option("--hidden", type=click.IntRange(min=1), help="Student hidden size [target's; lm only may differ].")
@click.option("--layers", type=click.IntRange(min=1), help="Student layers [eagle/eagle3/mtp 1, dflash 2, lm L/4].")
@click.option("--ffn", type=click.IntRange(min=1), help="Student FFN width [target's].")
@click.option("--heads", type=click.IntRange(min=1), help="Student attention heads [target's].")
@click.option("--kv-heads", type=click.IntRange(min=1), help="Student KV heads [target's, or --heads].")
@click.option("--draft-vocab", type=click.IntRange(min=1), help="eagle3 draft vocabulary [min(V, 32000)].")
@click.option("--taps", callback=lambda ctx, param, v: _int_list(v, "--taps"),
              help="eagle3/dflash: target taps to fuse, comma-separated HF hidden_states indices (i < L: the "
                   "residual entering layer i; L: the final normed hidden) [eagle3 2,L//2,L-3; dflash the "
                   "published spread over the layers].")
@click.option("--ttt-steps", type=click.IntRange(min=1), help="Unrolled draft steps [eagle3 3, eagle 1, mtp modules].")
@click.option("--block-size", type=click.IntRange(min=2), default=8, show_default=True, help="dflash block size.")
@click.option("--anchors", type=click.IntRange(min=1), default=16, show_default=True, help="dflash anchors per window.")
@click.option("--gamma", type=click.FloatRange(min=0, min_open=True),
              help="dflash: loss weight decay, block position k weighs e^{-(k-1)/gamma} [DFlash's published 7 / 5 / 4 "
                   "for blocks of 16 / 10 / 8, interpolated between; 1 measured better here].")
@click.option("--markov-rank", type=click.IntRange(min=1),
              help="dflash: add DSpark's sequential Markov head of this rank (a bigram bias; drafts left to right) "
                   "[none; 128 measured better here].")
@click.option("--mask-token-id", type=click.IntRange(min=0), help="dflash MASK id [0].")
@click.option("--labels", type=click.Choice(["target", "data"]), default="target", show_default=True,
              help="mtp/dflash: soft CE to the target's distribution, or CE on the data's next token.")
@click.option("--tv-weight", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="dflash: weight w of the L1 distance between the drafter's and the target's distributions "
                   "per block position, (1 - w)·CE + w·L1 (DSpark trains with 0.9).")
@click.option("--checkpoint-minutes", type=click.FloatRange(min=0), default=2.0, show_default=True)
@click.option("--dtype", type=click.Choice(["auto", "bf16", "fp32"]), default="auto", show_default=True,
              help="Dtype of the target's and the student's forwards: bf16 runs them under bfloat16 autocast (about "
                   "2x faster on CPUs with AMX / AVX512-BF16, 2-3x slower on CPUs without them, which emulate it); "
                   "auto: bf16 where the device computes it natively (a bf16 GPU, such a CPU), fp32 elsewhere. "
                   "Losses, optimizer and weights stay fp32 either way (the target's weights are held in "
                   "--target-dtype); the artifact's provenance records the dtype used.")
@click.option("--bf16/--fp32", "legacy_bf16", default=None, hidden=True, help="Deprecated spelling of --dtype.")
@click.option("--compile", "compile_teacher", is_flag=True,
              help="Run the target's teacher forward through torch.compile (Inductor, fixed shapes): on the zoo "
                   "target's CPU 42-45 -> 28-31 ms a step, after 15-25 s of compiling (counted by --minutes).")
@click.option("--cache-teacher", "cache_dir", type=click.Path(path_type=Path),
              help="Cache the target's signals here (memory-mapped) and reuse them in later runs.")
@target_dtype_option("bf16", "The teacher's signals come out in it (an eagle3 student's loss keeps only its draft "
                             "vocabulary's logits) and the student's loss is computed in fp32 either way.")
@target_quant_options("train on its hidden states and distribution, the signals a drafter deployed beside that "
                      "target sees. With --init DRAFTER this re-aligns a trained drafter to a compressed target "
                      "(bench --target-quant measures what it recovers); the artifact records the spec, and "
                      "export hf / inspect show it",
                      data_default="--data (its training windows)")
def distill(target_dir: Path, family: str, data_path: Path, out: Path, steps: int | None, minutes: float | None,
            from_dir: Path | None, init_dir: Path | None, resume: bool, force: bool, seed: int, lr: float | None,
            optimizer: str | None, batch: int, seq_len: int, hidden: int | None, layers: int | None, ffn: int | None,
            heads: int | None, kv_heads: int | None, draft_vocab: int | None, taps: tuple[int, ...] | None,
            ttt_steps: int | None, block_size: int, anchors: int, gamma: float | None, markov_rank: int | None,
            mask_token_id: int | None, labels: str, tv_weight: float, checkpoint_minutes: float, dtype: str,
            legacy_bf16: bool | None, compile_teacher: bool, cache_dir: Path | None, target_dtype: str,
            target_quant: str | None, target_quant_data: str | None) -> None:
    """Train a drafter against a target (or shrink a --from drafter, or fine-tune an --init one) and write it
    to --out.

    Losses: eagle SmoothL1 feature + 0.1 soft CE; eagle3 training-time test over --ttt-steps steps;
    mtp soft CE per chained step; dflash block loss with random anchors; lm forward KL. Teacher signals
    (hidden states, logits) come from the target on the fly. Progress shows the loss and acc@k (top-1
    agreement with the target per draft position). Checkpoints go to <out>.partial/ every
    --checkpoint-minutes; --resume continues an interrupted run (a checkpoint of a different run is
    refused).

    Budget: --steps N fixes the schedule (deterministic for a seed); --minutes M alone lays the lr warmup
    and cosine over the wall clock, so the schedule ends at the budget however fast the machine is and
    the step count varies with it. The closing summary gives acc@k on held-out windows (the last 5 % of
    the data) and on the last training batches, and how many passes over the data the run made: training
    agreement above the held-out one after a few passes means more data will help.

    Defaults, the published ones and those measured better here (zoo target, 10 minutes, BENCHMARKS.md):
    eagle3 trains with Muon at lr 2e-3 (chain:4 tau 3.05 with AdamW at 1e-3, 3.32 / 3.34 with Muon);
    --taps keeps the published {2, L//2, L-3} by default, while 2,4,8 (the final hidden instead of
    L-3) gave +0.14 chain:4 tau on the 8-layer zoo target. dflash keeps DFlash's gamma (4 for blocks
    of 8) and AdamW (tau 1.90 at block:8); its best recipe here is target-regenerated data (`specpress
    regenerate`) with --markov-rank 128 --lr 3e-3 --optimizer muon --gamma 1 (tau 3.27); DSpark's
    --tv-weight 0.9 did worse than CE alone (the Markov head is stored as markov_head.markov_w{1,2}.weight,
    its rank as dflash_config.markov_rank). --compile gave 10 % more steps in one 10-minute run.
    --dtype auto trains in bf16 only where the device computes it natively: on a CPU without AMX or
    AVX512-BF16 (and a pre-Ampere GPU) it trains in fp32, the faster there.

    Multi-GPU: `torchrun --nproc_per_node N -m specpress.cli distill ...` shards the batches by rank
    (gradients all-reduced; rank 0 writes).

    Defaults are the published losses, step weights, clipping and DFlash's gamma (EAGLE-1, EAGLE-3, DeepSeek's
    MTP, DFlash) with AdamW at lr 1e-3, sized for small drafters (the papers train 7B-scale drafters at 3e-5
    to 6e-4), except eagle3's --lr 2e-3 --optimizer muon, measured better on the zoo (chain:4 tau 3.32 / 3.34
    against 3.05 with AdamW 1e-3). Measured better here but not the default (BENCHMARKS.md): dflash with
    --markov-rank 128 --lr 3e-3 --optimizer muon --gamma 1 --minutes 10 on data regenerated by the target
    (`specpress regenerate --sequences 18432 --batch 128`): tau 3.27 at block:8, against about 2.0 with the
    defaults on the corpus. `specpress sweep recipes/dflash.yaml` regenerates and trains that way in one
    command.

    \b
    Examples:
      specpress distill --target ~/.cache/specpress/zoo/small --family eagle3 \\
          --data zoo:train --out drafters/eagle3 --minutes 8
      specpress distill --target ~/.cache/specpress/zoo/small --family eagle3 \\
          --data zoo:train --out drafters/eagle3 --minutes 8 --resume        # after Ctrl-C
      specpress distill --target ~/.cache/specpress/zoo/small --family lm --data ./my-code/ \\
          --out drafters/lm --steps 2000 --layers 2
      specpress distill --target ~/.cache/specpress/zoo/small --family eagle3 --data zoo:train \\
          --init drafters/eagle3 --target-quant nvfp4:activations=static --steps 300 --out drafters/eagle3-nvfp4t
    """
    from specpress.compress.distill_pipeline import distill_pipeline, distill_request, report_lines

    req = distill_request(family, steps=steps, minutes=minutes, dtype=dtype, legacy_bf16=legacy_bf16,
                          compile=compile_teacher, target_quant=target_quant, target_quant_data=target_quant_data,
                          lr=lr, optimizer=optimizer, batch=batch, seq_len=seq_len, seed=seed, hidden=hidden,
                          layers=layers, ffn=ffn, heads=heads, kv_heads=kv_heads, draft_vocab=draft_vocab, taps=taps,
                          ttt_steps=ttt_steps, block_size=block_size, anchors=anchors, gamma=gamma,
                          markov_rank=markov_rank, mask_token_id=mask_token_id, labels=labels, tv_weight=tv_weight,
                          checkpoint_minutes=checkpoint_minutes)
    run = distill_pipeline(req, target_dir, data_path, out, from_dir=from_dir, init_dir=init_dir, resume=resume,
                           force=force, cache_dir=cache_dir, target_dtype=target_dtype, progress=True)
    for line in report_lines(run):
        click.echo(line)
