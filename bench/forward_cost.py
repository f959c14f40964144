"""What one target forward costs as it verifies more tokens: the ceiling on speculative speedup.

    OMP_NUM_THREADS=2 python bench/forward_cost.py --target ~/.cache/specpress/zoo/medium

For each dtype: median wall time (sizes interleaved) of one forward over N new tokens after a prefill, for N in --tokens,
and its ratio to the 1-token forward (plain decoding's step). A tree of N nodes cannot speed decoding
up by more than tau / that ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specpress.device import parse_dtype
from specpress.models.target import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--tokens", default="1,5,16,32")
    ap.add_argument("--prefill", type=int, default=200)
    ap.add_argument("--reps", type=int, default=45)
    args = ap.parse_args()
    sizes = [int(n) for n in args.tokens.split(",")]
    g = torch.Generator().manual_seed(0)
    for name in args.dtypes.split(","):
        model = load_target(args.target).to(parse_dtype(name)).eval()
        vocab = model.config.vocab_size
        times: dict[int, list[float]] = {n: [] for n in sizes}
        with torch.inference_mode():
            for rep in range(args.reps):  # sizes interleaved, so machine noise hits them alike
                for n in sizes:
                    cache = model.new_cache(args.prefill + n)
                    model(torch.randint(0, vocab, (1, args.prefill), generator=g), cache=cache)
                    x = torch.randint(0, vocab, (1, n), generator=g)
                    t0 = time.perf_counter()
                    model(x, cache=cache)
                    if rep >= 5:  # the first reps warm up
                        times[n].append(time.perf_counter() - t0)
        ms = {n: statistics.median(t) * 1e3 for n, t in times.items()}
        base = ms[sizes[0]]
        print(f"{name}: " + "  ".join(f"{n} tok {v:.2f} ms ({v / base:.2f}x)" for n, v in ms.items()))


if __name__ == "__main__":
    main()
