"""`specpress run` and `specpress bench`: the options parsed, then decode/run_pipeline.py and
decode/bench_pipeline.py."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specpress.commands.options import TARGET_FORMS, TARGET_PATH

from specpress.commands.target_quant import target_quant_options
from specpress.runtime.backends import READS, backends, names
from specpress.decode.bench_pipeline import COMPILE_WARMUP_PROMPTS  # noqa: F401 - re-exported

TEMPERATURE = click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
                           help="0 = greedy; >0 samples from the target's (processed) distribution.")
TOP_K = click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0 = off.")
TOP_P = click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True)
SEED = click.option("--seed", type=int, default=0, show_default=True, help="Seed for sampling.")
DTYPE = click.option("--dtype", "--target-dtype", "dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32",
                     show_default=True,
                     help="Dtype the target is loaded in (once, memory-mapped when stored in it). fp32 by default: "
                          "the lossless reference, every speculative output equal to plain greedy decoding; bf16 "
                          "halves the target's memory (an 8B target: 16 GB instead of 32) and may differ from plain "
                          "decoding at ties of the bf16 logits. --target-dtype is the same option (its name in the "
                          "commands that also have an output dtype).")
TARGET = click.option("--target", "target_dir", required=True, type=TARGET_PATH,
                      help="Target model directory (HF format: config.json + model.safetensors)." + TARGET_FORMS)
DRAFTER = click.option("--drafter", "drafter_dir", type=click.Path(path_type=Path), default=None,
                       help="Drafter artifact directory (for a backend that runs an exported drafter, the export "
                            "directory: see --backend); without it the target decodes alone.")
POLICY = click.option("--policy", default=None, metavar="P",
                      help="chain:K | tree:[[0],[0,0],[1],...] | dynamic:depth=D,topk=K,budget=N | block:B | "
                           "mtp:K  [default: chain:4; mtp:3 for mtp; block:8 for dflash]")
STRICT = click.option("--strict", is_flag=True,
                      help="Refuse a drafter built for a different target (default: warn and run).")
COMPILE = click.option("--compile", "compile_drafter", is_flag=True,
                       help="Compile the drafter's forward with torch.compile (Inductor, dynamic shapes). The "
                            "target stays eager (unless bench --compile-target), so bench's plain baseline is "
                            "unchanged. The first rounds compile (tens of seconds on CPU); bench warms up on 3 "
                            "prompts before timing.")
COMPILE_TARGET = click.option("--compile-target", is_flag=True,
                              help="Compile the target's forward too (Inductor, automatic dynamic shapes): the "
                                   "plain baseline and the verify forwards then run the same compiled target. "
                                   "3 prompts are decoded both ways before timing.")
COMPARE = click.option("--compare-drafter", "compare_dir", type=click.Path(path_type=Path), default=None,
                       help="A second drafter decoding every prompt in the same interleave (plain, --drafter, "
                            "this; reversed on odd prompts): the JSON's `compare` holds its metrics and both "
                            "drafters' median forward and round ms per round, with the ratio this / --drafter, "
                            "and `paired`: the mean per-prompt tau of this minus --drafter's, with its 95 % "
                            "bootstrap CI.")
COMPARE_BACKEND = click.option("--compare-backend", type=click.Choice(names()), default=None,
                               help="Backend of --compare-drafter  [default: --backend]; e.g. --backend torch "
                                    "--compare-backend onnxruntime times one drafter on both.")
BACKEND = click.option("--backend", type=click.Choice(names()), default="torch", show_default=True,
                       help="Where the drafter runs (the target: --target-backend); --drafter is then "
                            + "; ".join(f"for {b.name}: {READS[b.reads]}" for b in backends().values())
                            + " (a drafter artifact is exported to ONNX on demand, once, into the cache).")
TARGET_BACKEND = click.option("--target-backend", type=click.Choice(names(runs_target=True)), default="torch",
                              show_default=True,
                              help="Where the target runs (plain decoding and verification): torch, or onnxruntime "
                                   "over its `specpress export target` graph, exported once into the cache. With "
                                   "--backend onnxruntime too, the whole loop runs in onnxruntime. fp32 or fp16.")


def DECODING(fn):  # noqa: N802 - used as a decorator like the option constants above
    """The decoding options `run` and `bench` share: policy, sampling, seed, dtype."""
    for option in (DTYPE, SEED, TOP_P, TOP_K, TEMPERATURE, POLICY):
        fn = option(fn)
    return fn


@click.command()
@TARGET
@DRAFTER
@click.option("--prompt", required=True, help="Prompt text (encoded with the target's tokenizer.json).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@DECODING
@BACKEND
@TARGET_BACKEND
@target_quant_options("decode against it (at temperature 0 the float target's greedy continuation is decoded too, "
                      "to say how many leading tokens the two share)")
@COMPILE
@STRICT
def run(target_dir: Path, drafter_dir: Path | None, prompt: str, max_new_tokens: int, policy: str | None,
        temperature: float, top_k: int, top_p: float, seed: int, dtype: str, backend: str, target_backend: str,
        target_quant: str | None, target_quant_data: str | None, compile_drafter: bool, strict: bool) -> None:
    """Decode one prompt and print the prompt and its continuation (stderr: a tau / speed line).

    \b
    Examples:
      specpress run --target ~/.cache/specpress/zoo/small --prompt "def parse_args(" --max-new-tokens 48
      specpress run --target ~/.cache/specpress/zoo/small --drafter ./eagle3 --policy chain:4 --prompt "import os"
      specpress run --target ~/.cache/specpress/zoo/small --drafter ./eagle3 --target-quant fp8 --prompt "import os"
    """
    from specpress.decode.run_pipeline import run_decode, run_request, stats_line

    req = run_request(target_dir, prompt, max_new_tokens, drafter_dir=drafter_dir, policy=policy,
                      temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, dtype=dtype, backend=backend,
                      target_backend=target_backend, target_quant=target_quant, target_quant_data=target_quant_data,
                      compile_drafter=compile_drafter, strict=strict)
    res = run_decode(req, echo=lambda m: click.echo(m, err=True))
    click.echo(res.output)
    click.echo(stats_line(res), err=True)


@click.command()
@TARGET
@DRAFTER
@click.option("--prompts", "prompts_file", required=True, type=click.Path(path_type=Path),
              help='JSON lines: {"prompt": "text"} or {"input_ids": [..]} per line.')
@click.option("--max-new-tokens", type=click.IntRange(min=1), required=True)
@DECODING
@BACKEND
@COMPILE
@COMPILE_TARGET
@COMPARE
@COMPARE_BACKEND
@TARGET_BACKEND
@target_quant_options("bench against it: the lossless check is against its own plain decoding; the same drafter "
                      "is then benched on the float target too (twice the decoding), and the JSON adds "
                      "target_quant, float_target, target_paired (paired delta tau vs the float target), "
                      "target_retention and target_agreement (the two targets' greedy continuations: prefix "
                      "agreement, exact matches; README)")
@STRICT
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              type=click.Path(path_type=Path, allow_dash=True),
              help="Write the full metrics object (outputs and per-prompt rows included) to FILE; bare --json (or -) "
                   "prints it on stdout. Without it, stdout gets the object without outputs and per_prompt.")
@click.option("--force", is_flag=True, help="Replace an existing --json file.")
def bench(target_dir: Path, drafter_dir: Path | None, prompts_file: Path, max_new_tokens: int, policy: str | None,
          temperature: float, top_k: int, top_p: float, seed: int, dtype: str, backend: str,
          compile_drafter: bool, compile_target: bool, compare_dir: Path | None, compare_backend: str | None,
          target_backend: str, target_quant: str | None, target_quant_data: str | None, strict: bool,
          json_out: Path | None, force: bool) -> None:
    """Decode every prompt of a file and report acceptance (tau, AR[k]), tokens/s and speedup.

    With --drafter, each prompt is decoded speculatively AND plainly, interleaved in this process, so
    `speedup` compares like with like; at temperature 0 every speculative output is checked against
    plain greedy decoding (`lossless_mismatches` must be 0). Without a drafter this measures plain
    target decoding (tau = 1); its outputs equal transformers' greedy generate.

    --json writes one object: tau (tokens per target verify forward, bonus included), ar (P(accepted
    >= k)), histogram, draft_ms / verify_ms / other_ms (mean per round), draft_forward_ms (the drafter's
    own compute within a round), overhead_ms and overhead_fraction (the loop's own time outside the
    drafter's and the target's forwards, and its share of a round), tokens_per_s,
    baseline_tokens_per_s, speedup, lossless_mismatches, drafter_bytes, per_prompt, outputs and config.
    A drafter with a reduced draft vocabulary (EAGLE-3) adds eval_coverage, the share of the emitted
    tokens its vocabulary holds, and calibration_coverage, the share `prune --vocab` recorded on its
    ranking data (null when no prune chose the vocabulary); bench warns when eval_coverage is more than
    3 points lower: the prompts differ from the ranking data (re-rank with prune --data PROMPTS.jsonl).
    Policies: chain:K, tree:[[0],[0,0],[1],...] (EAGLE / TensorRT-LLM eagle_choices; vLLM's tuple form
    parses too), dynamic:depth=D,topk=K,budget=N (EAGLE-2), block:B (DFlash), mtp:K.

    The drafter runs in fp32 whatever --dtype says (at one or two rows an fp32 matmul is faster than
    a bf16 one on CPU). At --dtype bf16 a few outputs may differ from plain greedy decoding at exact or
    one-step ties of the bf16 logits (the one-token and many-token kernels round differently;
    BENCHMARKS.md); fp32 is exactly lossless. --compile needs a C++ compiler; without one it fails
    with a message saying to drop it. Its speedup is against an eager plain decoder; add
    --compile-target to compile the target too (the like-for-like figure: the plain baseline and the
    verify forwards then run the same compiled target).

    \b
    Examples:
      specpress bench --target ~/.cache/specpress/zoo/small --prompts prompts.jsonl \\
          --max-new-tokens 64 --json plain.json
      specpress bench --target ~/.cache/specpress/zoo/small --drafter ./eagle3 \\
          --policy dynamic:depth=6,topk=8,budget=32 --prompts prompts.jsonl --max-new-tokens 64 --json e3.json
      specpress bench --target ~/.cache/specpress/zoo/medium --drafter ./eagle3 --dtype bf16 --compile \\
          --policy dynamic:depth=4,topk=2,budget=8 --prompts prompts.jsonl --max-new-tokens 64 --json e3c.json
      specpress bench --target ~/.cache/specpress/zoo/medium --drafter ./eagle3 --compare-drafter ./eagle3-int8 \\
          --dtype bf16 --compile --compile-target --prompts prompts.jsonl --max-new-tokens 64 --json cmp.json
      specpress bench --target ~/.cache/specpress/zoo/medium --drafter onnx/eagle3 --backend onnxruntime \\
          --target-backend onnxruntime --prompts prompts.jsonl --max-new-tokens 64 --json all-ort.json
      specpress bench --target ~/.cache/specpress/zoo/small --drafter ./eagle3 --prompts prompts.jsonl \\
          --target-quant nvfp4:activations=static --target-quant-data zoo:train --max-new-tokens 64 --json t.json
    """
    from contextlib import ExitStack

    from rich.console import Console

    from specpress.artifacts import claim_output, write_json
    from specpress.decode.bench_pipeline import bench_request, run_bench

    req = bench_request(target_dir, prompts_file, max_new_tokens, drafter_dir=drafter_dir, policy=policy,
                        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, dtype=dtype, backend=backend,
                        compile_drafter=compile_drafter, compile_target=compile_target, compare_dir=compare_dir,
                        compare_backend=compare_backend, target_backend=target_backend, target_quant=target_quant,
                        target_quant_data=target_quant_data, strict=strict)
    to_file = json_out is not None and json_out != Path("-")
    with ExitStack() as stack:
        if to_file:  # before decoding: a bad path must not cost the measurement; held until it is written
            stack.enter_context(claim_output(json_out, force=force, kind="file", flag="--json",
                                             inputs={"--target": target_dir, "--prompts": prompts_file,
                                                     "--drafter": drafter_dir, "--compare-drafter": compare_dir}))
        console = Console(stderr=True)
        result = run_bench(req, console=console)
        report(console, result)
        if to_file:
            write_json(json_out, result)  # claimed (and its directory made) before the work
            console.print(f"wrote {json_out}")
    if json_out is not None and not to_file:
        click.echo(json.dumps(result, indent=2))
    elif json_out is None:
        click.echo(json.dumps({k: v for k, v in result.items() if k not in ("outputs", "per_prompt")}, indent=2))


def report(console, result: dict, n_prompts: int | None = None, pol=None) -> None:
    """bench's summary lines (bench_pipeline.summary_lines) on stderr, as text (no rich markup). With
    n_prompts and pol: only the measurement's lines (bench_pipeline.bench_lines), for a result without config."""
    from specpress.decode.bench_pipeline import bench_lines, summary_lines

    for line in summary_lines(result) if n_prompts is None else bench_lines(result, n_prompts, pol):
        console.print(line, markup=False)
