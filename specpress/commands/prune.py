"""`specpress prune`: parse the options, run specpress.compress.prune_pipeline, print its report."""

from __future__ import annotations

from pathlib import Path

import click

from specpress.commands.options import target_dtype as target_dtype_option, TARGET_FORMS, TARGET_PATH


class KeepCount(click.ParamType):
    """A count to keep (an integer >= 1); a share 0 < R < 1 is read too, as the deprecated spelling."""

    name = "N"

    def convert(self, value, param, ctx):  # noqa: ANN001, ANN201 - Click's signature
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        try:
            return int(value)
        except ValueError:
            pass
        try:
            share = float(value)
        except ValueError:
            share = -1.0
        if not 0 < share < 1:
            self.fail(f"{value!r} is not a count to keep (an integer >= 1)", param, ctx)
        return share


@click.command()
@click.option("--drafter", "drafter_dir", required=True, type=click.Path(path_type=Path),
              help="Drafter artifact directory to prune.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Pruned drafter directory to write.")
@click.option("--ffn", type=KeepCount(),
              help="FFN channels each layer keeps (intermediate_size after pruning; the same in every layer).")
@click.option("--kv-heads", type=click.IntRange(min=1),
              help="KV groups each attention keeps (num_key_value_heads after pruning: whole GQA groups, a KV head "
                   "and its query heads).")
@click.option("--layers", type=click.IntRange(min=1),
              help="Layers to keep (multi-layer drafters: dflash, lm, eagle with >1 layer).")
@click.option("--vocab", type=click.IntRange(min=1),
              help="Draft-vocabulary tokens to keep (eagle3), most frequent first.")
@click.option("--heads", type=click.FloatRange(0, 1, min_open=True, max_open=True), hidden=True,
              help="Deprecated: the share of KV groups to remove (use --kv-heads).")
@click.option("--head-rank", type=click.IntRange(min=1),
              help="Factorise the drafter's own head (eagle3's draft head, an lm drafter's untied lm_head) into "
                   "rank-R factors: R x (hidden + vocabulary) parameters instead of hidden x vocabulary. Seconds; "
                   "give --recover-steps, the factorised head alone loses acceptance.")
@click.option("--head-init", type=click.Choice(["svd", "activation"]), default="svd", show_default=True,
              help="--head-rank's start: truncated SVD of the weight, or SVD whitened by the head's input "
                   "covariance on --data (reproduces the logits the head produces; needs --target).")
@click.option("--share-head", is_flag=True,
              help="eagle3: drop the draft head; the target's lm_head rows of the draft vocabulary replace it, read "
                   "from the target at load (shared bytes, not stored). Give --recover-steps: the rest of the "
                   "drafter is trained against the frozen rows.")
@click.option("--importance", type=click.Choice(["magnitude", "activation", "kl"]), default="magnitude",
              show_default=True, help="magnitude = weights only; activation / kl = measured on --data.")
@click.option("--vocab-source", type=click.Choice(["target", "data"]), default="target", show_default=True,
              help="--vocab counts the target's greedy next-token predictions, or the data's own tokens.")
@click.option("--target", "target_dir", type=TARGET_PATH,
              help="Target model directory (HF format with tokenizer.json): calibration and recovery." + TARGET_FORMS)
@click.option("--data", "data_path", type=click.Path(path_type=Path),
              help="Calibration data: a text file, a .jsonl of {\"text\": ...} lines, a directory of text/code "
                   "files, zoo:train / zoo:val, or a prompts file in bench's format (JSON lines of "
                   "{\"prompt\": ...} or {\"input_ids\": [...]}): the target's greedy continuations of those "
                   "prompts (--continuation-tokens each) are then the data. It should look like your traffic.")
@click.option("--continuation-tokens", type=click.IntRange(min=1), default=None,
              help="With a prompts file as --data: tokens the target generates greedily per prompt (stopping at "
                   "EOS).  [default: 128]")
@click.option("--recover-steps", type=click.IntRange(min=0), default=0, show_default=True,
              help="Distillation steps against the target after pruning (0 = none).")
@click.option("--recover-lr", type=click.FloatRange(min=0, min_open=True), default=1e-4, show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="Windows per calibration / recovery batch.")
@click.option("--seq-len", type=click.IntRange(min=2), default=128, show_default=True, help="Tokens per window.")
@click.option("--calib-batches", type=click.IntRange(min=1), default=2, show_default=True,
              help="Calibration batches for activation / kl importance.")
@click.option("--vocab-tokens", type=click.IntRange(min=1),  # default: PruneConfig's (it imports torch)
              help="Tokens --vocab counts (target predictions or data tokens) to rank the vocabulary: one target "
                   "forward per --batch x --seq-len of them (256 at the defaults; ~10 s on the zoo target, about an "
                   "hour for a 1B target on 2 CPU cores).  [default: 262144]")
@click.option("--vocab-minutes", type=click.FloatRange(min=0, min_open=True),
              help="Time budget of that counting: it stops at whichever of --vocab-tokens or this comes first, and "
                   "the step records how many tokens it counted (`specpress plan` estimates the forwards' time).  "
                   "[default: 10]")
@click.option("--kl-group", type=click.IntRange(min=1), default=8, show_default=True,
              help="FFN channels scored together by kl.")
@click.option("--seed", type=int, default=0, show_default=True)
@target_dtype_option("bf16", "With --target: its signals rank the vocabulary and score the units.")
@click.option("--force", is_flag=True, help="Replace an existing --out.")
def prune(drafter_dir: Path, out: Path, ffn: int | float | None, kv_heads: int | None, layers: int | None,
          vocab: int | None, heads: float | None, head_rank: int | None, head_init: str, share_head: bool,
          importance: str, vocab_source: str, target_dir: Path | None, data_path: Path | None,
          continuation_tokens: int | None, recover_steps: int, recover_lr: float, batch: int, seq_len: int,
          calib_batches: int, vocab_tokens: int | None, vocab_minutes: float | None, kl_group: int,
          seed: int, target_dtype: str, force: bool) -> None:
    """Remove FFN channels, KV groups, layers or draft-vocabulary tokens, or shrink the draft head: a smaller drafter.

    Every size option says what stays, as the pruned drafter's config will (distill's student options
    --ffn, --kv-heads, --layers say the same). The result is in the family's public layout
    (smaller config and tensors) and records the step
    in its provenance (`specpress inspect OUT` shows the chain). Importance: weight magnitude,
    activations on --data, or kl, which scores each unit by how much removing it raises
    KL(target || drafter) on the calibration data. --recover-steps then distills the pruned drafter
    against the target, as `specpress distill` does.

    --vocab (EAGLE-3) rebuilds lm_head, d2t and t2d for the tokens the target predicts most often on
    --data, counted over --vocab-tokens predictions or --vocab-minutes of target forwards, whichever
    ends first. Rank on enough of them: on the zoo target a quarter of the vocabulary ranked on 2,048
    predictions kept 94.5 % of tau, ranked on 262,144 (the default, ~10 s of target forwards) 102.7 %
    (recorded in BENCHMARKS.md at b5bd58d, 2026-11-29). A large target reaches the time budget first: the
    summary says how many it counted; give more minutes (or a GPU) to rank on more.

    Rank on data that looks like your traffic: a vocabulary ranked on one kind of text covers another
    worse, and tau falls with it (`bench` reports eval_coverage beside the calibration coverage recorded
    here, and warns when it is more than 3 points lower). Give your own prompts as --data (bench's
    prompts file) and --vocab ranks on the target's continuations of them.

    The draft head (EAGLE-3's is ~46 % of a zoo drafter's parameters) shrinks two more ways: --head-rank R
    keeps it as two rank-R factors (both ordinary Linears: every quantize scheme takes them with --include
    lm_head), --share-head reads the target's own head rows instead (nothing stored; the bytes are
    reported as shared by inspect and the sweep). vLLM, SGLang and TensorRT-LLM load neither a low-rank head
    nor a shared head over a reduced vocabulary: `export hf --for ENGINE` refuses them with that engine's
    rule, or writes a dense head with --materialize-head; a shared head over the target's whole vocabulary is
    written as each engine shares the target's. Run after --vocab in the same call they act on the cut
    vocabulary.

    \b
    Examples (a zoo EAGLE-3 drafter: 768 FFN channels, 4 KV groups, 4096 draft tokens):
      specpress prune --drafter drafters/eagle3 --out drafters/eagle3-ffn384 --ffn 384
      specpress prune --drafter drafters/eagle3 --out drafters/eagle3-p --ffn 384 --kv-heads 3 --vocab 2048 \\
          --importance kl --target ~/.cache/specpress/zoo/small --data zoo:train --recover-steps 200
      specpress prune --drafter drafters/eagle3 --out drafters/eagle3-v1024 --vocab 1024 \\
          --target ~/.cache/specpress/zoo/small --data my_prompts.jsonl --continuation-tokens 128
      specpress prune --drafter drafters/eagle3 --out drafters/eagle3-r64 --head-rank 64 \\
          --target ~/.cache/specpress/zoo/small --data zoo:train --recover-steps 200
    """
    from specpress.compress.prune import PruneConfig
    from specpress.compress.prune_pipeline import prune_from_dirs, report_lines

    config = PruneConfig(ffn=ffn, kv_heads=kv_heads, heads=heads, layers=layers, vocab=vocab, head_rank=head_rank,
                         head_init=head_init, share_head=share_head, importance=importance,
                         vocab_source=vocab_source, kl_group=kl_group, batch=batch, seq_len=seq_len,
                         calib_batches=calib_batches, seed=seed, recover_steps=recover_steps, recover_lr=recover_lr,
                         **({} if vocab_tokens is None else {"vocab_tokens": vocab_tokens}),
                         **({} if vocab_minutes is None else {"vocab_minutes": vocab_minutes}))
    report = prune_from_dirs(drafter_dir, out, config, target_dir=target_dir, data_path=data_path,
                             continuation_tokens=continuation_tokens, target_dtype=target_dtype, force=force,
                             progress=True,
                             on_prompt=lambda i, n: click.echo(f"\r  continuations {i + 1}/{n}", err=True,
                                                               nl=i + 1 == n))
    for line in report_lines(report):
        click.echo(line)
