"""The steps `run` and `bench` take with a compressed target (--target-quant): compress a copy of the loaded
target, refuse the backends it cannot run on, bench the float target beside it and say what changed.
Torch-free at import (the command modules import it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def compress_target(target: Any, target_dir: Path, tq: Any, data: str | None, seed: int,
                    echo: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """(a compressed copy of the loaded target, what was done), with one summary line on `echo`."""
    from specpress.compress.quantize.target import calibration_stream, compressed_copy

    stream = calibration_stream(data, target_dir, target) if tq.needs_data() and data is not None else None
    q, summary = compressed_copy(target, tq, stream, seed=seed)
    echo(summary_line(summary))
    return q, summary


def summary_line(s: dict[str, Any]) -> str:
    """`target fp8-dyn: 56 Linears quantized (weight SQNR min 31.8 dB), lm_head kept; KV cache fp8`."""
    if not s.get("quantized"):
        return f"target {s['label']}: weights in float" + ("; KV cache fp8" if s["kv_cache"] == "fp8" else "")
    kept = ", ".join(k.rpartition(".")[2] for k in s.get("kept") or [])
    return (f"target {s['label']}: {s['quantized']} Linears quantized ({s['linear_bytes_before']:,} -> "
            f"{s['linear_bytes_after']:,} bytes; weight SQNR min {s['weight_sqnr_db_min']} dB)"
            + (f", {kept} kept" if kept else "") + ("; KV cache fp8" if s["kv_cache"] == "fp8" else "")
            + (f"; calibrated on {s['calibration']['windows']} windows" if s.get("calibration") else ""))


def comparison_lines(result: dict[str, Any]) -> list[str]:
    """bench's lines for a compressed target: τ against the float target and the greedy drift."""
    lines = []
    f, p = result.get("float_target") or {}, result.get("target_paired")
    if p and p.get("delta_tau") is not None:
        ci = p.get("ci")
        lines.append(f"against the float target: tau {result['tau']:.3f} vs {f['tau']:.3f} "
                     f"({100 * (result.get('target_retention') or 0):.1f} %), paired delta {p['delta_tau']:+.3f}"
                     + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]{' resolved' if p['resolved'] else ''}" if ci else ""))
    a = result.get("target_agreement")
    if a:
        med = a.get("median_first_divergence")
        lines.append(f"greedy output vs the float target: {100 * a['prefix']:.1f} % prefix agreement, "
                     f"{a['exact_prompts']}/{a['prompts']} prompts identical"
                     + ("" if med is None else f" (the others diverge at token {med:g}, median)"))
    return lines


def greedy_drift(float_target: Any, ids: Any, max_new_tokens: int, tokens: list[int]) -> str:
    """', target int4-g64: the first 37 of 48 tokens equal the float target's greedy continuation'."""
    from specpress.runtime.backends.torch.runner import TorchTarget
    from specpress.runtime.compressed_target import greedy_agreement
    from specpress.runtime.plain import decode_plain

    ref = decode_plain(TorchTarget(float_target), ids, max_new_tokens).tokens
    a = greedy_agreement([ref], [tokens])
    n = a["first_divergence"][0]
    return ("; identical to the float target's greedy continuation" if n is None else
            f"; the first {n} of {len(ref)} tokens equal the float target's greedy continuation")


def check_target_backend(tq: Any, target_backend: str, compile_target: bool) -> None:
    """A compressed target runs on torch, eager."""
    from specpress.errors import UsageError
    from specpress.runtime.backends import get_backend

    if tq is None:
        return
    if not get_backend(target_backend).modules:
        raise UsageError(f"--target-quant compresses the torch target; --target-backend {target_backend} runs the "
                         f"float target's export: drop one of them")
    if compile_target:
        raise UsageError("--target-quant runs the compressed target eager (its quantizers are emulated); drop "
                         "--compile-target")


def float_reference(result: dict[str, Any], summary: dict[str, Any], float_target: Any, prompts: list[Any],
                    max_new_tokens: int, policy: Any, console: Any, *, seed: int, params: Any,
                    drafter: Callable[[], Any] | None) -> dict[str, Any]:
    """bench's second pass: the same prompts against the float target (the drafter, loaded afresh for it, or
    plain decoding), and what the compression changed (runtime/compressed_target.py); the keys to add to
    the compressed target's result, which loses its plain_outputs."""
    from rich.progress import Progress

    from specpress.runtime.backends.torch.runner import TorchTarget
    from specpress.runtime.bench import bench_plain, bench_speculative
    from specpress.runtime.compressed_target import float_comparison
    from specpress.ticker import bar_columns

    with Progress(*bar_columns(), console=console, transient=True) as progress:
        task = progress.add_task("float target (reference)", total=len(prompts))
        kw = dict(params=params, seed=seed, keep_plain=True, on_prompt=lambda i: progress.advance(task))
        if drafter is None:
            ref = bench_plain(TorchTarget(float_target), prompts, max_new_tokens, **kw)
        else:
            ref = bench_speculative(TorchTarget(float_target), drafter(), prompts, max_new_tokens, policy, **kw)
    out = {"target_quant": summary, **float_comparison(result, ref, seed)}
    result.pop("plain_outputs", None)
    return out
