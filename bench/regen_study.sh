#!/usr/bin/env bash
# Target-regenerated training data and DSpark's Markov head: regenerate zoo:train prompts with the
# target, distill drafters on that data with bench/families.sh's budget, and bench them on the same
# held-out prompts as families.sh (compare with its JSON). Results: $OUT/<name>-<policy>.json.
#   bash bench/regen_study.sh [OUT] [FAMILIES_OUT]   (defaults ./runs/regen, ./runs/families)
# DISTILL_MINUTES (default 10) per drafter; one job at a time with both cores (~150 minutes in all).
# Existing outputs are kept (delete one to redo it).
set -euo pipefail
OUT=${1:-runs/regen}
FAM=${2:-runs/families}
T=${T:-$HOME/.cache/specpress/zoo/small}
MIN=${DISTILL_MINUTES:-10}
NEW=${MAX_NEW:-64}
REGEN=$OUT/regen.jsonl
mkdir -p "$OUT" "$FAM"
sp() { OMP_NUM_THREADS=2 specpress "$@"; }
[ -f "$REGEN" ] || sp regenerate --target "$T" --data zoo:train --out "$REGEN" \
    --sequences 6144 --prompt-tokens 48 --new-tokens 128 --batch 128 > "$OUT/regenerate.log" 2>&1
[ -f "$FAM/prompts.jsonl" ] || python bench/make_prompts.py --target "$T" --n 100 --tokens 64 --out "$FAM/prompts.jsonl"
distill() {  # name data family extra-args...
  local name=$1 data=$2 fam=$3; shift 3
  [ -d "$OUT/$name" ] || sp distill --target "$T" --family "$fam" --data "$data" --out "$OUT/$name" \
      --minutes "$MIN" "$@" > "$OUT/distill-$name.log" 2>&1
}
bench() {  # name policy tag
  sp bench --target "$T" --drafter "$OUT/$1" --policy "$2" --prompts "$FAM/prompts.jsonl" \
      --max-new-tokens "$NEW" --json "$OUT/$1-$3.json" > "$OUT/bench-$1-$3.log" 2>&1
}
distill dflash "$REGEN" dflash
bench dflash block:8 block8
distill eagle3 "$REGEN" eagle3
bench eagle3 chain:4 chain4
bench eagle3 "dynamic:depth=6,topk=8,budget=32" dynamic
distill dflash-markov128 "$REGEN" dflash --markov-rank 128
bench dflash-markov128 block:8 block8
distill dflash-markov128-t258-a32 "$REGEN" dflash --markov-rank 128 --taps 2,5,8 --anchors 32
bench dflash-markov128-t258-a32 block:8 block8
distill dflash-markov128-zoo zoo:train dflash --markov-rank 128
bench dflash-markov128-zoo block:8 block8
distill dflash-markov128-lr2 "$REGEN" dflash --markov-rank 128 --lr 2e-3
bench dflash-markov128-lr2 block:8 block8
distill dflash-markov128-lr4 "$REGEN" dflash --markov-rank 128 --lr 4e-3
bench dflash-markov128-lr4 block:8 block8
distill dflash-markov128-muon2 "$REGEN" dflash --markov-rank 128 --lr 2e-3 --optimizer muon
bench dflash-markov128-muon2 block:8 block8
distill dflash-markov256-muon2 "$REGEN" dflash --markov-rank 256 --lr 2e-3 --optimizer muon
bench dflash-markov256-muon2 block:8 block8
MIN=$((2 * MIN)) distill dflash-markov128-20m "$REGEN" dflash --markov-rank 128   # twice the budget
bench dflash-markov128-20m block:8 block8
