"""The target in onnxruntime vs torch, plain and speculative, on the same prompts in one run.

For every prompt, each target decodes plainly and speculatively (the same drafter, given as an `export onnx`
directory run by the onnxruntime backend, or as a drafter artifact run by torch); the order of the targets
rotates per prompt. Targets: the torch target at each --torch-dtypes entry (compiled with
--compile-target) and the onnxruntime target (the fp32 `export target` graph; --target-export DIR, made
there when absent). Reported per target: plain ms per token and speculative ms per token (medians over
prompts), tau, speedup = plain / speculative ms per token of the same target (median of the per-prompt ratios),
and each target's medians as a ratio to the first torch
target. Checked: at temperature 0 every speculative output equals the same target's plain output, and the
share of prompts whose plain output equals the first torch target's is reported (fp32 vs bf16 differ at
near ties).

    python bench/onnx_target_speed.py --target T --drafter ONNX_DIR --prompts P.jsonl [--n 30]
        [--max-new-tokens 64] [--policy dynamic:depth=4,topk=2,budget=8] [--torch-dtypes fp32,bf16]
        [--compile-target] [--target-export DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--drafter", type=Path, required=True, help="an `export onnx` dir (or a drafter artifact: torch)")
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--policy", default="dynamic:depth=4,topk=2,budget=8")
    ap.add_argument("--torch-dtypes", default="fp32,bf16")
    ap.add_argument("--compile-target", action="store_true")
    ap.add_argument("--target-export", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    from specpress.export.ondemand import exported_target_for
    from specpress.export.target import export_target_from_dir
    from specpress.models.target import load_target
    from specpress.runtime.backends import is_drafter_artifact, load_runner
    from specpress.runtime.backends.onnxruntime.runner import load_target_runner
    from specpress.runtime.backends.torch.runner import TorchTarget
    from specpress.runtime.compile import compile_target
    from specpress.runtime.loop import speculative_generate
    from specpress.runtime.plain import decode_plain
    from specpress.runtime.policy import parse_policy
    from specpress.runtime.prompts import load_prompts

    targets: dict[str, object] = {}
    models = []
    for dt in a.torch_dtypes.split(","):
        t = load_target(a.target, dtype=dt)
        if a.compile_target:
            compile_target(t)
        models.append(t)
        targets[f"torch {dt}" + (" compiled" if a.compile_target else "")] = TorchTarget(t)
    if a.target_export is None:
        export_dir, _ = exported_target_for(a.target, progress=print)
    else:
        export_dir = a.target_export
        if not export_dir.is_dir():
            export_target_from_dir(a.target, export_dir, progress=print)
    targets["onnxruntime fp32"] = load_target_runner(export_dir)
    first = next(iter(targets.values()))
    backend = "torch" if is_drafter_artifact(a.drafter) else "onnxruntime"
    drafter = load_runner(backend, a.drafter, models[0] if backend == "onnxruntime" else load_target(a.target),
                          torch.device("cpu"))
    pol = parse_policy(a.policy)
    prompts = load_prompts(a.prompts, None, first.config.vocab_size)[: a.n]

    for t in targets.values():  # compiled targets meet their shapes untimed
        for p in prompts[:3] if a.compile_target else [prompts[0]]:
            decode_plain(t, p.ids, a.max_new_tokens)
            speculative_generate(t, drafter, p.ids, a.max_new_tokens, pol)
    names = list(targets)
    rows = {n: {"plain_ms_tok": [], "spec_ms_tok": [], "accepted": 0, "rounds": 0, "lossless_mismatches": 0,
                "plain_outputs": []} for n in names}
    for i, p in enumerate(prompts):
        order = names[i % len(names):] + names[: i % len(names)]
        for n in order:
            t, r = targets[n], rows[n]
            g = decode_plain(t, p.ids, a.max_new_tokens)
            s = speculative_generate(t, drafter, p.ids, a.max_new_tokens, pol)
            r["plain_ms_tok"].append(g.decode_ms / len(g.tokens))
            r["spec_ms_tok"].append(s.total_ms / len(s.tokens))
            r["accepted"] += sum(x.accepted for x in s.rounds)
            r["rounds"] += len(s.rounds)
            r["lossless_mismatches"] += int(s.tokens != g.tokens)
            r["plain_outputs"].append(g.tokens)
        print(f"prompt {i + 1}/{len(prompts)}", flush=True)
    base = rows[names[0]]
    out = {"config": {**{k: str(v) for k, v in vars(a).items()}, "drafter_backend": backend,
                      "threads": torch.get_num_threads()}, "targets": {}}
    b_plain, b_spec = statistics.median(base["plain_ms_tok"]), statistics.median(base["spec_ms_tok"])
    print(f"{'target':<24} {'plain ms/tok':>12} {'spec ms/tok':>12} {'tau':>6} {'speedup':>8} "
          f"{'plain x':>8} {'spec x':>8} {'same plain':>10} {'lossless':>8}")
    for n in names:
        r = rows[n]
        plain, spec = statistics.median(r["plain_ms_tok"]), statistics.median(r["spec_ms_tok"])
        same = sum(x == y for x, y in zip(r["plain_outputs"], base["plain_outputs"])) / len(prompts)
        res = {"plain_ms_per_token": plain, "spec_ms_per_token": spec, "tau": 1 + r["accepted"] / max(1, r["rounds"]),
               "speedup": statistics.median(x / y for x, y in zip(r["plain_ms_tok"], r["spec_ms_tok"])),
               "plain_vs_first": plain / b_plain, "spec_vs_first": spec / b_spec, "same_plain_output": same,
               "lossless_mismatches": r["lossless_mismatches"], "provider": getattr(targets[n], "provider", "torch")}
        out["targets"][n] = res
        print(f"{n:<24} {plain:>12.2f} {spec:>12.2f} {res['tau']:>6.2f} {res['speedup']:>7.2f}x "
              f"{res['plain_vs_first']:>7.2f}x {res['spec_vs_first']:>7.2f}x {same:>10.2f} {r['lossless_mismatches']:>8}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
