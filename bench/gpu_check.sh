#!/usr/bin/env bash
# One GPU check, prepared to run when an NVIDIA GPU machine is lent (no network, nothing installed):
#   bash bench/gpu_check.sh OUT                 # on the GPU machine; never run on one yet, so its time there is unmeasured
#   bash bench/gpu_check.sh OUT --dry-run       # the same steps on CPU at tiny sizes (a default test runs it)
# Steps: environment; CUDA/TensorRT-marked tests; a target (TARGET=dir carried, else ~/.cache/specpress/zoo/small,
# else `zoo build` capped at 3 min); an eagle3 drafter (DRAFTER=dir carried, else a 2-min distill); held-out
# prompts; the torch runtime in bf16 (speculative vs plain: tau, speedup, lossless check); the onnxruntime
# drafter (CUDA provider when present); the serving engines: an fp8 drafter exported `--for` vllm / sglang / trtllm,
# loaded and drafting in each engine that is installed (bench/serve_check.py); TensorRT: the plugin-form export,
# its engines and a bench through --backend tensorrt when standard TensorRT imports, else TensorRT for RTX's
# ahead-of-time build of the plugin probe.
# The dry run runs every one of those commands too: the same ones at tiny sizes, the engines built ahead of time
# by TensorRT for RTX (when installed), and the tensorrt bench and each engine's serve check up to where they need
# a GPU (status NEEDS-GPU: the command was taken and stopped with that message). Where it runs another command than
# the real run (a random target for `zoo build`, a one-step distill, an AOT engine build), step `cli` checks that
# the CLI accepts the real run's exact command line. A step whose tool is absent is SKIPPED with the reason; each
# step has its own log under OUT; the last thing printed is the table (also OUT/summary.md). PYTHON=... picks the
# interpreter. Exit status: 0 unless a step that ran failed.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash bench/gpu_check.sh OUT [--dry-run]" >&2; exit 2; }
OUT=$1; DRY=0; [ "${2:-}" = "--dry-run" ] && DRY=1
PY=${PYTHON:-python}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
: > "$OUT/steps.tsv"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SPX=("$PY" -c 'import sys; from specpress.cli import main; main(sys.argv[1:])')
spx() { "${SPX[@]}" "$@"; }

# step NAME SECONDS CMD...: run with a time limit, log to OUT/NAME.log, record ok/FAILED(rc) and seconds. In the
# dry run, a command that stops with specpress's "needs a GPU" error (exit 1) is recorded NEEDS-GPU, not failed.
step() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS rc=0
  echo "== $name"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || rc=$?
  local status=ok; [ "$rc" -ne 0 ] && status="FAILED(rc=$rc)"
  [ "$rc" -eq 124 ] && status="FAILED(timeout ${limit}s)"
  if [ $DRY -eq 1 ] && [ "$rc" -eq 1 ] && grep -q "^error: .*needs a GPU" "$OUT/$name.log"; then status=NEEDS-GPU; rc=0; fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" $((SECONDS - t0)) "$OUT/$name.log" >> "$OUT/steps.tsv"
  tail -n 3 "$OUT/$name.log"
  return "$rc"
}
# ACCEPTS, a Python program: `specpress ARGS` parses (every option, type, choice and required one), not run
export ACCEPTS='import sys, click
from specpress.cli import cli
cmd, args, parent, name = cli, sys.argv[1:], None, "specpress"
while isinstance(cmd, click.Group):
    parent = click.Context(cmd, info_name=name, parent=parent)
    name, args = args[0], args[1:]
    cmd = cmd.get_command(parent, name)
    if cmd is None:
        sys.exit(f"error: no command {name!r}")
try:
    cmd.make_context(name, list(args), parent=parent)
except click.UsageError as exc:
    sys.exit(f"error: {exc.format_message()}: specpress {chr(32).join(sys.argv[1:])}")
print("accepted: specpress", " ".join(sys.argv[1:]))'
REAL=()  # the real run's command lines the dry run replaces, checked by step `cli`
accepts_real() { REAL+=("$(printf '%q ' "$@")"); }
skip() { printf '%s\tSKIPPED\t0\t%s\n' "$1" "$2" >> "$OUT/steps.tsv"; echo "== $1: skipped ($2)"; }
has() { "$PY" -c "$1" > /dev/null 2>&1; }

if [ $DRY -eq 1 ]; then
  MAXNEW=6; NPROMPTS=1; PTOKENS=16; POLICY=chain:2; DTYPE=fp32  # bf16 on CPU is many times slower
  TRT_DRY=(--flavour tensorrt_rtx --target-gpu sm86 --max-tree 16 --max-context 64)  # AOT: builds without a GPU
else
  MAXNEW=64; NPROMPTS=20; PTOKENS=64; POLICY=dynamic:depth=6,topk=8,budget=32; DTYPE=bf16
  has "import torch; assert torch.cuda.is_available()" || { echo "no CUDA device: use --dry-run" >&2; exit 2; }
fi

step env 120 "$PY" - <<'EOF'
import importlib.util, json, platform, torch
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "capability": "sm%d%d" % torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None}
for mod in ("triton", "onnxruntime", "tensorrt", "tensorrt_rtx", "bitsandbytes"):
    info[mod] = importlib.util.find_spec(mod) is not None
if info["onnxruntime"]:
    import onnxruntime
    info["ort_providers"] = onnxruntime.get_available_providers()
print(json.dumps(info, indent=1))
EOF

# CUDA-marked (gpu) and TensorRT-marked (trt) tests; rc 5 = none selected here. SKIP_TESTS=1: the test
# suite's own run of this script (it runs those tests itself)
if [ "${SKIP_TESTS:-0}" = 1 ]; then skip tests "SKIP_TESTS=1"; else step tests 300 bash -c "'$PY' -m pytest -q -p no:cacheprovider -m 'gpu or trt' tests; rc=\$?; [ \$rc -eq 5 ] && rc=0; exit \$rc"; fi

TGT=${TARGET:-}
if [ -z "$TGT" ] && [ $DRY -eq 0 ] && [ -f "$HOME/.cache/specpress/zoo/small/config.json" ]; then
  TGT=$HOME/.cache/specpress/zoo/small
fi
if [ -n "$TGT" ]; then
  printf 'target\tok\t0\t%s (carried)\n' "$TGT" >> "$OUT/steps.tsv"
elif [ $DRY -eq 1 ]; then
  TGT=$OUT/zoo-tiny
  accepts_real zoo build --minutes 3 --out "$OUT/zoo-small"
  step target 300 "$PY" - "$TGT" <<'EOF'
# a random 8-layer Llama (hidden 128, head size 64 as TensorRT for RTX's fp16 kernels want) with a BPE trained
# on specpress's own sources: built here, in seconds
import sys
from pathlib import Path
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from specpress.models.target import TargetConfig, TargetModel, save_target
text = [p.read_text() for p in sorted(Path("specpress/runtime").glob("*.py"))]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel()
tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=512, special_tokens=["<eos>", "<unk>"]))
torch.manual_seed(0)
cfg = TargetConfig(vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=128, num_hidden_layers=8,
                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, eos_token_id=0)
save_target(TargetModel(cfg).eval(), Path(sys.argv[1]), extra_files={"tokenizer.json": tok.to_str()})
print(f"built a random tiny target (vocab {cfg.vocab_size}) with its tokenizer")
EOF
else
  TGT=$OUT/zoo-small
  step target 240 "${SPX[@]}" zoo build --minutes 3 --out "$TGT"
fi

DRF=${DRAFTER:-}
if [ -n "$DRF" ]; then
  printf 'drafter\tok\t0\t%s (carried)\n' "$DRF" >> "$OUT/steps.tsv"
elif [ $DRY -eq 1 ]; then
  DRF=$OUT/eagle3
  accepts_real distill --target "$TGT" --family eagle3 --data zoo:train --out "$DRF" --minutes 2 --force
  step drafter 300 "${SPX[@]}" distill --target "$TGT" --family eagle3 --data specpress/runtime --out "$DRF" \
      --steps 1 --batch 1 --seq-len 16 --force
else
  DRF=$OUT/eagle3
  step drafter 180 "${SPX[@]}" distill --target "$TGT" --family eagle3 --data zoo:train --out "$DRF" --minutes 2 --force
fi

step prompts 120 "${SPX[@]}" prompts --target "$TGT" --n $NPROMPTS --tokens $PTOKENS --out "$OUT/prompts.jsonl"

BENCH=(--target "$TGT" --drafter "$DRF" --prompts "$OUT/prompts.jsonl" --max-new-tokens $MAXNEW --policy "$POLICY")
step bench_torch 240 "${SPX[@]}" bench "${BENCH[@]}" --dtype $DTYPE --json "$OUT/bench_torch.json"

if ! spx bench --help 2>/dev/null | grep -q onnxruntime; then
  skip bench_onnxruntime "no onnxruntime backend in this build"
elif ! spx export onnx --help > /dev/null 2>&1; then
  skip bench_onnxruntime "no \`export onnx\` in this build"
elif [ $DRY -eq 0 ] && ! has "import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers()"; then
  skip bench_onnxruntime "onnxruntime has no CUDA provider on this machine"
else
  step export_onnx 180 "${SPX[@]}" export onnx --drafter "$DRF" --target "$TGT" --out "$OUT/onnx" --dtype fp32 \
    && step bench_onnxruntime 240 "${SPX[@]}" bench "${BENCH[@]}" --backend onnxruntime --drafter "$OUT/onnx" \
        --json "$OUT/bench_onnxruntime.json"
fi

# Serving engines: the drafter quantized as all three load it (fp8; fc in float for SGLang), exported for each
# engine (`export hf --for`) and, on a GPU machine where the engine is installed, loaded there and drafting: outputs
# equal to the engine's own plain greedy decoding, tau from its counters. The dry run runs the same exports and the
# same bench/serve_check.py command, which stops before the engine with "needs a GPU" (NEEDS-GPU).
step quantize_fp8 180 "${SPX[@]}" quantize --drafter "$DRF" --out "$OUT/eagle3-fp8" --scheme fp8 --exclude fc --force
for ENG in vllm sglang trtllm; do
  MOD=$ENG; [ "$ENG" = trtllm ] && MOD=tensorrt_llm
  step "export_hf_$ENG" 120 "${SPX[@]}" export hf --drafter "$OUT/eagle3-fp8" --out "$OUT/served-$ENG" --for "$ENG" \
      --target "$TGT" --force || continue
  step "serve_plan_$ENG" 60 "$PY" bench/serve_check.py --engine "$ENG" --target "$TGT" --export "$OUT/served-$ENG" --plan
  if [ $DRY -eq 0 ] && ! has "import $MOD"; then
    skip "serve_$ENG" "$MOD is not installed (pip install vllm==0.34.0 / sglang==0.5.23 / tensorrt-llm on this machine)"
  else
    step "serve_$ENG" 600 "$PY" bench/serve_check.py --engine "$ENG" --target "$TGT" --export "$OUT/served-$ENG" \
        --prompts "$OUT/prompts.jsonl" --n $NPROMPTS --max-new-tokens $MAXNEW --json "$OUT/serve_$ENG.json"
  fi
done

# TensorRT: on the GPU, standard TensorRT builds engines for it and the bench runs them; the dry run builds the same
# engines ahead of time with TensorRT for RTX and runs the same bench up to the GPU (NEEDS-GPU)
if has "import tensorrt; tensorrt.Builder" && [ $DRY -eq 0 ]; then TRT=tensorrt
elif has "import tensorrt_rtx; tensorrt_rtx.Builder"; then TRT=tensorrt_rtx
else TRT=; fi
if [ -n "$TRT" ] && { [ $DRY -eq 1 ] || [ $TRT = tensorrt ]; }; then
  TRT_ARGS=(export trt --onnx "$OUT/onnx-plugin" --out "$OUT/engines" --force)
  [ $DRY -eq 1 ] && accepts_real "${TRT_ARGS[@]}"
  step export_onnx_plugin 180 "${SPX[@]}" export onnx --drafter "$DRF" --target "$TGT" --out "$OUT/onnx-plugin" \
      --attention plugin --dtype fp16 --force \
    && step export_trt 300 "${SPX[@]}" "${TRT_ARGS[@]}" ${TRT_DRY[@]+"${TRT_DRY[@]}"} \
    && step bench_tensorrt 240 "${SPX[@]}" bench "${BENCH[@]}" --backend tensorrt --drafter "$OUT/engines" --dtype fp16 \
        --json "$OUT/bench_tensorrt.json"
fi
if [ "$TRT" = tensorrt_rtx ]; then
  # TensorRT for RTX builds ahead of time without a device: the plugin probe proves parser + plugin + builder
  step export_trt_probe 180 "${SPX[@]}" export trt --probe --out "$OUT/engine-probe" --target-gpu sm86 \
      --flavour tensorrt_rtx --force
elif [ -z "$TRT" ]; then
  skip export_trt "neither tensorrt nor tensorrt_rtx imports (pip install 'specpress[trt]' or '[trt-rtx]')"
fi

if [ $DRY -eq 1 ]; then  # the real run's command lines this dry run replaced: the CLI must accept each
  step cli 120 bash -c 'for c in "$@"; do eval "set -- $c"; "$0" -c "$ACCEPTS" "$@" || exit 2; done' "$PY" "${REAL[@]}"
fi

"$PY" - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| step | status | s | tau | speedup | tok/s | draft ms/round | lossless mismatches | note |")
print("|---|---|---|---|---|---|---|---|---|")
for line in (out / "steps.tsv").read_text().splitlines():
    name, status, secs, note = line.split("\t")
    res = out / f"{name}.json"
    cells = ["", "", "", "", ""]
    if name.startswith("serve_") and res.is_file():  # the engine's tau (nan where it reports none), mismatches
        m = json.loads(res.read_text())
        cells = [f"{m['tau']:.3f}", "", "", "", str(m["mismatches"])]
        note = m["engine"]
    elif name.startswith("bench_") and res.is_file():
        m = json.loads(res.read_text())
        cells = [f"{m['tau']:.3f}", f"{m['speedup']:.2f}", f"{m['tokens_per_s']:.1f}", f"{m['draft_ms']:.2f}",
                 str(m["lossless_mismatches"])]
        note = f"{m.get('config', {}).get('dtype', '')} {m.get('config', {}).get('backend', '')}".strip() or note
    print(f"| {name} | {status} | {secs} | " + " | ".join(cells) + f" | {note} |")
EOF
! grep -q "FAILED" "$OUT/steps.tsv"
