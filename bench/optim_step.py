"""Cost of one optimizer step for a distilled drafter, three ways interleaved in one process: torch's Muon +
per-tensor AdamW (what the zoo build uses), torch's Muon + fused AdamW (distill until session 8), and
GroupedMuon + fused AdamW (what `distill` uses).

    OMP_NUM_THREADS=2 python bench/optim_step.py --target ~/.cache/specpress/zoo/small --family dflash \
        --markov-rank 128 --steps 40

Gradients are random (the step's cost does not depend on their values); gradient clipping is included, as
in distill. Prints the median milliseconds per step of each and the ratios to the last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from specpress.compress.config import DistillConfig
from specpress.compress.students import init_student
from specpress.models.target import load_target
from specpress.optim import MuonWithAdamW, build_optimizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--family", default="dflash")
    ap.add_argument("--markov-rank", type=int, default=None)
    ap.add_argument("--optimizer", default="muon", choices=("muon", "adamw"))
    ap.add_argument("--steps", type=int, default=40, help="timed steps of each (after 5 untimed)")
    a = ap.parse_args()

    target = load_target(a.target)
    target.requires_grad_(False)
    cfg = DistillConfig(family=a.family, steps=1, markov_rank=a.markov_rank, optimizer=a.optimizer)
    tokens = np.random.default_rng(0).integers(0, target.config.vocab_size, 20_000)
    student = init_student(cfg, target, tokens)
    params = [p for p in student.parameters() if p.requires_grad]

    def make(fused: bool):
        return build_optimizer(student.named_parameters(), a.optimizer, 1e-4, 0.0, (0.9, 0.95), fused=fused)

    opts = {"unfused": make(False), "fused": make(True)}
    if a.optimizer == "muon":  # torch's Muon beside the fused AdamW: what GroupedMuon alone saves
        plain, fused = make(False), make(True)
        assert isinstance(plain, MuonWithAdamW) and isinstance(fused, MuonWithAdamW)
        opts = {"unfused": opts["unfused"], "fused_adamw_torch_muon": MuonWithAdamW(plain.parts[0], fused.parts[1]),
                "fused": opts["fused"]}
    gen = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {name: [] for name in opts}
    for i in range(5 + a.steps):
        for name, opt in opts.items():  # interleaved: all see the same machine state
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen) * 1e-3
            t0 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i >= 5:
                times[name].append((time.perf_counter() - t0) * 1000)
    med = {name: statistics.median(v) for name, v in times.items()}
    print(json.dumps({"family": a.family, "optimizer": a.optimizer, "trainable_params": sum(p.numel() for p in params),
                      "threads": torch.get_num_threads(), "steps": a.steps,
                      "median_ms": {k: round(v, 2) for k, v in med.items()},
                      "ratio_to_fused": {k: round(v / med["fused"], 2) for k, v in med.items()}}, indent=2))


if __name__ == "__main__":
    main()
