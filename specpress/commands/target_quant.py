"""--target-quant / --target-quant-data: the options `run`, `bench`, `distill` and `quantize` share, and the
steps they take with them (compress a copy of the loaded target, print what it changed). Parsing and checking
the two options before anything loads is the library's `parse_spec` (compress/quantize/target.py).
Torch-free at import, like every command module."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from specpress.models.quantized.names import SCHEME_WORDS

SPEC_HELP = ("SCHEME[:key=value,...]: SCHEME is none (float weights) or " + ", ".join(SCHEME_WORDS) + "; keys "
             "method=rtn|gptq|awq|smoothquant|bnb, group=G, symmetric=true|false, activations=none|dynamic|static, "
             "calibration=max|mse|percentile:P|fixed:V|weights, kv=fp8, include=A+B, exclude=A+B. E.g. int8 (W8A16), "
             "fp8 (W8A8, per-token activations), int4 (W4A16, groups of 64), nvfp4:activations=static (W4A4), "
             "none:kv=fp8 (float weights, fp8 KV cache)")
DATA_HELP = ("Calibration data for a --target-quant that runs the target on data (method=gptq / awq / smoothquant, "
             "static activation scales): zoo:train, a text file or directory, or a .jsonl of text or input_ids; "
             "8 batches of 4 x 128-token windows")


def target_quant_options(what: str, data_default: str | None = None) -> Callable[[Any], Any]:
    """The two options, their help saying what `what` does with the compressed target."""
    data_help = DATA_HELP + (f"  [default: {data_default}]" if data_default else "")

    def deco(fn: Any) -> Any:
        fn = click.option("--target-quant-data", "target_quant_data", default=None, metavar="DATA",
                          help=data_help + ".")(fn)
        return click.option("--target-quant", "target_quant", default=None, metavar="SPEC",
                            help=f"Compress the target first, with a drafter quantization scheme, and {what}. "
                                 f"Its decoder Linears are quantized (embeddings and lm_head stay float unless "
                                 f"include=lm_head) and computed as the scheme's reference: fake-quantized "
                                 f"input x dequantized weight, in the target's dtype (emulated on CPU: it "
                                 f"measures acceptance, not speed). {SPEC_HELP}.")(fn)

    return deco


def compress_target(target: Any, target_dir: Path, tq: Any, data: str | None, seed: int,
                    echo: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """(a compressed copy of the loaded target, what was done), with one summary line on `echo`."""
    from specpress.runtime.compressed_target import calibration_stream, compressed_copy

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

    if tq is None:
        return
    if target_backend != "torch":
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
