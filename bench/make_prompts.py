"""Write held-out evaluation prompts (third-party Python code, never seen in training) as JSON lines.

    python bench/make_prompts.py --target ~/.cache/specpress/zoo/small --n 100 --tokens 64 --out prompts.jsonl
"""

from __future__ import annotations

import argparse
import json

from specpress.models.tokenizer import load_tokenizer
from specpress.runtime.heldout import heldout_code_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    prompts = heldout_code_prompts(load_tokenizer(args.target), args.n, args.tokens, args.seed)
    with open(args.out, "w") as f:
        for p in prompts:
            f.write(json.dumps({"input_ids": list(p.ids)}) + "\n")
    print(f"wrote {len(prompts)} prompts of {args.tokens} tokens to {args.out}")


if __name__ == "__main__":
    main()
