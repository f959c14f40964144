"""How much of the target's greedy output a reduced draft vocabulary can propose, by how it is ranked.

    OMP_NUM_THREADS=2 python bench/vocab_coverage.py --target ~/.cache/specpress/zoo/small --keep 1024

Decodes the held-out prompts greedily with the target (what a drafter must propose at T=0), then ranks
the vocabulary by the target's greedy predictions on growing samples of the calibration data (the windows
`prune --vocab` draws) and by the raw token frequency of the whole data, and prints the share of the
greedy output each `--keep`-token vocabulary contains. A drafter cannot propose a token outside it.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from specpress.compress.data import encode_stream, read_texts
from specpress.compress.importance import vocab_count_stream
from specpress.compress.students import draft_vocab_by_frequency
from specpress.models.target import load_target
from specpress.models.tokenizer import load_tokenizer
from specpress.runtime.backends.torch.runner import TorchTarget
from specpress.runtime.heldout import heldout_code_prompts
from specpress.runtime.plain import decode_plain


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", default="zoo:train")
    ap.add_argument("--keep", type=int, default=1024)
    ap.add_argument("--counts", default="2048,16384,131072,262144,524288")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()
    target = load_target(args.target).eval()
    tok = load_tokenizer(args.target)
    v = target.config.vocab_size
    out: list[int] = []
    for p in heldout_code_prompts(tok, args.prompts, 64):
        out += decode_plain(TorchTarget(target), p.ids, args.new_tokens).tokens
    greedy = np.asarray(out)
    stream = encode_stream(read_texts(args.data), tok, target.config.eos_ids[0])

    def coverage(ids: torch.Tensor) -> float:
        return float(np.isin(greedy, ids.numpy()).mean())

    print(f"{len(greedy)} greedy tokens of the target on {args.prompts} held-out prompts; vocabulary {v} -> {args.keep}")
    for n in (int(x) for x in args.counts.split(",")):
        preds = vocab_count_stream("target", target, stream, 8, 128, 0, n)
        print(f"ranked on {len(preds):>9,} target predictions: coverage {coverage(draft_vocab_by_frequency(preds, v, args.keep)):.2%}")
    print(f"ranked on {len(stream):>9,} data tokens (all):    coverage {coverage(draft_vocab_by_frequency(stream, v, args.keep)):.2%}")


if __name__ == "__main__":
    main()
