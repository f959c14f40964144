"""`specpress prune`: a thin layer over specpress.compress.prune."""

from __future__ import annotations

from pathlib import Path

import click

from specpress.commands.options import target_dtype as target_dtype_option


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
@click.option("--target", "target_dir", type=click.Path(path_type=Path),
              help="Target model directory (HF format with tokenizer.json): calibration and recovery.")
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
    import torch

    from specpress.artifacts import claim_output
    from specpress.compress.data import check_data
    from specpress.commands.guards import check_seq_len
    from specpress.compress.calibration import target_stream
    from specpress.compress.prune import PruneConfig, check_request, prune as prune_drafter
    from specpress.compress.traffic import CONTINUATION_TOKENS, is_prompts_file, traffic_stream
    from specpress.errors import RequestError, UsageError
    from specpress.models.drafter import build_drafter
    from specpress.models.drafter_io import load_drafter, read_drafter_config, save_drafter
    from specpress.models.target import load_target
    from specpress.models.tokenizer import load_tokenizer

    config = PruneConfig(ffn=ffn, kv_heads=kv_heads, heads=heads, layers=layers, vocab=vocab, head_rank=head_rank,
                         head_init=head_init, share_head=share_head, importance=importance,
                         vocab_source=vocab_source, kl_group=kl_group, batch=batch, seq_len=seq_len,
                         calib_batches=calib_batches, seed=seed, recover_steps=recover_steps, recover_lr=recover_lr,
                         **({} if vocab_tokens is None else {"vocab_tokens": vocab_tokens}),
                         **({} if vocab_minutes is None else {"vocab_minutes": vocab_minutes}))
    out = out.expanduser()
    if data_path is not None and target_dir is None:
        raise UsageError("--data needs --target DIR: its tokenizer encodes the data")
    traffic = data_path is not None and is_prompts_file(data_path)
    if continuation_tokens is not None and not traffic:
        raise RequestError("--continuation-tokens sets how much the target generates per prompt of a prompts file "
                           "given as --data; --data is not one (a .jsonl of {\"prompt\": ...} or {\"input_ids\": "
                           "[...]} lines): drop --continuation-tokens or give a prompts file")
    inputs = {"--drafter": drafter_dir, "--target": target_dir, "--data": data_path}
    with claim_output(out, force=force, inputs=inputs):
        with torch.device("meta"):  # every shape / flag error first, from config.json alone
            shape = build_drafter(read_drafter_config(drafter_dir)[1])
            counts = check_request(shape, config, has_target=target_dir is not None, has_calib=data_path is not None)
        say_legacy(config, shape.config, counts)
        if target_dir is not None:
            check_seq_len(target_dir, seq_len, batch, training=recover_steps > 0)
        if data_path is not None:
            check_data(data_path)  # a device, a FIFO or more text than memory: refused before loading
        target = load_target(target_dir, dtype=target_dtype) if target_dir is not None else None
        stream, extra = None, {}
        if data_path is not None:
            assert target is not None and target_dir is not None
            extra = {"source": str(data_path), "target": str(target_dir)}
            if traffic:
                tok = load_tokenizer(target_dir) if (target_dir.expanduser() / "tokenizer.json").is_file() else None
                stream, record = traffic_stream(
                    target, data_path, tok, continuation_tokens or CONTINUATION_TOKENS,
                    on_prompt=lambda i, n: click.echo(f"\r  continuations {i + 1}/{n}", err=True,
                                                      nl=i + 1 == n))
                extra["traffic"] = record
            else:
                stream = target_stream(target, target_dir, data_path)
        pruned = prune_drafter(load_drafter(drafter_dir, target), config, target=target, calib=stream,
                               provenance_extra=extra, progress=True)
        save_drafter(pruned, out, force=force)
    step = next(s for s in reversed(pruned.provenance) if s.get("step") == "prune")
    before, after = step["shape_before"], step["shape_after"]
    changed = ", ".join(f"{k} {before.get(k)} -> {after[k]}" for k in after if before.get(k) != after[k])
    click.echo(f"{pruned.family} drafter written to {out}")
    click.echo(f"  {changed}")
    click.echo(f"  params {step['params_before']:,} -> {step['params_after']:,}  bytes {step['bytes_before']:,} -> "
               f"{step['bytes_after']:,} ({step['bytes_after'] / step['bytes_before']:.1%})")
    cal = step["calibration"]
    vocab_rec = step["importance"].get("vocab")
    if vocab_rec:
        on = (f"the target's continuations of {cal['traffic']['prompts']} prompts" if "traffic" in cal else
              "the calibration data")
        before, after = vocab_rec["coverage_before"], vocab_rec["coverage_after"]
        click.echo(f"  draft vocabulary ranked on {vocab_rec['counted_tokens']:,} tokens of {on}: it covers "
                   f"{100 * after:.1f} % of them (was {100 * before:.1f} %)")
    head_rec = step["importance"].get("head")
    if head_rec:
        what = (f"the target's lm_head rows ({head_rec['rows']:,} draft tokens, read at load)" if head_rec.get("shared")
                else f"rank {head_rec['rank']} factors ({head_rec['init']} init, weight error "
                     f"{100 * head_rec['weight_rel_error']:.1f} %)")
        click.echo(f"  draft head: {head_rec['params_before']:,} -> {head_rec['params_after']:,} parameters stored: "
                   f"{what}")
    if "agreement_before" in cal:
        click.echo(f"  calibration top-1 agreement {cal['agreement_before']:.3f} -> {cal['agreement_after']:.3f}, "
                   f"KL {cal['kl_before']:.4f} -> {cal['kl_after']:.4f} ({cal['tokens']} tokens, before recovery)")
    if recover_steps:
        last = pruned.provenance[-1]
        acc = " ".join(f"{a:.3f}" for a in last.get("agreement", []))
        click.echo(f"  recovered: {last.get('steps')} distillation steps, loss {last.get('final_loss', 0):.4f}, "
                   f"acc@k {acc}")


def say_legacy(config, shape, counts: dict[str, int]) -> None:  # noqa: ANN001 - PruneConfig, a drafter config
    """The deprecation warning for --ffn R / --heads R (shares to remove), with the count that says the same."""
    from specpress.errors import deprecated

    if isinstance(config.ffn, float):
        n = shape.intermediate_size
        deprecated(f"--ffn {config.ffn:g} (the share of FFN channels to remove)",
                   f"give the channels each layer keeps: --ffn {n - counts['ffn']} (of {n})")
    if config.heads is not None:
        n = shape.num_key_value_heads
        deprecated(f"--heads {config.heads:g} (the share of KV groups to remove)",
                   f"give the KV groups each attention keeps: --kv-heads {n - counts['heads']} (of {n})")
