"""Speedup when the target is compiled too: the baseline `bench --compile` leaves out.

    OMP_NUM_THREADS=2 python bench/compile_both.py --target ~/.cache/specpress/zoo/medium \
        --drafter runs/speed/eagle3-t248-40m-v1024 --policy dynamic:depth=4,topk=2,budget=8 \
        --prompts runs/speed/prompts.jsonl --json runs/speed/compile-both.json

`bench --compile` compiles only the drafter, so its plain baseline is the eager target. Here the target
is compiled as well (Inductor, dynamic shapes), and the same bench then runs: each prompt decoded
speculatively and plainly with the one compiled target, interleaved, so the speedup compares a compiled
speculative decoder with a compiled plain decoder. Before timing, `--warmup` prompts are decoded in full
both ways so that every shape (one-token steps, prefills, verify trees) has been compiled.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specpress.runtime.bench import bench_speculative, load_bench_inputs, load_drafter_for
from specpress.runtime.plain import decode_plain
from specpress.runtime.policy import parse_policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--warmup", type=int, default=3, help="prompts decoded in full both ways before timing")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    target, prompts = load_bench_inputs(a.target, a.prompts, a.dtype)
    drafter = load_drafter_for(target, a.drafter)
    policy = parse_policy(a.policy)
    target.compile()  # automatic dynamic shapes; dynamic=True made the `taps` ints symbolic and lost the taps
    drafter.compile(dynamic=True)
    for p in prompts[:a.warmup]:
        decode_plain(target, p.ids, a.max_new_tokens)
    result = bench_speculative(target, drafter, prompts, a.max_new_tokens, policy, warmup_prompts=a.warmup,
                               config={"target": a.target, "drafter": a.drafter, "dtype": a.dtype,
                                       "compile": "target+drafter"})
    keys = ("tau", "speedup", "tokens_per_s", "baseline_tokens_per_s", "draft_ms", "draft_forward_ms", "verify_ms",
            "other_ms", "overhead_fraction", "lossless_mismatches")
    print(json.dumps({k: result[k] for k in keys}, indent=2))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
