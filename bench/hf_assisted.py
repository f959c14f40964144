"""specpress vs Hugging Face assisted generation: same target, same `lm` drafter, same prompts, greedy.

Both run in this process, interleaved prompt by prompt (alternating which goes first), single thread
count as set. Reports tokens/s of each (median over prompts of per-prompt tokens/s, and total), their
ratio, and tokens per target forward for both (HF: new tokens / target forward calls, counted with a
hook; specpress: the same count, its prefill forward included), plus whether outputs are identical.

    python bench/hf_assisted.py --target ~/.cache/specpress/zoo/small --drafter DIR --k 4 \
        --prompts 40 --max-new-tokens 96 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True, help="an `lm` drafter directory (standalone HF Llama)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round (HF: constant schedule)")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from specpress.models.drafter_io import load_drafter
    from specpress.models.target import load_target
    from specpress.models.tokenizer import load_tokenizer
    from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
    from specpress.runtime.heldout import heldout_code_prompts
    from specpress.runtime.loop import speculative_generate
    from specpress.runtime.policy import parse_policy

    target = load_target(args.target)
    drafter = load_drafter(args.drafter, target)
    prompts = heldout_code_prompts(load_tokenizer(args.target), args.prompts, args.prompt_tokens)
    hf_t = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    hf_d = AutoModelForCausalLM.from_pretrained(args.drafter, dtype=torch.float32).eval()
    hf_d.generation_config.num_assistant_tokens = args.k
    hf_d.generation_config.num_assistant_tokens_schedule = "constant"
    hf_d.generation_config.assistant_confidence_threshold = 0.0
    for m in (hf_t, hf_d):  # no EOS stop on either side: both decode exactly n tokens
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    calls = [0]
    hf_t.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    policy = parse_policy(f"chain:{args.k}")
    n = args.max_new_tokens

    def run_hf(ids):
        calls[0] = 0
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf_t.generate(torch.tensor([list(ids)]), assistant_model=hf_d, max_new_tokens=n, do_sample=False,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        dt = time.perf_counter() - t0
        return out[0, len(ids):].tolist(), dt, calls[0]

    def run_sp(ids):
        t0 = time.perf_counter()
        g = speculative_generate(TorchTarget(target), drafter_runner(drafter), ids, n, policy, eos_ids=())
        return g.tokens, time.perf_counter() - t0, 1 + len(g.rounds)

    run_hf(prompts[0].ids)  # warm-up both
    run_sp(prompts[0].ids)
    rows = []
    for i, p in enumerate(prompts):
        order = (run_hf, run_sp) if i % 2 == 0 else (run_sp, run_hf)
        res = {fn.__name__: fn(p.ids) for fn in order}
        rows.append(res)
    same = sum(r["run_hf"][0] == r["run_sp"][0] for r in rows)
    tot = {k: (sum(len(r[k][0]) for r in rows), sum(r[k][1] for r in rows), sum(r[k][2] for r in rows))
           for k in ("run_hf", "run_sp")}
    med = {k: statistics.median(len(r[k][0]) / r[k][1] for r in rows) for k in ("run_hf", "run_sp")}
    result = {
        "prompts": len(rows), "k": args.k, "max_new_tokens": n, "threads": args.threads,
        "identical_outputs": same,
        "hf_tokens_per_s_total": tot["run_hf"][0] / tot["run_hf"][1],
        "specpress_tokens_per_s_total": tot["run_sp"][0] / tot["run_sp"][1],
        "hf_tokens_per_s_median": med["run_hf"], "specpress_tokens_per_s_median": med["run_sp"],
        "ratio_total": (tot["run_sp"][0] / tot["run_sp"][1]) / (tot["run_hf"][0] / tot["run_hf"][1]),
        "ratio_median": med["run_sp"] / med["run_hf"],
        "hf_tokens_per_target_forward": tot["run_hf"][0] / tot["run_hf"][2],
        "specpress_tokens_per_target_forward": tot["run_sp"][0] / tot["run_sp"][2],
    }
    result["tau_ratio"] = result["specpress_tokens_per_target_forward"] / result["hf_tokens_per_target_forward"]
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
