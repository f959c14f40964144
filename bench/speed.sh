#!/usr/bin/env bash
# Wall-clock speedup on the medium zoo target (~27M params), where forwards, not framework overhead,
# dominate a CPU decode step. Distills one drafter per family in FAMILIES against it (DISTILL_MINUTES
# each, default 10, one at a time on both cores), then benches each family's policies at each dtype in
# DTYPES. Every bench decodes each prompt speculatively and plainly, interleaved in one process, so
# `speedup` is a same-run ratio; `overhead_fraction` is the loop's own share of a round (time outside
# the drafter's and the target's forwards).
#   specpress zoo build --size medium          # once, <= 60 min
#   bash bench/speed.sh [OUT]                  # OUT defaults to ./runs/speed
#   FAMILIES="eagle3 mtp" DTYPES=bf16 bash bench/speed.sh
#   POLICY=chain:3 FAMILIES=eagle bash bench/speed.sh     # one policy instead of the family's list
# Results: $OUT/<family>-<policy>-<dtype>.json; existing drafters are kept (delete one to redo it).
set -euo pipefail
OUT=${1:-runs/speed}
T=${T:-$HOME/.cache/specpress/zoo/medium}
MIN=${DISTILL_MINUTES:-10}
N=${PROMPTS:-100}
NEW=${MAX_NEW:-64}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "$OUT"
declare -A EXTRA=([mtp]="--ttt-steps 3" [lm]="--layers 2")
declare -A POLICIES=(
  [eagle3]="chain:3 chain:4 dynamic:depth=4,topk=4,budget=12 dynamic:depth=6,topk=8,budget=32"
  [eagle]="chain:3 chain:4 dynamic:depth=4,topk=4,budget=12"
  [lm]="chain:3 chain:4"
  [mtp]="mtp:3"
  [dflash]="block:4 block:8")
[ -f "$OUT/prompts.jsonl" ] || specpress prompts --target "$T" --n "$N" --tokens 64 --out "$OUT/prompts.jsonl"
for fam in ${FAMILIES:-eagle3}; do
  # shellcheck disable=SC2086
  [ -d "$OUT/$fam" ] || specpress distill --target "$T" --family "$fam" --data zoo:train --out "$OUT/$fam" \
      --minutes "$MIN" ${EXTRA[$fam]:-} > "$OUT/distill-$fam.log" 2>&1
  for dtype in ${DTYPES:-fp32 bf16}; do
    for policy in ${POLICY:-${POLICIES[$fam]}}; do
      name=$(echo "$policy" | tr -c 'a-z0-9\n' '-')
      echo "== $fam $policy $dtype"
      specpress bench --target "$T" --drafter "$OUT/$fam" --policy "$policy" --dtype "$dtype" \
          --prompts "$OUT/prompts.jsonl" --max-new-tokens "$NEW" --json "$OUT/$fam-$name-$dtype.json" --force \
          2>&1 | tail -2 | head -1
    done
  done
done
