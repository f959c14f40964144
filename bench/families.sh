#!/usr/bin/env bash
# Distill one drafter per family against the zoo target and measure greedy acceptance (tau) and
# speedup on held-out third-party Python code. Results: $OUT/<family>-<policy>.json.
#   bash bench/families.sh [OUT]        (OUT defaults to ./runs/families)
# Budget per distillation: DISTILL_MINUTES (default 10). Runs the distillations one after another with
# both cores (bf16 autocast, distill's default), so the whole script takes ~5 x DISTILL_MINUTES plus the
# benchmarks. Existing drafter directories are kept (delete one to redo it).
set -euo pipefail
OUT=${1:-runs/families}
T=${T:-$HOME/.cache/specpress/zoo/small}
MIN=${DISTILL_MINUTES:-10}
N=${PROMPTS:-100}
NEW=${MAX_NEW:-64}
mkdir -p "$OUT"
sp() { OMP_NUM_THREADS=2 specpress "$@"; }
distill() {  # family extra-args...
  local fam=$1; shift
  [ -d "$OUT/$fam" ] || sp distill --target "$T" --family "$fam" --data zoo:train --out "$OUT/$fam" \
      --minutes "$MIN" "$@" > "$OUT/distill-$fam.log" 2>&1   # a later --minutes wins
}
distill eagle3
distill dflash
distill mtp --ttt-steps 3
distill eagle
distill lm --layers 2
# Every family runs its distill defaults (eagle3: Muon at lr 2e-3 since 2026-11-30; the others AdamW at 1e-3).
# dflash's defaults give tau ~2 at block:8; its best known recipe (regenerated data, Markov head) is recipes/dflash.yaml.
[ -f "$OUT/prompts.jsonl" ] || specpress prompts --target "$T" --n "$N" --tokens 64 --out "$OUT/prompts.jsonl"
bench() {  # family policy name
  OMP_NUM_THREADS=2 specpress bench --target "$T" --drafter "$OUT/$1" --policy "$2" --prompts "$OUT/prompts.jsonl" \
      --max-new-tokens "$NEW" --json "$OUT/$3.json" --force  # a rerun re-measures
}
bench eagle3 chain:4 eagle3-chain4
bench eagle3 "dynamic:depth=6,topk=8,budget=32" eagle3-dynamic
bench eagle chain:4 eagle-chain4
bench dflash block:8 dflash-block8
bench mtp mtp:3 mtp-3
bench lm chain:4 lm-chain4
