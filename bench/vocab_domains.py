"""Draft-vocabulary pruning under domain shift: rank on one kind of code, evaluate on another.

    python bench/vocab_domains.py run --target ~/.cache/specpress/zoo/small \
        --drafter ~/.cache/specpress/drafters/eagle3-docs --out runs/vocab-domains
    python bench/vocab_domains.py table runs/vocab-domains

`run` writes two evaluation prompt sets and four ranking sources under OUT/data, prunes the drafter's
draft vocabulary to 1/4 and 1/2 on each source with `specpress prune --vocab` (exactly the command a
user runs), then decodes every drafter (the base and the eight pruned ones) on both prompt sets with
the same target in one process and records per-prompt τ, the share of the target's greedy output that
the draft vocabulary holds (what it emits at T=0, every run being lossless) and lossless mismatches
against plain greedy decoding. Everything already written is kept on a rerun.

- evaluation `stdlib`: 100 prompts from the zoo's validation files (stdlib modules neither the target
  nor the drafter trained on, the origin of their training data): in-domain;
- evaluation `thirdparty`: the default held-out prompts (click, rich, yaml, safetensors, tokenizers,
  onnx, numpy): code of another origin;
- ranking `stdlib`: the training corpus (zoo:train), prune's usual calibration data;
- ranking `thirdparty`: the source of other installed packages (RANK_PACKAGES, none of them evaluated);
- ranking `mix`: both of the above (about half the tokens each);
- ranking `traffic`: TRAFFIC_PROMPTS prompts cut from RANK_PACKAGES, given to prune as a prompts file,
  so it ranks on the target's own greedy continuations of them (`prune --data PROMPTS.jsonl`).

`table` prints the markdown table: τ retention (pooled τ ÷ the base's on the same prompts) and the paired
Δτ with its 95 % bootstrap CI over prompts (specpress.stats, as the sweep reports it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from specpress.compress.data import read_texts
from specpress.runtime.heldout import document_prompts, heldout_code_prompts, package_files

RANK_PACKAGES = ("networkx", "jinja2", "huggingface_hub", "pydantic", "accelerate", "anyio", "fsspec")
KEEP = (1024, 2048)  # of the drafter's 4096 draft tokens: 1/4 and 1/2
TRAFFIC_PROMPTS, TRAFFIC_TOKENS = 1024, 128
POLICY, NEW_TOKENS = "dynamic:depth=6,topk=8,budget=32", 64
SOURCES = {"stdlib": ["zoo:train"], "thirdparty": ["data/rank-thirdparty.jsonl"], "mix": ["data/rank-mix.jsonl"],
           "traffic": ["data/traffic-prompts.jsonl", "--continuation-tokens", str(TRAFFIC_TOKENS)]}
EVALS = ("stdlib", "thirdparty")


def _write_prompts(path: Path, prompts: list) -> None:
    path.write_text("".join(json.dumps({"input_ids": list(p.ids)}) + "\n" for p in prompts))


def prepare(out: Path, target: str, n_prompts: int) -> None:
    from specpress.models.tokenizer import load_tokenizer

    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(target)
    if not (data / "eval-stdlib.jsonl").is_file():
        _write_prompts(data / "eval-stdlib.jsonl", document_prompts(read_texts("zoo:val"), tok, n_prompts, 64))
    if not (data / "eval-thirdparty.jsonl").is_file():
        _write_prompts(data / "eval-thirdparty.jsonl", heldout_code_prompts(tok, n_prompts, 64))
    missing = [p for p in RANK_PACKAGES if not package_files([p])]
    if missing:
        raise SystemExit(f"ranking packages not installed: {', '.join(missing)}; pip install them first")
    third = [f.read_text(errors="replace") for f in package_files(RANK_PACKAGES)]
    if not (data / "rank-thirdparty.jsonl").is_file():
        (data / "rank-thirdparty.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in third))
    if not (data / "rank-mix.jsonl").is_file():
        (data / "rank-mix.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                     for t in third + read_texts("zoo:train")))
    if not (data / "traffic-prompts.jsonl").is_file():
        _write_prompts(data / "traffic-prompts.jsonl", document_prompts(third, tok, TRAFFIC_PROMPTS, 64, seed=1))


def run(args: argparse.Namespace) -> None:
    import torch

    from specpress.models.drafter_io import load_drafter
    from specpress.models.target import load_target
    from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
    from specpress.runtime.coverage import calibration_coverage, eval_coverage
    from specpress.runtime.loop import speculative_generate
    from specpress.runtime.plain import decode_plain
    from specpress.runtime.policy import parse_policy
    from specpress.runtime.prompts import load_prompts

    out = Path(args.out).resolve()
    prepare(out, args.target, args.prompts)
    names = ["base"] + [f"{s}-{k}" for s in SOURCES for k in KEEP]
    for s, extra in SOURCES.items():
        for k in KEEP:
            d = out / "drafters" / f"{s}-{k}"
            if not d.is_dir():
                subprocess.run([str(Path(sys.executable).parent / "specpress"), "prune", "--drafter", args.drafter, "--out",
                                str(d), "--vocab", str(k), "--target", args.target, "--data",
                                *[str(out / e) if e.startswith("data/") else e for e in extra]], check=True)
    target = load_target(args.target).eval()
    policy = parse_policy(POLICY)
    for ev in EVALS:
        res_path = out / f"results-{ev}.json"
        results = json.loads(res_path.read_text()) if res_path.is_file() else {}
        prompts = load_prompts(out / "data" / f"eval-{ev}.jsonl", None, target.config.vocab_size)
        with torch.inference_mode():
            plain = [decode_plain(TorchTarget(target), p.ids, NEW_TOKENS).tokens for p in prompts]
            for name in names:
                path = args.drafter if name == "base" else out / "drafters" / name
                drafter = load_drafter(path, target).eval()
                if name in results:  # coverage of the target's greedy output (= what it emits: lossless)
                    results[name]["eval_coverage"] = eval_coverage(plain, drafter_runner(drafter).token_map)
                    res_path.write_text(json.dumps(results))
                    continue
                gens = [speculative_generate(TorchTarget(target), drafter_runner(drafter), p.ids, NEW_TOKENS, policy)
                        for p in prompts]
                results[name] = {
                    "per_prompt_tau": [1 + sum(r.accepted for r in g.rounds) / len(g.rounds) for g in gens],
                    "rounds": sum(len(g.rounds) for g in gens),
                    "accepted": sum(r.accepted for g in gens for r in g.rounds),
                    "eval_coverage": eval_coverage(plain, drafter_runner(drafter).token_map),
                    "calibration_coverage": calibration_coverage(drafter.provenance),
                    "lossless_mismatches": sum(g.tokens != p for g, p in zip(gens, plain))}
                res_path.write_text(json.dumps(results))
                r = results[name]
                print(f"{ev} {name}: tau {1 + r['accepted'] / r['rounds']:.3f}, mismatches {r['lossless_mismatches']}",
                      flush=True)


def table(args: argparse.Namespace) -> None:
    from specpress.stats import paired_comparison

    print("| kept draft tokens | ranked on | evaluated on | τ (base → pruned) | retention | Δτ [95 % CI] "
          "| coverage: evaluation / calibration | lossless |")
    print("|---|---|---|---|---|---|---|---|")
    res = {ev: json.loads((Path(args.out) / f"results-{ev}.json").read_text()) for ev in EVALS}
    for k in KEEP:
        for s in SOURCES:
            for ev in EVALS:
                b, r = res[ev].get("base"), res[ev].get(f"{s}-{k}")
                if b is None or r is None:
                    continue
                tb, tp = 1 + b["accepted"] / b["rounds"], 1 + r["accepted"] / r["rounds"]
                p = paired_comparison(r["per_prompt_tau"], b["per_prompt_tau"])
                lo, hi = p["ci"]
                n = len(r["per_prompt_tau"])
                print(f"| {k} | {s} | {ev} | {tb:.3f} → {tp:.3f} | {100 * tp / tb:.1f} % | {p['delta_tau']:+.3f} "
                      f"[{lo:+.3f}, {hi:+.3f}] | {100 * r['eval_coverage']:.1f} / {100 * r['calibration_coverage']:.1f} % "
                      f"| {n - r['lossless_mismatches']} of {n} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", type=int, default=100)
    t = sub.add_parser("table")
    t.add_argument("out")
    args = ap.parse_args()
    run(args) if args.cmd == "run" else table(args)


if __name__ == "__main__":
    main()
