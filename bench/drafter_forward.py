"""Drafter forward time inside the speculative loop, two drafters alternating per prompt in one process.

    OMP_NUM_THREADS=2 python bench/drafter_forward.py --target ~/.cache/specpress/zoo/medium \
        --drafters runs/speed/eagle3-t248-muon40-v1024 runs/speed/eagle3-t248-muon40-v1024-int8 \
        --prompts runs/speed/prompts.jsonl            # add --eager to leave target and drafters uncompiled

Each drafter decodes the same prompts speculatively (greedy, `--policy`, bf16 target), in alternating
order per prompt, after `--warmup` prompts each; per prompt it records the drafter's forward time per
round (`draft_forward_ms`) and the whole round. Printed: medians over prompts and the ratio of each
drafter's median to the first's, all from this one run. By default target and drafters are compiled as
in bench/compile_both.py.
"""

from __future__ import annotations

import argparse
import statistics

from specpress.runtime.bench import load_bench_inputs, load_drafter_for
from specpress.runtime.loop import speculative_generate
from specpress.runtime.policy import parse_policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafters", nargs="+", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--policy", default="dynamic:depth=4,topk=2,budget=8")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--n", type=int, default=30, help="timed prompts")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--eager", action="store_true")
    a = ap.parse_args()

    target, prompts = load_bench_inputs(a.target, a.prompts, "bf16")
    drafters = [load_drafter_for(target, d) for d in a.drafters]
    policy = parse_policy(a.policy)
    if not a.eager:
        target.compile()
        for d in drafters:
            d.compile(dynamic=True)
    for p in prompts[:a.warmup]:
        for d in drafters:
            speculative_generate(target, d, p.ids, a.max_new_tokens, policy)
    forward: list[list[float]] = [[] for _ in drafters]
    round_ms: list[list[float]] = [[] for _ in drafters]
    for i, p in enumerate(prompts[a.warmup:a.warmup + a.n]):
        order = range(len(drafters)) if i % 2 == 0 else reversed(range(len(drafters)))
        for j in order:
            g = speculative_generate(target, drafters[j], p.ids, a.max_new_tokens, policy)
            forward[j].append(sum(r.draft_forward_ms for r in g.rounds) / len(g.rounds))
            round_ms[j].append(sum(r.draft_ms + r.verify_ms + r.other_ms for r in g.rounds) / len(g.rounds))
    base_f, base_r = statistics.median(forward[0]), statistics.median(round_ms[0])
    print(f"{'eager' if a.eager else 'compiled'}; medians over {a.n} prompts, ms per round")
    for name, f, r in zip(a.drafters, forward, round_ms):
        mf, mr = statistics.median(f), statistics.median(r)
        print(f"{name}: drafter forwards {mf:.2f} ({mf / base_f:.2f}x)  round {mr:.2f} ({mr / base_r:.2f}x)")


if __name__ == "__main__":
    main()
