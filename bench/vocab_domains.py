"""Draft-vocabulary pruning under domain shift: rank on one kind of code, evaluate on another.

    python bench/vocab_domains.py prepare --target ~/.cache/specpress/zoo/small \
        --drafter ~/.cache/specpress/drafters/eagle3-docs --out runs/vocab-domains
    for r in runs/vocab-domains/recipes/*.yaml; do specpress sweep $r --out runs/vocab-domains/runs/$(basename $r .yaml); done
    python bench/vocab_domains.py table runs/vocab-domains

`prepare` writes two evaluation prompt sets and four ranking sources, and one sweep recipe per
(ranking source, evaluation set), each pruning the draft vocabulary to 1/4 and 1/2 (paired against the
unpruned base over the same prompts):

- evaluation `stdlib`: 100 prompts from the zoo's validation files (stdlib modules the target and the
  drafter never trained on, but the same origin as their training data): in-domain for the drafter;
- evaluation `thirdparty`: the default held-out prompts (click, rich, yaml, safetensors, tokenizers,
  onnx, numpy): code of another origin;
- ranking `stdlib`: the training corpus (zoo:train), what `prune --vocab` used by default in the recipes;
- ranking `thirdparty`: the source of other installed packages (RANK_PACKAGES, none of them in the
  evaluation set), about as many tokens as zoo:train;
- ranking `mix`: both of the above together (about half each);
- ranking `traffic`: the target's own greedy continuations (TRAFFIC_TOKENS each) of TRAFFIC_PROMPTS prompts
  cut from RANK_PACKAGES — what `prune --data PROMPTS.jsonl` ranks on for a user's traffic — written as
  one tokenized .jsonl line that the sweep reads as data.

`table` prints one markdown table of every finished sweep under OUT/runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specpress.compress.data import read_texts
from specpress.runtime.heldout import document_prompts, heldout_code_prompts, package_files

RANK_PACKAGES = ("networkx", "jinja2", "huggingface_hub", "pydantic", "accelerate", "anyio", "fsspec")
KEEP = (1024, 2048)  # of the drafter's 4096 draft tokens: 1/4 and 1/2
TRAFFIC_PROMPTS, TRAFFIC_TOKENS = 1024, 128

RECIPE = """# written by bench/vocab_domains.py prepare: rank on {rank}, evaluate on {eval}
name: vocab-{rank}-on-{eval}
target: {target}
drafter: {drafter}
grid:
  - prune: {{vocab: [{keep}]}}
policies: ["dynamic:depth=6,topk=8,budget=32"]
prompts: {prompts}
temperatures: [0]
backends: [torch]
max_new_tokens: 64
seed: 0
float_dtype: auto
calibration: {calibration}
agreement_batches: 0
"""


def _write_prompts(path: Path, prompts: list) -> None:
    path.write_text("".join(json.dumps({"input_ids": list(p.ids)}) + "\n" for p in prompts))


def _rank_texts() -> list[str]:
    missing = [p for p in RANK_PACKAGES if not package_files([p])]
    if missing:
        raise SystemExit(f"ranking packages not installed: {', '.join(missing)}; pip install them first")
    return [f.read_text(errors="replace") for f in package_files(RANK_PACKAGES)]


def prepare(args: argparse.Namespace) -> None:
    """Writes what is missing under OUT (a rerun after an interruption keeps what is there)."""
    from specpress.compress.traffic import traffic_stream
    from specpress.models.target import load_target
    from specpress.models.tokenizer import load_tokenizer

    out = Path(args.out)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    (out / "recipes").mkdir(exist_ok=True)
    tok = load_tokenizer(args.target)
    evals = {"stdlib": lambda: document_prompts(read_texts("zoo:val"), tok, args.prompts, 64, seed=0),
             "thirdparty": lambda: heldout_code_prompts(tok, args.prompts, 64, seed=0)}
    for name, make in evals.items():
        if not (data / f"eval-{name}.jsonl").is_file():
            _write_prompts(data / f"eval-{name}.jsonl", make())
    third = _rank_texts()
    if not (data / "rank-thirdparty.jsonl").is_file():
        (data / "rank-thirdparty.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in third))
    if not (data / "rank-mix.jsonl").is_file():
        (data / "rank-mix.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                     for t in third + read_texts("zoo:train")))
    if not (data / "rank-traffic.jsonl").is_file():
        _write_prompts(data / "traffic-prompts.jsonl", document_prompts(third, tok, TRAFFIC_PROMPTS, 64, seed=1))
        stream, record = traffic_stream(load_target(args.target).eval(), data / "traffic-prompts.jsonl", tok,
                                        TRAFFIC_TOKENS)
        (data / "rank-traffic.jsonl").write_text(json.dumps({"input_ids": stream.tolist()}) + "\n")
        print(f"traffic: {record['prompts']} prompts, {record['generated']} tokens generated, {len(stream)} in all")
    ranks = {"stdlib": "zoo-train", "thirdparty": "data/rank-thirdparty.jsonl", "mix": "data/rank-mix.jsonl",
             "traffic": "data/rank-traffic.jsonl"}
    for rank, cal in ranks.items():
        for ev in evals:
            (out / "recipes" / f"{rank}-on-{ev}.yaml").write_text(RECIPE.format(
                rank=rank, eval=ev, target=args.target, drafter=args.drafter, keep=", ".join(map(str, KEEP)),
                prompts=f"../data/eval-{ev}.jsonl", calibration=cal if cal.startswith("zoo") else f"../{cal}"))
    print(f"wrote {len(ranks) * len(evals)} recipes under {out / 'recipes'}")


def table(args: argparse.Namespace) -> None:
    rows = []
    for res in sorted(Path(args.out, "runs").glob("*/results.jsonl")):
        rank, ev = res.parent.name.split("-on-")
        recs = [json.loads(ln) for ln in res.read_text().splitlines() if ln.strip()]
        base = next((r for r in recs if r["point"] == "base" and r.get("status") == "ok"), None)
        for r in recs:
            if r["point"] == "base" or r.get("status") != "ok" or base is None:
                continue
            keep = r["steps"][0]["prune"]["vocab"]
            p = r["paired"]
            rows.append((keep, rank, ev, base["tau"], r["tau"], r["retention"], p["delta_tau"], p["ci"],
                         r.get("eval_coverage"), r.get("calibration_coverage"), r["bytes"], base["bytes"]))
    print("| kept draft tokens | ranked on | evaluated on | τ base → pruned | retention | Δτ [95 % CI] "
          "| coverage eval / calibration |")
    print("|---|---|---|---|---|---|---|")
    for keep, rank, ev, tb, tp, ret, d, ci, cov, cal in (r[:10] for r in sorted(rows)):
        print(f"| {keep} | {rank} | {ev} | {tb:.3f} → {tp:.3f} | {100 * ret:.1f} % | {d:+.3f} "
              f"[{ci[0]:+.3f}, {ci[1]:+.3f}] | {100 * cov:.1f} / {100 * cal:.1f} % |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", type=int, default=100)
    t = sub.add_parser("table")
    t.add_argument("out")
    args = ap.parse_args()
    prepare(args) if args.cmd == "prepare" else table(args)


if __name__ == "__main__":
    main()
