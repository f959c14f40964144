"""Every command at a real architecture: a random Llama-3.2-1B-shaped target and an EAGLE-3 drafter for it,
made here (nothing downloaded), then each command's peak RSS and wall time, one at a time.

    python bench/real_scale.py make --out /work/runs/scale/1b            # target, drafter, data, prompts
    python bench/real_scale.py make --out /work/runs/scale/1b --big-drafter   # + a 3 GB fp32 drafter
    python bench/real_scale.py measure --dir /work/runs/scale/1b --repo . --label after \\
        --results /work/runs/scale/after.jsonl [--only distill,prune]

The target has Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads / 8 KV heads, FFN 8192, 128,256-token
vocabulary, tied embeddings, llama3 rope), bf16 in 3 safetensors shards, random weights (N(0, 0.02)); its
tokenizer is a 4,096-token byte-level BPE trained on the data (so every id the data holds is < 4,096). The
drafter is an EAGLE-3 drafter of hidden 2048 with a 32,000-token draft vocabulary, random fp32 weights (what
`distill` writes). `--big-drafter` adds one whose FFN is 107,000 wide: 3.0 GB in fp32, over protobuf's 2 GB.

The measured commands do less work than a study would (distill 4 steps, GPTQ 2 calibration batches, prune
4,096 ranked tokens, bench 2 prompts x 16 tokens): none of those counts changes what the command holds at its
peak (reached in distill's second step, GPTQ's widest group, prune's first forward, bench's first prompt), and
the machine this ran on was shared. `measure` runs each command as a child process (`PYTHONPATH=--repo`,
OMP_NUM_THREADS as set, else 1) and records the
child's peak RSS (wait4's ru_maxrss: resident pages, file-backed ones included) and wall time as one JSON
line; it refuses to start a command when MemAvailable is below its plan's peak (or, without `plan`, what it
peaked at before this work: NEED_GIB) + 2 GiB, or --min-free-gib. `specpress plan` is run on
the same command line first when the repo has it, and its prediction is recorded beside the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

LLAMA32_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "attention_bias": False, "bos_token_id": 0, "eos_token_id": 0,
    "torch_dtype": "bfloat16",
}
SHARDS = 3
# What each command peaked at before this work (issue #39), GiB: a run starts only with this much + 2 GiB free.
NEED_GIB = {"distill": 9.3, "quantize-rtn": 9.4, "quantize-gptq": 9.4, "prune": 8.3, "export-onnx-fp32": 8.6,
            "export-onnx-fp16": 9.5, "export-onnx-3gb": 14.0, "export-target": 15.7, "bench-torch": 7.3,
            "bench-ort": 13.4, "export-hf": 2.0}


def _data_text(min_bytes: int = 4_000_000) -> str:
    """Python source from this interpreter's stdlib, in sorted file order, up to `min_bytes`."""
    import sysconfig

    parts, n = [], 0
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            t = f.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(t)
        n += len(t)
        if n >= min_bytes:
            break
    return "\n".join(parts)


def make_target(out: Path, text: str) -> None:
    import torch
    from safetensors.torch import save_file

    from specpress.models.drafter import head_digest
    from specpress.models.target import TargetConfig, TargetModel
    from specpress.zoo.tokenizer import tokenizer_files, train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    cfg = TargetConfig.from_hf(LLAMA32_1B)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in TargetModel(cfg).state_dict().items() if k != "lm_head.weight"}
    gen = torch.Generator().manual_seed(0)
    names = list(shapes)
    per = -(-len(names) // SHARDS)
    weight_map = {}
    for s in range(SHARDS):
        shard = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        part = {}
        for k in names[s * per:(s + 1) * per]:
            shape = shapes[k]
            if k.endswith("norm.weight"):
                t = torch.ones(shape, dtype=torch.bfloat16)
            else:
                t = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
            part[k] = t
            weight_map[k] = shard
        save_file(part, str(out / shard), metadata={"format": "pt"})
        print(f"  wrote {shard} ({sum(t.numel() * 2 for t in part.values()) / 1e9:.2f} GB)", flush=True)
        del part
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(LLAMA32_1B, indent=2))
    tok = train_tokenizer([text[i:i + 100_000] for i in range(0, len(text), 100_000)], 4096)
    for name, content in tokenizer_files(tok, model_max_length=4096).items():
        (out / name).write_text(content)
    from safetensors import safe_open

    with safe_open(str(out / weight_map["model.norm.weight"]), "pt") as f:
        norm = f.get_tensor("model.norm.weight")
    with safe_open(str(out / weight_map["model.embed_tokens.weight"]), "pt") as f:
        head = f.get_tensor("model.embed_tokens.weight")
    (out / "head_digest.txt").write_text(head_digest(norm, head))


def make_drafter(target_dir: Path, out: Path, ffn: int | None = None) -> None:
    import torch

    from specpress.models.drafter import build_drafter, target_fingerprint
    from specpress.models.drafter_io import save_drafter
    from specpress.models.eagle3 import Eagle3Config
    from specpress.models.target import TargetConfig

    t = TargetConfig.from_hf(LLAMA32_1B)
    cfg = Eagle3Config(vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                       intermediate_size=ffn or t.intermediate_size,
                       num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
                       head_dim=t.head_dim, rms_norm_eps=t.rms_norm_eps,
                       max_position_embeddings=t.max_position_embeddings, rope=t.rope, draft_vocab_size=32000,
                       target_layer_ids=(2, 8, 13), num_target_layers=t.num_hidden_layers)
    torch.manual_seed(1)
    d = build_drafter(cfg)
    with torch.no_grad():
        for p in d.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    d.set_draft_vocab(torch.arange(32000))
    fp = target_fingerprint(t)
    fp["weights_sha256"] = (target_dir / "head_digest.txt").read_text().strip()
    d.target_fingerprint = fp
    save_drafter(d, out, force=True)


def make(args: argparse.Namespace) -> None:
    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    text = _data_text()
    (out / "data.txt").write_text(text)
    target = out / "target"
    if not (target / "config.json").is_file():
        print(f"making the target in {target}", flush=True)
        make_target(target, text)
    if not (out / "eagle3" / "config.json").is_file():
        print("making the EAGLE-3 drafter", flush=True)
        make_drafter(target, out / "eagle3")
    if args.big_drafter and not (out / "eagle3-3gb" / "config.json").is_file():
        print("making the 3 GB EAGLE-3 drafter", flush=True)
        make_drafter(target, out / "eagle3-3gb", ffn=107_000)
    lines = text.splitlines()
    prompts = [{"prompt": "\n".join(lines[i * 400:i * 400 + 6])} for i in range(8)]
    (out / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    (out / "prompts2.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts[:2]))


def commands(d: Path, work: Path) -> dict[str, list[str]]:
    """name -> specpress arguments; every output under `work` (removed before each run)."""
    t, e = str(d / "target"), str(d / "eagle3")
    data, prompts2 = str(d / "data.txt"), str(d / "prompts2.jsonl")
    w = lambda name: str(work / name)  # noqa: E731
    return {
        "distill": ["distill", "--target", t, "--family", "eagle3", "--data", data, "--out", w("distill"),
                    "--steps", "4"],
        "quantize-rtn": ["quantize", "--drafter", e, "--out", w("rtn"), "--scheme", "int4", "--target", t,
                         "--data", data],
        "quantize-gptq": ["quantize", "--drafter", e, "--out", w("gptq"), "--scheme", "int4", "--method", "gptq",
                          "--target", t, "--data", data, "--calib-batches", "2"],
        "prune": ["prune", "--drafter", e, "--out", w("prune"), "--vocab", "16000", "--target", t, "--data", data,
                  "--vocab-tokens", "4096"],
        "export-onnx-fp32": ["export", "onnx", "--drafter", e, "--target", t, "--out", w("onnx32")],
        "export-onnx-fp16": ["export", "onnx", "--drafter", e, "--target", t, "--out", w("onnx16"), "--dtype",
                             "fp16"],
        "export-onnx-3gb": ["export", "onnx", "--drafter", str(d / "eagle3-3gb"), "--target", t, "--out",
                            w("onnx3gb")],
        "export-target": ["export", "target", "--target", t, "--out", w("target")],
        "bench-torch": ["bench", "--target", t, "--drafter", e, "--prompts", prompts2, "--max-new-tokens", "16",
                        "--json", w("bench-torch.json")],
        "bench-ort": ["bench", "--target", t, "--drafter", e, "--prompts", prompts2, "--max-new-tokens", "16",
                      "--backend", "onnxruntime", "--json", w("bench-ort.json")],
        "export-hf": ["export", "hf", "--drafter", e, "--out", w("hf"), "--format", "speculators", "--target", t],
    }


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def run_one(argv: list[str], env: dict[str, str], log: Path) -> tuple[int, float, int]:
    """(exit code, wall seconds, peak RSS bytes) of one child process."""
    t0 = time.monotonic()
    with log.open("w") as fh:
        p = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, time.monotonic() - t0, usage.ru_maxrss * 1024


def measure(args: argparse.Namespace) -> None:
    import shutil

    d = Path(args.dir).expanduser()
    repo = Path(args.repo).resolve()
    work = Path(args.work or d / f"work-{args.label}")
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "TOKENIZERS_PARALLELISM": "false",
           "SPECPRESS_CACHE": str(work / "cache")}
    cmds = commands(d, work)
    only = args.only.split(",") if args.only else [k for k in cmds if k != "export-onnx-3gb" or args.big_drafter]
    results = Path(args.results).expanduser()
    results.parent.mkdir(parents=True, exist_ok=True)
    commit = args.commit or subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    for name in only:
        spec = cmds[name]
        for out in (work / n for n in ("cache", "distill", "distill.partial", "rtn", "gptq", "prune", "onnx32",
                                       "onnx16", "onnx3gb", "target", "hf", "bench-torch.json", "bench-ort.json")):
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
        plan = None
        if (repo / "specpress" / "commands" / "plan.py").is_file():
            rc, _, _ = run_one([sys.executable, "-m", "specpress.cli", "plan", "--json", str(work / "plan.json"),
                                "--force", *spec], env, work / f"{name}.plan.log")
            plan = json.loads((work / "plan.json").read_text()) if rc == 0 else None
        free = mem_available()
        expect = plan["peak_bytes"] / 2 ** 30 if plan else NEED_GIB.get(name, 0)  # the plan, else the old peak
        need = max(args.min_free_gib, expect + 2) if args.min_free_gib >= 0 else 0
        if free < need * 2 ** 30:
            print(f"{name}: skipped, MemAvailable {free / 2 ** 30:.1f} GiB < {need:.1f} GiB", flush=True)
            continue
        argv = [sys.executable, "-m", "specpress.cli", *spec]
        print(f"{name}: {shlex.join(spec)}  (MemAvailable {free / 2 ** 30:.1f} GiB)", flush=True)
        rc, wall, peak = run_one(argv, env, work / f"{name}.log")
        rec = {"name": name, "label": args.label, "commit": commit, "rc": rc, "wall_s": round(wall, 1),
               "peak_rss": peak, "peak_gib": round(peak / 2 ** 30, 2), "argv": spec,
               "date": time.strftime("%Y-%m-%d %H:%M"), "mem_available_gib": round(free / 2 ** 30, 1)}
        if plan is not None:
            rec["plan_peak"] = plan.get("peak_bytes")
            rec["plan_holds"] = plan.get("holds_bytes")
            rec["plan_ratio"] = round(peak / plan["peak_bytes"], 3) if plan.get("peak_bytes") else None
        print(f"  rc {rc}  wall {wall:.0f} s  peak {peak / 2 ** 30:.2f} GiB"
              + (f"  plan {plan['peak_bytes'] / 2 ** 30:.2f} GiB" if plan else ""), flush=True)
        with results.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--big-drafter", action="store_true")
    r = sub.add_parser("measure")
    r.add_argument("--dir", required=True)
    r.add_argument("--repo", default=".")
    r.add_argument("--label", required=True)
    r.add_argument("--results", required=True)
    r.add_argument("--work")
    r.add_argument("--only")
    r.add_argument("--big-drafter", action="store_true")
    r.add_argument("--min-free-gib", type=float, default=4.0)
    r.add_argument("--commit", help="the commit --repo holds when it is a snapshot (git archive), not a checkout")
    a = ap.parse_args()
    make(a) if a.cmd == "make" else measure(a)


if __name__ == "__main__":
    main()
