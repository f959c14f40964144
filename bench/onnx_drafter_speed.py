"""Drafting ms per round: the torch drafter vs its onnxruntime export, interleaved, medians and ratio.

Synthetic mode (default): a round is what a FeatureSession asks of an EAGLE-3 drafter under
dynamic:depth=D,topk=K: one step over the A accepted tokens (target taps fused), then D tree levels of K
nodes each, fed back with the drafter's own hidden, under the tree mask; then the draft slots are
cropped. Random weights at a given size (no zoo needed; speed depends on shapes only). Both backends run
the same calls, alternating.

    python bench/onnx_drafter_speed.py [--hidden 512] [--vocab 8192] [--rounds 60] [--threads 1]
                                       [--schemes fp32,int8,int4]

Real mode (--drafter DIR --target DIR --prompts FILE): the drafter artifact (float or quantized) and its
ONNX export (--export DIR, made there when absent) decode every prompt at temperature 0 under --policy,
each backend in turn (torch eager, onnxruntime, and torch compiled with --compile; the order rotates per
prompt); reports tau per backend, the drafter's forward ms per round (medians over all rounds) and their
ratios, the share of rounds in which onnxruntime drafts the very tree torch drafts (export/rounds.py
lockstep: both propose from the same state, then both follow torch's verified path), and the export's
bytes and validation errors beside the artifact's bytes.

    python bench/onnx_drafter_speed.py --drafter D --target T --prompts P.jsonl [--export DIR] [--n 100]
        [--max-new-tokens 64] [--policy dynamic:depth=6,topk=8,budget=32] [--compile] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def build(hidden: int, vocab: int, draft_vocab: int, layers: int):
    from drafters_common import randomize

    from specpress.models.drafter import build_drafter
    from specpress.models.eagle3 import Eagle3Config
    from specpress.models.target import TargetConfig, TargetModel

    shape = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4 // 16 * 16,
                 num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256),
                 max_position_embeddings=2048)
    torch.manual_seed(0)
    target = randomize(TargetModel(TargetConfig(**shape, num_hidden_layers=layers)), 0)
    d = build_drafter(Eagle3Config(**shape, draft_vocab_size=draft_vocab))
    d = randomize(d, 1).attach_target(target)
    d.set_draft_vocab(torch.arange(draft_vocab))
    return target, d


def quantized(d, scheme: str):
    from specpress.compress.quantize.api import quantize
    from specpress.models.quantized.scheme import config_for

    return d if scheme == "fp32" else quantize(__import__("copy").deepcopy(d), config_for(scheme))


def round_calls(step, make_cache, feats, hidden, gen, depth: int, topk: int, context: int, accepted: int):
    """One drafting round through `step(feats, ids, cache, positions, mask)`; returns its wall ms."""
    cache = make_cache()
    ids = torch.randint(0, 100, (1, context), generator=gen)
    step(feats[:, :context], ids, cache, None, None)  # committed context (not timed)
    t0 = time.perf_counter()
    base = cache.length
    g_last = None
    _, g = step(feats[:, :accepted], ids[:, :accepted], cache, torch.arange(base, base + accepted), None)
    g_last = g[:, -1:]
    ctx = cache.length
    parents: list[list[int]] = []
    for level in range(depth):
        k = topk
        mask = torch.zeros(k, cache.length + k, dtype=torch.bool)
        mask[:, :ctx] = True
        for row in range(k):
            mask[row, cache.length + row] = True
            slot = row
            for lv in range(level - 1, -1, -1):  # ancestors: a random chain back to the root
                slot = parents[lv][slot] if lv < len(parents) else 0
                mask[row, ctx + lv * k + slot] = True
        parents.append(torch.randint(0, k, (k,), generator=gen).tolist())
        _, g = step(g_last.expand(1, k, -1), torch.randint(0, 100, (1, k), generator=gen), cache,
                    torch.full((k,), ctx + level), mask)
        g_last = g[:, :1]
    return (time.perf_counter() - t0) * 1000


def _worst(errors: dict) -> tuple[float, float]:
    """(max max_rel, max max_abs) over every graph and output of a manifest's validation errors."""
    es = [e for outs in errors.values() for e in outs.values()]
    return max(e["max_rel"] for e in es), max(e["max_abs"] for e in es)


def real(a: argparse.Namespace) -> None:
    """The real-drafter mode (see the module docstring)."""
    from specpress.export.onnx import ExportOptions, export_from_dirs
    from specpress.export.rounds import lockstep
    from specpress.manifest import load_manifest
    from specpress.models.drafter_io import load_drafter_for
    from specpress.models.target import load_target
    from specpress.runtime.backends.onnxruntime.runner import load_runner
    from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
    from specpress.runtime.compile import compile_drafter
    from specpress.runtime.loop import speculative_generate
    from specpress.runtime.policy import parse_policy
    from specpress.runtime.prompts import load_prompts

    target = load_target(a.target, device="cpu")
    export = Path(a.export) if a.export else Path(tempfile.mkdtemp()) / "onnx"
    if not (export / "manifest.json").is_file():
        t0 = time.perf_counter()
        export_from_dirs(a.drafter, a.target, export, ExportOptions(accuracy_level=a.accuracy_level),
                         progress=lambda m: print(f"  {m}", file=sys.stderr))
        print(f"exported {a.drafter} -> {export} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    m = load_manifest(export)
    runners = {"torch": drafter_runner(load_drafter_for(target, a.drafter).eval()),
               "onnxruntime": load_runner(export, target, "cpu", threads=a.threads)}
    if a.compile:
        compiled = load_drafter_for(target, a.drafter).eval()
        compile_drafter(compiled)
        runners["compiled"] = drafter_runner(compiled)
    policy = parse_policy(a.policy)
    prompts = [list(p.ids) for p in load_prompts(a.prompts, None, target.config.vocab_size)][:a.n]
    for name, r in runners.items():  # warm-up (and compilation), not counted
        speculative_generate(TorchTarget(target), r, prompts[0], a.max_new_tokens, policy)
    ms: dict[str, list[float]] = {n: [] for n in runners}
    accepted = {n: 0 for n in runners}
    rounds = {n: 0 for n in runners}
    outputs: dict[str, list[list[int]]] = {n: [] for n in runners}
    same: list[bool] = []
    names = list(runners)
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names):] + names[:i % len(names)]:
            gen = speculative_generate(TorchTarget(target), runners[name], prompt, a.max_new_tokens, policy)
            ms[name].extend(r.draft_forward_ms for r in gen.rounds)
            accepted[name] += sum(r.accepted + 1 for r in gen.rounds)
            rounds[name] += len(gen.rounds)
            outputs[name].append(gen.tokens)
        lockstep(TorchTarget(target), runners["torch"], runners["onnxruntime"], prompt, a.max_new_tokens, policy,
                 same.append, follow=True)
        if (i + 1) % 10 == 0:
            print(f"  {i + 1}/{len(prompts)} prompts", file=sys.stderr, flush=True)
    med = {n: statistics.median(v) for n, v in ms.items()}
    art = sum(f.stat().st_size for f in Path(a.drafter).glob("*.safetensors"))
    res = {"drafter": a.drafter, "export": str(export), "policy": a.policy, "prompts": len(prompts),
           "max_new_tokens": a.max_new_tokens, "threads": a.threads,
           "quantization": (m.quantization or {}).get("schemes", ["fp32"]), "artifact_bytes": art,
           "export_bytes": m.drafter_bytes, "shared_bytes": m.shared_bytes,
           "export_random_max_rel_abs": _worst(m.validation),
           "export_rounds_max_rel_abs": _worst(m.validation_rounds["errors"]) if m.validation_rounds else None,
           "tau": {n: accepted[n] / rounds[n] for n in runners}, "rounds": rounds,
           "draft_forward_ms": med, "agree_rounds": sum(same), "lockstep_rounds": len(same),
           "outputs_equal": {n: outputs[n] == outputs["torch"] for n in runners}}
    print(json.dumps(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    ratio = "  ".join(f"ort/{n} {med['onnxruntime'] / med[n]:.2f}" for n in runners if n != "onnxruntime")
    print(f"{','.join(res['quantization'])}: tau " + " ".join(f"{n} {t:.3f}" for n, t in res["tau"].items())
          + f"; drafts agree {sum(same)}/{len(same)} rounds; draft ms " + " ".join(f"{n} {v:.2f}" for n, v in
                                                                                   med.items()) + f"; {ratio}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", help="real mode: a drafter artifact directory (needs --target, --prompts)")
    ap.add_argument("--target")
    ap.add_argument("--prompts")
    ap.add_argument("--export", help="real mode: its ONNX export (made here when absent)")
    ap.add_argument("--n", type=int, default=100, help="real mode: the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--policy", default="dynamic:depth=6,topk=8,budget=32")
    ap.add_argument("--compile", action="store_true", help="real mode: also a torch.compile'd drafter")
    ap.add_argument("--json")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--draft-vocab", type=int, default=2048)
    ap.add_argument("--target-layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--schemes", default="fp32,int8,int4")
    ap.add_argument("--attention", default="standard")
    ap.add_argument("--accuracy-level", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.drafter:
        if not (a.target and a.prompts):
            ap.error("--drafter needs --target and --prompts")
        real(a)
        return
    from specpress.export.onnx import ExportOptions, export_onnx
    from specpress.runtime.backends.onnxruntime.runner import load_runner

    target, base = build(a.hidden, a.vocab, a.draft_vocab, a.target_layers)
    ctxlen, accepted = 96, 3
    with torch.no_grad():
        ids = torch.randint(0, a.vocab, (1, ctxlen + accepted))
        out = target(ids, taps=base.taps)
    print(f"eagle3 drafter hidden {a.hidden}, vocab {a.vocab} (draft {a.draft_vocab}); round = {accepted} accepted "
          f"+ dynamic depth {a.depth} x topk {a.topk}; context {ctxlen}; {a.threads} thread(s); {a.rounds} rounds; "
          f"attention {a.attention}, MatMulNBits accuracy_level {a.accuracy_level}")
    print(f"{'scheme':<7} {'torch ms':>9} {'ort ms':>8} {'ort/torch':>9}  export bytes")
    for scheme in a.schemes.split(","):
        d = quantized(base, scheme)
        tmp = Path(tempfile.mkdtemp()) / scheme
        rep = export_onnx(d, tmp, ExportOptions(attention=a.attention, accuracy_level=a.accuracy_level),
                          target=target)
        runner = load_runner(tmp, target, "cpu", threads=a.threads)
        feats_t, feats_o = d.fuse_taps(out.taps), runner.fuse_taps(out.taps)

        def torch_step(f, i, cache, positions, mask):
            with torch.no_grad():
                return d(f, i, cache=cache, positions=positions, mask=mask)

        times: dict[str, list[float]] = {"torch": [], "ort": []}
        for r in range(a.rounds + 3):
            order = [("torch", torch_step, feats_t, lambda: d.new_cache(256)),
                     ("ort", runner.feature_step, feats_o, lambda: runner.new_cache(256))]
            for name, step, feats, mk in (order if r % 2 else order[::-1]):
                ms = round_calls(step, mk, feats, None, torch.Generator().manual_seed(r), a.depth, a.topk,
                                 ctxlen, accepted)
                if r >= 3:  # warm-up rounds dropped
                    times[name].append(ms)
        mt, mo = statistics.median(times["torch"]), statistics.median(times["ort"])
        print(f"{scheme:<7} {mt:>9.2f} {mo:>8.2f} {mo / mt:>9.2f}  {sum(rep.graphs.values()):,} "
              f"(+ shared {rep.shared_bytes:,})")


if __name__ == "__main__":
    main()
