"""The CLI's path for `specpress bench`: directories in, the metrics object out, and the summary it prints.

    req = bench_request("zoo/small", "prompts.jsonl", 64, drafter_dir="drafters/eagle3")
    result = run_bench(req)  # or bench_from_dirs("zoo/small", "prompts.jsonl", 64, drafter_dir=...)
    print("\\n".join(summary_lines(result)))

`bench_request` checks the option combinations (the same UsageError / RequestError messages, in the same
order, as the CLI) before anything loads; `run_bench` loads the prompts and the target (runtime/bench.py),
compresses the target (--target-quant), loads the drafter(s) on their backends, times bench_plain or
bench_speculative (runtime/bench.py) under a progress bar on stderr, adds the float-target reference, the
machine-load record and the calibration coverage, and returns the object `bench --json` writes.
`summary_lines` is what the command prints of it on stderr.

Importing this module does not import torch (`specpress run` / `bench --help` import it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpress.errors import UsageError

COMPILE_WARMUP_PROMPTS = 3  # prompts decoded before timing when the drafter or the target is compiled


def loop_target(target_backend: str, target, target_dir: Path, dtype: str, compile_target: bool, warn):
    """The target the loop calls: the torch target, or the --target-backend's runner over what it reads
    (an ONNX export made on demand)."""
    from specpress.export.ondemand import target_input
    from specpress.runtime.backends import get_backend, load_target_runner

    if compile_target and not get_backend(target_backend).modules:
        raise UsageError(f"--compile-target compiles the torch target; drop it with --target-backend {target_backend}")
    return load_target_runner(target_backend, target_input(target_backend, target_dir, dtype, progress=warn,
                                                          target=target), target)


def check_drafter_dir(backend: str, drafter_dir: Path | None, flag: str = "--drafter") -> None:
    """Before any loading: an export given to a backend that runs drafter artifacts is refused, naming the
    backend that runs it (a drafter artifact given to an export backend is exported on demand); a drafter
    artifact's config.json is read, so an absurd or malformed one is refused before the target is built."""
    from specpress.errors import RequestError
    from specpress.models.drafter_io import check_drafter_config
    from specpress.runtime.backends import check_reads, get_backend

    backend_ = get_backend(backend)
    if drafter_dir is not None and backend_.reads == "drafter":
        try:
            check_reads(backend_, Path(drafter_dir))
        except RequestError as exc:
            raise RequestError(str(exc).replace("--drafter ", f"{flag} ", 1)) from None
    check_drafter_config(drafter_dir)  # before the target is built



def check_compile(compile_drafter: bool, drafter_dir: Path | None, backend: str = "torch") -> None:
    from specpress.runtime.backends import get_backend

    if compile_drafter and drafter_dir is None:
        raise UsageError("--compile compiles the drafter; pass --drafter too (plain decoding stays eager)")
    if compile_drafter and not get_backend(backend).modules:
        raise UsageError(f"--compile compiles a torch drafter's forward; the {backend} backend runs its own "
                               "graph: drop --compile or use --backend torch")


def load_drafter_runner(backend: str, drafter_dir: Path, target, *, strict: bool, warn, compile_drafter: bool,
                        target_dir: Path):
    """The --drafter directory as the --backend registry entry runs it, on the target's device. A drafter
    artifact given to a backend that reads ONNX is exported first (once, cached; specpress.export.ondemand),
    with the target already loaded (never a second copy)."""
    from specpress.export.ondemand import runner_input
    from specpress.runtime.backends import load_runner

    opts = {"compile": True} if compile_drafter else {}
    return load_runner(backend, runner_input(backend, drafter_dir, target_dir, progress=warn, target=target), target,
                       target.lm_head.weight.device, strict=strict, warn=warn, **opts)


@dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """The options `run` and `bench` share (given by keyword): the drafter and where it runs, the policy, sampling,
    seed, the target's dtype and backend, its --target-quant. Defaults are the CLI's."""

    drafter_dir: Path | None = None
    policy: str | None = None  # None: the drafter family's default policy
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    dtype: str = "fp32"
    backend: str = "torch"
    compile_drafter: bool = False
    target_backend: str = "torch"
    target_quant: Any = None  # TargetQuant (compress/quantize/target.parse_spec) or None
    target_quant_data: str | None = None
    strict: bool = False


@dataclass(frozen=True, kw_only=True)
class BenchRequest(DecodeOptions):
    """One bench run, checked (bench_request): what run_bench takes. Defaults are the CLI's."""

    target_dir: Path
    prompts_file: Path
    max_new_tokens: int
    compile_target: bool = False
    compare_dir: Path | None = None
    compare_backend: str = "torch"  # resolved: --compare-backend, else --backend


def bench_request(target_dir: str | Path, prompts_file: str | Path, max_new_tokens: int, *,
                  drafter_dir: str | Path | None = None, policy: str | None = None, temperature: float = 0.0,
                  top_k: int = 0, top_p: float = 1.0, seed: int = 0, dtype: str = "fp32", backend: str = "torch",
                  compile_drafter: bool = False, compile_target: bool = False,
                  compare_dir: str | Path | None = None, compare_backend: str | None = None,
                  target_backend: str = "torch", target_quant: str | None = None,
                  target_quant_data: str | None = None, strict: bool = False) -> BenchRequest:
    """Check one combination of bench's options, before anything loads (the CLI's keywords and refusals).

    target_quant: the --target-quant spec text (parsed here). Raises UsageError / RequestError naming the
    options to change.
    """
    from specpress.compress.quantize.target import parse_spec
    from specpress.decode.target_quant_steps import check_target_backend

    drafter_dir = None if drafter_dir is None else Path(drafter_dir)
    compare_dir = None if compare_dir is None else Path(compare_dir)
    check_compile(compile_drafter, drafter_dir, backend)
    if compare_dir is not None and drafter_dir is None:
        raise UsageError("--compare-drafter compares against --drafter; pass --drafter too")
    if compare_backend is not None and compare_dir is None:
        raise UsageError("--compare-backend names the backend of --compare-drafter; pass --compare-drafter too")
    compare_backend = compare_backend or backend
    check_drafter_dir(backend, drafter_dir)
    check_drafter_dir(compare_backend, compare_dir, "--compare-drafter")
    tq = parse_spec(target_quant, target_quant_data)
    check_target_backend(tq, target_backend, compile_target)
    return BenchRequest(target_dir=Path(target_dir), prompts_file=Path(prompts_file), max_new_tokens=max_new_tokens,
                        drafter_dir=drafter_dir, policy=policy, temperature=temperature, top_k=top_k, top_p=top_p,
                        seed=seed, dtype=dtype, backend=backend, compile_drafter=compile_drafter,
                        compile_target=compile_target, compare_dir=compare_dir, compare_backend=compare_backend,
                        target_backend=target_backend, target_quant=tq, target_quant_data=target_quant_data,
                        strict=strict)


def bench_from_dirs(target_dir: str | Path, prompts_file: str | Path, max_new_tokens: int, *, console: Any = None,
                    **options: Any) -> dict[str, Any]:
    """bench_request(...) then run_bench: the metrics object `bench --json` writes."""
    return run_bench(bench_request(target_dir, prompts_file, max_new_tokens, **options), console=console)


def run_bench(req: BenchRequest, *, console: Any = None) -> dict[str, Any]:
    """Load, decode every prompt (timed), measure; returns the bench JSON object (outputs and per_prompt
    included). console: the rich Console for progress, loading messages and warnings (stderr by default)."""
    from rich.console import Console
    from rich.progress import Progress

    from specpress.decode.target_quant_steps import compress_target, float_reference
    from specpress.machine import LoadMeter, load_warning
    from specpress.runtime.backends import drafter_bytes
    from specpress.runtime.bench import (
        bench_plain,
        bench_speculative,
        default_policy,
        load_bench_inputs,
    )
    from specpress.runtime.compile import compile_errors
    from specpress.runtime.compile import compile_target as compile_target_fn
    from specpress.runtime.backends import get_backend
    from specpress.runtime.policy import parse_policy
    from specpress.runtime.sampling import SamplingParams
    from specpress.ticker import LogTicker, bar_columns

    console = console if console is not None else Console(stderr=True)
    r, tq = req, req.target_quant
    target, prompts = load_bench_inputs(r.target_dir, r.prompts_file, r.dtype, r.max_new_tokens)
    config = {"target": str(r.target_dir), "prompts_file": str(r.prompts_file), "dtype": r.dtype,
              "drafter": None if r.drafter_dir is None else str(r.drafter_dir), "backend": r.backend, "policy": None,
              "compile": r.compile_drafter, "compile_target": r.compile_target}
    warn = console.print
    float_target = tq_summary = None
    if tq is not None:
        float_target = target
        target, tq_summary = compress_target(float_target, r.target_dir, tq, r.target_quant_data, r.seed, warn)
        config["target_quant"] = tq.text
    drafter = compare = pol = None
    if r.drafter_dir is not None:
        drafter = load_drafter_runner(r.backend, r.drafter_dir, target, strict=r.strict, warn=warn,
                                      compile_drafter=r.compile_drafter, target_dir=r.target_dir)
        pol = parse_policy(r.policy or default_policy(drafter.family))
        config["policy"] = str(pol)
        config["provider"] = drafter.provider  # what actually executed the drafter
    if r.compare_dir is not None:
        compare = load_drafter_runner(r.compare_backend, r.compare_dir, target, strict=r.strict, warn=warn,
                                      compile_drafter=r.compile_drafter and get_backend(r.compare_backend).modules,
                                      target_dir=r.target_dir)
        config["compare"] = {"drafter": str(r.compare_dir), "backend": r.compare_backend,
                             "provider": compare.provider}
    verifier = loop_target(r.target_backend, target, r.target_dir, r.dtype, r.compile_target, warn)
    config["target_backend"] = r.target_backend
    config["target_provider"] = getattr(verifier, "provider", "torch")
    if r.compile_target:
        compile_target_fn(target)
    warmup = COMPILE_WARMUP_PROMPTS if r.compile_drafter or r.compile_target else 0
    compiled = [(flag, what) for flag, what, on in (("--compile", "the drafter", r.compile_drafter),
                                                    ("--compile-target", "the target", r.compile_target)) if on]
    meter = LoadMeter()  # other processes' share of our cores while timing (a warning when they compete)
    label = "decoding" if drafter is None else f"decoding ({pol}) + baseline"
    ticker = LogTicker(console, label, len(prompts))  # plain lines when stderr is a log file
    params = SamplingParams(r.temperature, r.top_k, r.top_p)

    with Progress(*bar_columns(eta=True), console=console, transient=True) as progress, compile_errors(
            bool(compiled), " or ".join(w for _, w in compiled), " / ".join(f for f, _ in compiled)):
        task = progress.add_task(label, total=len(prompts))

        def on_prompt(i: int) -> None:
            progress.advance(task)
            ticker.tick(i + 1, "prompts")

        kw = {"params": params, "seed": r.seed, "config": config, "on_prompt": on_prompt}
        if drafter is None:
            result = bench_plain(verifier, prompts, r.max_new_tokens,
                                 warmup_prompts=warmup if r.compile_target else 0, keep_plain=tq is not None, **kw)
        else:
            result = bench_speculative(verifier, drafter, prompts, r.max_new_tokens, pol,
                                       drafter_bytes=drafter_bytes(r.backend, r.drafter_dir), warmup_prompts=warmup,
                                       plain_warmup_prompts=warmup if r.compile_target else 0, compare=compare,
                                       compare_bytes=0 if compare is None else drafter_bytes(r.compare_backend,
                                                                                             r.compare_dir),
                                       compare_label=config.get("compare"), keep_plain=tq is not None, **kw)
    if float_target is not None:  # the same drafter, prompts and seed against the float target
        result.update(float_reference(result, tq_summary, float_target, prompts, r.max_new_tokens, pol, console,
                                      seed=r.seed, params=params,
                                      drafter=None if drafter is None else lambda: load_drafter_runner(
                                          r.backend, r.drafter_dir, float_target, strict=r.strict,
                                          warn=lambda m: None, compile_drafter=r.compile_drafter,
                                          target_dir=r.target_dir)))
    result["machine"] = meter.stop()
    if warning := load_warning(result["machine"]):
        console.print(warning, style="yellow", highlight=False)
    if drafter is not None:
        from specpress.runtime.coverage import (
            calibration_coverage,
            coverage_warning,
            drafter_provenance,
        )

        result["calibration_coverage"] = calibration_coverage(drafter_provenance(r.drafter_dir))
        if warning := coverage_warning(result["eval_coverage"], result["calibration_coverage"]):
            console.print("warning: " + warning, style="yellow", highlight=False)
    return result


def bench_lines(result: dict[str, Any], n_prompts: int, policy: Any) -> list[str]:
    """The measurement's summary: tokens, tau, AR[k], speed, round times, lossless check; the draft
    vocabulary's coverage; the compared drafter. policy: None for plain decoding."""
    n_tok = sum(len(o) for o in result["outputs"])
    if policy is None:
        return [(f"{n_prompts} prompts, {n_tok} tokens, {result['tokens_per_s']:.1f} tok/s "
                 f"(median step {result['verify_ms']:.2f} ms), plain decoding")]
    ar = " ".join(f"{a:.2f}" for a in result["ar"][:8]) or "- (no draft token was accepted)"
    lossless = result["lossless_mismatches"]
    lines = [f"{n_prompts} prompts, {n_tok} tokens, {policy}: tau {result['tau']:.2f}, AR[k] {ar}; "
             f"{result['tokens_per_s']:.1f} tok/s vs plain {result['baseline_tokens_per_s']:.1f} "
             f"(speedup {result['speedup']:.2f}x); round ms draft {result['draft_ms']:.2f} / verify "
             f"{result['verify_ms']:.2f} / other {result['other_ms']:.2f}; loop overhead "
             f"{100 * result['overhead_fraction']:.0f}%"
             + ("" if lossless is None else f"; lossless mismatches {lossless}")]
    if result.get("eval_coverage") is not None:
        cal = result.get("calibration_coverage")
        lines.append(f"draft vocabulary covers {100 * result['eval_coverage']:.1f} % of the emitted tokens"
                     + ("" if cal is None else f" (calibration coverage {100 * cal:.1f} %, from prune --vocab)"))
    c = result.get("compare")
    if c:
        lines.append(f"compare {c['drafter']} ({c['backend']}): tau {c['tau']:.2f}, speedup {c['speedup']:.2f}x; "
                     f"median drafter forward ms per round {c['draft_forward_ms_median']:.2f} vs "
                     f"{c['base_draft_forward_ms_median']:.2f} ({c['draft_forward_ms_ratio']:.2f}x), round ms "
                     f"{c['round_ms_median']:.2f} vs {c['base_round_ms_median']:.2f} ({c['round_ms_ratio']:.2f}x)"
                     + ("" if c["lossless_mismatches"] is None else
                        f"; lossless mismatches {c['lossless_mismatches']}"))
    return lines


def summary_lines(result: dict[str, Any]) -> list[str]:
    """What `specpress bench` prints on stderr about a finished run (each line without its newline):
    bench_lines, then with --target-quant the comparison with the float target."""
    cfg = result["config"]
    lines = bench_lines(result, cfg["prompts"], cfg["policy"])
    if "target_quant" in cfg:
        from specpress.decode.target_quant_steps import comparison_lines

        lines += comparison_lines(result)
    return lines


__all__ = ["COMPILE_WARMUP_PROMPTS", "BenchRequest", "DecodeOptions", "bench_from_dirs", "bench_lines", "bench_request",
           "check_compile", "check_drafter_dir", "load_drafter_runner", "loop_target", "run_bench", "summary_lines"]
