"""How well each draft-head start fits the target BEFORE recovery, on held-out windows: KL(target || drafter)
and top-1 agreement of the first draft step on zoo:val, for the dense head, rank-R factors from plain and
from activation-aware SVD (covariance measured on zoo:train windows, so the fit is out of sample), and the
target's rows (shared head) read through the drafter's own final norm or through the target's.

    python bench/head_fit.py --target ~/.cache/specpress/zoo/small --drafter runs/base/eagle3 --ranks 32 64 128
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    from specpress.compress.head import head_input_covariance
    from specpress.compress.importance import calibration_signals, calibration_windows, fit, make_probes
    from specpress.compress.prune import PruneConfig, prune
    from specpress.compress.data import data_stream
    from specpress.models.drafter_io import load_drafter
    from specpress.models.heads import factorise
    from specpress.models.target import load_target
    from specpress.models.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--ranks", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--batches", type=int, default=4, help="batches of 8 x 128-token windows, each of train / val")
    args = ap.parse_args()
    torch.manual_seed(0)
    target = load_target(args.target, device="cpu")
    d = load_drafter(args.drafter, target, device="cpu")
    tok = load_tokenizer(args.target)

    def probes_on(source: str, model):
        stream = data_stream(source, tok, target.config.eos_ids, target.config.vocab_size, args.target)
        windows, _ = calibration_windows(stream, 8, 128, 0, args.batches)
        return make_probes(model, calibration_signals(target, windows, model.taps))

    train, val = probes_on("zoo:train", d), probes_on("zoo:val", d)
    cov = head_input_covariance(d, train)
    w = d.lm_head.weight.detach()
    rows = {"dense": fit(d, val)}
    for r in args.ranks:
        for init, c in (("svd", None), ("activation", cov)):
            p = prune(d, PruneConfig(head_rank=r))
            down, up = factorise(w, r, c)
            with torch.no_grad():
                p.lm_head.down.weight.copy_(down)
                p.lm_head.up.weight.copy_(up)
            rows[f"rank {r} {init}"] = fit(p, val)
    shared = prune(d, PruneConfig(share_head=True))
    rows["shared, own norm"] = fit(shared, val)
    with torch.no_grad():
        shared.norm.weight.copy_(target.model.norm.weight)
    rows["shared, target's norm"] = fit(shared, val)
    print(json.dumps({k: {m: round(v, 4) for m, v in f.items()} for k, f in rows.items()}, indent=1))


if __name__ == "__main__":
    main()
