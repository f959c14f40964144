#!/usr/bin/env bash
# Issue 37 part 1: the choices `quantize --recover-steps` makes, on the zoo EAGLE-3 drafter with the draft head
# quantized too, judged by quantize's own held-out acc@k (teacher-forced agreement with the target on the 5 %
# of zoo:train it holds out; no decoding): symmetric vs asymmetric int3 / int2 (round to nearest, no recovery),
# GPTQ vs round to nearest, learned vs rederived scales, and the recovery's learning rate (int2, STEPS steps each).
#   OMP_NUM_THREADS=2 PYTHONPATH=. bash bench/recovery_choices.sh DRAFTER OUT [STEPS]
# prints one line per run: its name, the weight SQNR line, acc@k after, and the recovery line.
set -euo pipefail
D=$1
OUT=$2
STEPS=${3:-150}
T=${T:-$HOME/.cache/specpress/zoo/small}
SP=${SPECPRESS:-specpress}
mkdir -p "$OUT"
run() {
  local name=$1
  shift
  local t0=$SECONDS
  $SP quantize --drafter "$D" --out "$OUT/$name" --target "$T" --data zoo:train --include lm_head --force "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name ($((SECONDS - t0)) s): $(grep -h 'SQNR' "$OUT/$name.log" | tr -s ' ') |$(grep -h 'acc@k after' \
    "$OUT/$name.log" | cut -d'(' -f1 | tr -s ' ') |$(grep -h 'recovered' "$OUT/$name.log" | tr -s ' ')"
}
for s in int3 int2; do
  run "$s-sym" --scheme "$s" --symmetric
  run "$s-asym" --scheme "$s" --asymmetric
done
run ternary --scheme ternary
for s in int3 int2 ternary; do run "$s-gptq" --scheme "$s" --method gptq; done
run "int2-r$STEPS-learned" --scheme int2 --recover-steps "$STEPS" --recover-scales learned
run "int2-r$STEPS-rederived" --scheme int2 --recover-steps "$STEPS" --recover-scales rederived
run "int2-r$STEPS-lr3e-4" --scheme int2 --recover-steps "$STEPS" --recover-lr 3e-4
run "int2-r$STEPS-lr1e-3" --scheme int2 --recover-steps "$STEPS" --recover-lr 1e-3
