"""Cost of distill's teacher forward (the target over one batch of windows, bf16 autocast), eager against
`--compile` (TorchInductor, fixed shapes), interleaved in one process; and how many of the teacher's top-1
tokens the compiled kernels' rounding changes.

    OMP_NUM_THREADS=2 python bench/teacher_forward.py --target ~/.cache/specpress/zoo/small --family dflash

The windows are random token ids of distill's default shape (the cost does not depend on their values);
the taps are the ones a default student of --family reads. Prints the compile time, the median
milliseconds of each and their ratio, and the top-1 agreement of the compiled teacher with the eager one.
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
from specpress.compress.teacher import Teacher, needed_taps
from specpress.models.target import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--family", default="dflash")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20, help="timed forwards of each (after 3 untimed)")
    a = ap.parse_args()

    target = load_target(a.target).requires_grad_(False).eval()
    cfg = DistillConfig(family=a.family, steps=1)
    tokens = np.random.default_rng(0).integers(1, target.config.vocab_size, 20_000)
    taps = needed_taps(init_student(cfg, target, tokens))
    ids = torch.from_numpy(np.random.default_rng(1).integers(1, target.config.vocab_size, (a.batch, a.seq_len)))
    teachers = {"eager": Teacher(target, taps), "compiled": Teacher(target, taps, compile=True)}

    def run(name: str):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return teachers[name].signals(0, ids)

    t0 = time.perf_counter()
    compiled = run("compiled")
    compile_s = time.perf_counter() - t0
    eager = run("eager")
    agree = float((compiled.logits.argmax(-1) == eager.logits.argmax(-1)).float().mean())
    times: dict[str, list[float]] = {name: [] for name in teachers}
    for i in range(3 + a.repeats):
        for name in teachers:  # interleaved: both see the same machine state
            t0 = time.perf_counter()
            run(name)
            if i >= 3:
                times[name].append((time.perf_counter() - t0) * 1000)
    med = {name: statistics.median(v) for name, v in times.items()}
    print(json.dumps({"family": a.family, "taps": list(taps), "windows": [a.batch, a.seq_len],
                      "threads": torch.get_num_threads(), "repeats": a.repeats,
                      "first_compiled_call_s": round(compile_s, 1),
                      "median_ms": {k: round(v, 1) for k, v in med.items()},
                      "compiled_over_eager": round(med["compiled"] / med["eager"], 3),
                      "top1_agreement_compiled_vs_eager": round(agree, 4)}, indent=2))


if __name__ == "__main__":
    main()
