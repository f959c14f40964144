"""What vLLM's load-time scale cast costs: tau of an exported quantized drafter with its float32 scales as
stored, and with every scale rounded to bf16 (vLLM copies compressed-tensors' weight_scale into the model
dtype when it loads the drafter).

    python bench/hf_scale_cast.py --target DIR --drafter EXPORTED_DIR [--prompts N] [--tokens T] [--policy P]
    python bench/hf_scale_cast.py --tiny      # no zoo: the tiny random target of the tests and an int4
                                              # lm drafter holding its own weights (drafts get accepted)

Prints one JSON object: tau and accepted-per-round for both, and the max relative change of the scales.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch


def tau(target, drafter, prompts, tokens: int, policy: str) -> tuple[float, list[int]]:
    from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
    from specpress.runtime.loop import speculative_generate
    from specpress.runtime.policy import parse_policy

    accepted = []
    for p in prompts:
        g = speculative_generate(TorchTarget(target), drafter_runner(drafter), p, tokens, parse_policy(policy),
                                 eos_ids=())
        accepted += [r.accepted for r in g.rounds]
    return 1 + sum(accepted) / len(accepted), accepted


def round_scales(drafter) -> float:
    """Round every quantized module's scales to bf16 in place; return the max relative change."""
    from specpress.models.quantized.modules import quantized_modules

    worst = 0.0
    for m in quantized_modules(drafter).values():
        s = m.scales
        r = s.to(torch.bfloat16).to(s.dtype)
        worst = max(worst, float(((r - s).abs() / s.abs().clamp_min(1e-30)).max()))
        m.scales = r
        m._refresh()
    return worst


def tiny(workdir: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from drafters_common import tiny_target

    from specpress.compress.quantize.api import quantize
    from specpress.export.hf import export_hf
    from specpress.models.drafter_io import save_drafter
    from specpress.models.lm import LMConfig, LMDrafter
    from specpress.models.quantized.scheme import config_for
    from specpress.models.target import save_target

    t = tiny_target()
    tdir = save_target(t, workdir / "target")
    d = LMDrafter(LMConfig.from_target_config(t.config))
    d.load_state_dict(t.state_dict(), strict=False)
    quantize(d.attach_target(t), config_for("int4", group_size=8))
    src = save_drafter(d, workdir / "lm-int4")
    return tdir, export_hf(src, workdir / "served", "speculators").out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target")
    ap.add_argument("--drafter")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--policy", default="chain:3")
    a = ap.parse_args()
    from specpress.models.drafter_io import load_drafter
    from specpress.models.target import load_target

    with tempfile.TemporaryDirectory() as tmp:
        tdir, ddir = tiny(Path(tmp)) if a.tiny else (Path(a.target), Path(a.drafter))
        target = load_target(tdir)
        g = torch.Generator().manual_seed(0)
        v = target.config.vocab_size
        prompts = [torch.randint(1, v, (12,), generator=g).tolist() for _ in range(a.prompts)]
        drafter = load_drafter(ddir, target)
        t32, acc32 = tau(target, drafter, prompts, a.tokens, a.policy)
        change = round_scales(drafter)
        t16, acc16 = tau(target, drafter, prompts, a.tokens, a.policy)
    print(json.dumps({"drafter": "tiny int4 lm (g8)" if a.tiny else str(ddir), "policy": a.policy,
                      "tau_fp32_scales": round(t32, 4), "tau_bf16_scales": round(t16, 4),
                      "rounds": len(acc32), "rounds_that_differ": sum(x != y for x, y in zip(acc32, acc16)),
                      "max_scale_rel_change": change}))


if __name__ == "__main__":
    main()
