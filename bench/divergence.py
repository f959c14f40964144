"""Where a speculative run left plain greedy decoding, and by how much the target's choice won there.

    python bench/divergence.py --target ~/.cache/specpress/zoo/medium --prompts runs/speed/prompts.jsonl \
        --bench-json runs/speed/eagle3-chain-4-bf16.json --dtype bf16

For each prompt whose speculative output differs from plain greedy decoding at --dtype, prints the first
differing position, the margin logit[plain token] - logit[speculative token] of the plain run's
one-token step there (at --dtype), and the same margin from an fp32 forward. Margins of one rounding
step of the dtype mean a numerical near-tie between the one-token and the many-token kernels, not a
fault in the accept rule.
"""

from __future__ import annotations

import argparse
import json

import torch

from specpress.device import parse_dtype
from specpress.models.target import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--bench-json", required=True)
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    outputs = json.load(open(args.bench_json))["outputs"]
    prompts = [json.loads(line)["input_ids"] for line in open(args.prompts) if line.strip()]
    low = load_target(args.target).to(parse_dtype(args.dtype)).eval()
    ref = load_target(args.target).eval()
    n_diff = 0
    with torch.inference_mode():
        for k, (prompt, spec) in enumerate(zip(prompts, outputs)):
            cache = low.new_cache(len(prompt) + len(spec) + 1)
            logits = low(torch.tensor([prompt]), cache=cache, logits="last").logits[0, -1].float()
            plain: list[int] = []
            for i, s in enumerate(spec):
                t = int(logits.argmax())
                plain.append(t)
                if t != s:
                    full = ref(torch.tensor([prompt + plain[:-1]]), logits="last").logits[0, -1]
                    print(f"prompt {k} position {i}: plain {t}, speculative {s}; {args.dtype} margin "
                          f"{float(logits[t] - logits[s]):.4f} (largest |logit| {float(logits.abs().max()):.1f}); "
                          f"fp32 margin {float(full[t] - full[s]):+.4f}")
                    n_diff += 1
                    break
                logits = low(torch.tensor([[t]]), cache=cache, logits="last").logits[0, -1].float()
    print(f"{n_diff} of {len(outputs)} prompts differ")


if __name__ == "__main__":
    main()
