"""Load a drafter exported with `specpress export hf --for ENGINE` in that engine, on a GPU, and draft with it.

    python bench/serve_check.py --engine vllm --target T --export E --prompts P.jsonl --max-new-tokens 64 --json R
    python bench/serve_check.py ... --plan      # print the engine call it would make and exit (no engine needed)

Without a CUDA device it stops after reading the prompts and planning the call, with `error: ... needs a GPU`
(exit 1), which bench/gpu_check.sh --dry-run records as NEEDS-GPU.

Greedy generation through the engine's own offline API (vLLM `LLM`, SGLang `Engine`, TensorRT-LLM `LLM`) with the
export as its drafter, then the same prompts without speculation: the outputs must be equal (the verifier keeps
greedy decoding lossless, so a mismatch means the engine runs another target or dtype path, which the JSON
shows), and tau (tokens per target forward) is read from the engine's own counters where it reports them. The
engine, its speculative settings and the taps come from the export's config.json (`specpress.exported_as`) and
the serve command `export hf` printed. Written for bench/gpu_check.sh; it has never run here (no GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def read_prompts(path: Path, tokenizer_dir: Path, n: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    out = []
    for line in path.read_text().splitlines()[:n]:
        row = json.loads(line)
        out.append(row["input_ids"] if "input_ids" in row else tok.encode(row["prompt"]).ids)
    return out


def plan(engine: str, target: str, export: Path, tokens: int) -> dict[str, Any]:
    """The engine's constructor arguments for the export (the same settings as the serve command)."""
    cfg = json.loads((export / "config.json").read_text())
    family = cfg["specpress"]["family"]
    if engine == "vllm":
        method = {"eagle3": "eagle3", "dflash": "dflash", "eagle": "eagle", "lm": "draft_model"}[family]
        return {"model": target, "speculative_config": {"model": str(export), "method": method,
                                                        "num_speculative_tokens": tokens},
                "enforce_eager": True, "gpu_memory_utilization": 0.3, "max_model_len": 1024}
    if engine == "sglang":
        algo = {"eagle3": "EAGLE3", "eagle": "EAGLE", "dflash": "DFLASH", "lm": "STANDALONE"}[family]
        kw: dict[str, Any] = {"model_path": target, "speculative_algorithm": algo,
                              "speculative_draft_model_path": str(export), "mem_fraction_static": 0.3}
        if family == "dflash":
            kw["speculative_num_draft_tokens"] = cfg["block_size"]
        else:
            kw.update(speculative_num_steps=tokens, speculative_eagle_topk=1, speculative_num_draft_tokens=tokens + 1)
        if "quantization_config" in cfg:
            kw["speculative_draft_model_quantization"] = "compressed-tensors"
        return kw
    decoding = {"eagle3": "Eagle3", "dflash": "DFlash", "lm": "DraftTarget"}[family]
    spec = {"decoding_type": decoding, "max_draft_len": tokens, "speculative_model": str(export)}
    taps = cfg.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
    if family == "eagle3" and taps is not None:
        spec["eagle3_layers_to_capture"] = sorted(taps)
    return {"model": target, "speculative_config": spec}


def run_vllm(kw: dict[str, Any], prompts: list[list[int]], max_new: int, spec: bool) -> tuple[list[list[int]], float]:
    from vllm import LLM, SamplingParams

    args = dict(kw) if spec else {k: v for k, v in kw.items() if k != "speculative_config"}
    llm = LLM(**args)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=max_new))
    tau = float("nan")
    if spec:
        m = {x.name: x for x in llm.get_metrics()}
        drafts, acc = m.get("vllm:spec_decode_num_drafts"), m.get("vllm:spec_decode_num_accepted_tokens")
        if drafts is not None and acc is not None and drafts.value:
            tau = 1 + acc.value / drafts.value
    return [list(o.outputs[0].token_ids) for o in outs], tau


def run_sglang(kw: dict[str, Any], prompts: list[list[int]], max_new: int, spec: bool):
    import sglang

    args = dict(kw) if spec else {"model_path": kw["model_path"], "mem_fraction_static": kw["mem_fraction_static"]}
    eng = sglang.Engine(**args)
    try:
        res = eng.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": max_new})
    finally:
        eng.shutdown()
    verify = sum(r["meta_info"].get("spec_verify_ct", 0) for r in res)
    done = sum(r["meta_info"]["completion_tokens"] for r in res)
    return [r["output_ids"] for r in res], (done / verify if spec and verify else float("nan"))


def run_trtllm(kw: dict[str, Any], prompts: list[list[int]], max_new: int, spec: bool):
    from tensorrt_llm import LLM, SamplingParams

    args = dict(kw) if spec else {"model": kw["model"]}
    llm = LLM(**args)
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_new, temperature=0.0))
    return [list(o.outputs[0].token_ids) for o in outs], float("nan")


RUN = {"vllm": run_vllm, "sglang": run_sglang, "trtllm": run_trtllm}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=list(RUN), required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--export", required=True, type=Path)
    ap.add_argument("--prompts", type=Path)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=3, help="speculative tokens per round")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plan", action="store_true", help="print the engine's arguments and exit")
    a = ap.parse_args(argv)
    kw = plan(a.engine, a.target, a.export, a.tokens)
    if a.plan:
        print(json.dumps({"engine": a.engine, "arguments": kw}, indent=1))
        return 0
    if a.prompts is None:
        ap.error("--prompts is required unless --plan")
    prompts = read_prompts(a.prompts, Path(a.target), a.n)
    import torch

    if not torch.cuda.is_available():  # gpu_check.sh --dry-run records this as NEEDS-GPU: all above was checked
        print(json.dumps({"engine": a.engine, "arguments": kw, "prompts": len(prompts)}, indent=1), flush=True)
        print(f"error: loading the export in {a.engine} needs a GPU (no CUDA device here)", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    plain, _ = RUN[a.engine](kw, prompts, a.max_new_tokens, spec=False)
    spec, tau = RUN[a.engine](kw, prompts, a.max_new_tokens, spec=True)
    result = {"engine": a.engine, "arguments": kw, "prompts": len(prompts), "tau": tau,
              "mismatches": sum(p != s for p, s in zip(plain, spec, strict=True)),
              "seconds": round(time.perf_counter() - t0, 1)}
    print(json.dumps(result))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return 0 if result["mismatches"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
