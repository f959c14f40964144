"""Why a target with quantized activations is not exactly lossless under speculative decoding (issue 38).

    python bench/target_invariance.py --target ~/.cache/specpress/zoo/small --prompts prompts.jsonl \
        --specs none int8 fp8 nvfp4:activations=static --target-quant-data zoo:train

For each --target-quant spec: the same tokens' logits from one many-token forward (the shape a tree verify
runs) and from one-token cached steps (plain decoding), over the first --n prompts at positions
[--prefix, --prefix + --steps). Prints the largest logit difference and how many argmaxes differ. Float and
weight-only targets differ only by fp32 rounding of the two kernel shapes; a scheme that quantizes
activations rounds those inputs to its grid, so a rounding-sized difference can move a value by a whole
grid step and the logits by far more. That is why `run`, `bench` and the sweep compute such a target in float64
around its quantizers (compress/quantize/target.py `exact_emulation`): this script measures the target as they
do, and with --fp32 as it was computed before (the gap the lossless check used to trip on).
"""

from __future__ import annotations

import argparse
import json

import torch

from specpress.compress.quantize.target import parse_target_quant
from specpress.models.target import load_target
from specpress.compress.quantize.target import calibration_stream, compressed_copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--specs", nargs="+", default=["none", "int8", "fp8"])
    ap.add_argument("--target-quant-data", default=None)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--fp32", action="store_true", help="compute the compressed target in fp32 throughout")
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = load_target(args.target, dtype="fp32").eval()
    with open(args.prompts) as f:
        prompts = [json.loads(line)["input_ids"] for line in f][:args.n]
    end = args.prefix + args.steps
    stream = None if args.target_quant_data is None else calibration_stream(args.target_quant_data, args.target,
                                                                            target)
    for spec in args.specs:
        tq = parse_target_quant(spec)
        model = target if tq.is_float else compressed_copy(target, tq, stream if tq.needs_data() else None)[0]
        if args.fp32:
            model = model.float()  # the same codes and scales; the float arithmetic back in fp32
        worst, flips, n = 0.0, 0, 0
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p[:end]])
                full = model(ids, cache=model.new_cache(end, 1)).logits[0]  # a verify pass writes the cache too
                cache = model.new_cache(end, 1)
                model(ids[:, :args.prefix], cache=cache)
                for i in range(args.prefix, end):
                    step = model(ids[:, i:i + 1], cache=cache).logits[0, -1]
                    worst = max(worst, (step - full[i]).abs().max().item())
                    flips += int(step.argmax() != full[i].argmax())
                    n += 1
        dtype = str(model.lm_head.weight.dtype).removeprefix("torch.")
        print(f"{spec:28s} {dtype:8s} max |logit difference| {worst:.2e}   argmax differs {flips}/{n}")


if __name__ == "__main__":
    main()
