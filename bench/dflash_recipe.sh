#!/usr/bin/env bash
# Sessions 8-10: variations of the best 10-minute DFlash recipe of session 7 (Markov head of rank 128,
# lr 2e-3, Muon, target-regenerated data), each distilled with families.sh's budget and benched at
# block:8 on the same held-out prompts. Results: $OUT/<name>-block8.json.
#   bash bench/dflash_recipe.sh [OUT] [FAMILIES_OUT] [REGEN]
#   (defaults ./runs/dflash-recipe, ./runs/families, ./runs/regen/regen.jsonl from bench/regen_study.sh)
# Session 10's last rows train on three times the regenerated data: REGEN plus 12,288 more sequences
# drawn with --seed 1 (about 8 minutes), written beside REGEN as <stem>-x3.jsonl.
# DISTILL_MINUTES (default 10) per drafter; one job at a time with both cores (~12 minutes a row).
# Existing outputs are kept (delete one to redo it).
set -euo pipefail
OUT=${1:-runs/dflash-recipe}
FAM=${2:-runs/families}
REGEN=${3:-runs/regen/regen.jsonl}
T=${T:-$HOME/.cache/specpress/zoo/small}
MIN=${DISTILL_MINUTES:-10}
NEW=${MAX_NEW:-64}
mkdir -p "$OUT" "$FAM"
sp() { OMP_NUM_THREADS=2 specpress "$@"; }
[ -f "$REGEN" ] || sp regenerate --target "$T" --data zoo:train --out "$REGEN" \
    --sequences 6144 --prompt-tokens 48 --new-tokens 128 --batch 128
REGEN3=${REGEN%.jsonl}-x3.jsonl
if [ ! -f "$REGEN3" ]; then
  [ -f "${REGEN%.jsonl}-seed1.jsonl" ] || sp regenerate --target "$T" --data zoo:train \
      --out "${REGEN%.jsonl}-seed1.jsonl" --sequences 12288 --prompt-tokens 48 --new-tokens 128 --batch 128 --seed 1
  cat "$REGEN" "${REGEN%.jsonl}-seed1.jsonl" > "$REGEN3"
fi
[ -f "$FAM/prompts.jsonl" ] || python bench/make_prompts.py --target "$T" --n 100 --tokens 64 --out "$FAM/prompts.jsonl"
row() {  # name extra-distill-args...   (DATA=... to train on other data than $REGEN)
  local name=$1; shift
  local budget=(--minutes "$MIN"); [[ " $* " == *" --steps "* ]] && budget=()  # a fixed step count instead
  [ -d "$OUT/$name" ] || sp distill --target "$T" --family dflash --data "${DATA:-$REGEN}" --out "$OUT/$name" \
      "${budget[@]}" --markov-rank 128 --lr 2e-3 --optimizer muon "$@" > "$OUT/distill-$name.log" 2>&1
  [ -f "$OUT/$name-block8.json" ] || sp bench --target "$T" --drafter "$OUT/$name" --policy block:8 \
      --prompts "$FAM/prompts.jsonl" --max-new-tokens "$NEW" --json "$OUT/$name-block8.json" > "$OUT/bench-$name.log" 2>&1
}
row best                         # session 7's best recipe, again
row tv9 --tv-weight 0.9          # DSpark's loss: 0.1 CE + 0.9 L1
row taps258 --taps 2,5,8         # the final normed hidden among the fused taps
row layers1 --layers 1 --taps 2,6
row gamma2 --gamma 2             # weigh the first block positions more
row layers3 --layers 3
row gamma1 --gamma 1
row layers3-gamma1 --layers 3 --gamma 1
row gamma0.6 --gamma 0.6
row gamma1-again --gamma 1   # the same settings as gamma1: run-to-run spread
row gamma1-anchors32 --gamma 1 --anchors 32
# session 9: a softer decay and a higher learning rate, and the gamma1 control again
row gamma1.5 --gamma 1.5
row lr3e-3-gamma1 --lr 3e-3 --gamma 1      # a later --lr wins over the recipe's 2e-3
row gamma1-s9 --gamma 1
row lr3e-3-gamma1.5 --lr 3e-3 --gamma 1.5
row lr3e-3-gamma1-again --lr 3e-3 --gamma 1
# session 10: fewer anchors per window, hard labels (the data token), the control, then 3x the data
row lr3e-3-gamma1-anchors8 --lr 3e-3 --gamma 1 --anchors 8
row lr3e-3-gamma1-s10 --lr 3e-3 --gamma 1
row lr3e-3-gamma1-labels-data --lr 3e-3 --gamma 1 --labels data
DATA=$REGEN3 row lr3e-3-gamma1-x3 --lr 3e-3 --gamma 1
DATA=$REGEN3 row lr3e-3-gamma1-x3-seed1 --lr 3e-3 --gamma 1 --seed 1
DATA=$REGEN3 row lr3e-3-gamma1-x3-2322steps --lr 3e-3 --gamma 1 --steps 2322  # session 9's slowest run's steps
DATA=$REGEN3 row lr3e-3-gamma1-x3-3000steps --lr 3e-3 --gamma 1 --steps 3000  # one pass over the 3x data
# session 11: the 3x-data recipe again (the zoo target rebuilt), then fewer windows or anchors per step
DATA=$REGEN3 row lr3e-3-gamma1-x3-s11 --lr 3e-3 --gamma 1
DATA=$REGEN3 row lr3e-3-gamma1-x3-batch4 --lr 3e-3 --gamma 1 --batch 4
DATA=$REGEN3 row lr3e-3-gamma1-x3-anchors8 --lr 3e-3 --gamma 1 --anchors 8
DATA=$REGEN3 row lr3e-3-gamma1-x3-compile --lr 3e-3 --gamma 1 --compile    # the teacher's forward compiled
DATA=$REGEN3 row lr3e-3-gamma1-x3-2322steps-s11 --lr 3e-3 --gamma 1 --steps 2322  # session 9's slowest run, again
DATA=$REGEN3 row lr3e-3-gamma1-x3-2322steps-s11-seed1 --lr 3e-3 --gamma 1 --steps 2322 --seed 1  # another seed
