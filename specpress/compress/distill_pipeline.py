"""The CLI's path for `specpress distill`: options -> checked request -> trained artifact -> the printed summary.

    req = distill_request("eagle3", steps=2000)
    run = distill_pipeline(req, "zoo/small", "zoo:train", "drafters/eagle3")
    print("\\n".join(report_lines(run)))

`distill_request` refuses the option combinations the command refuses (same errors, same order) and builds the
DistillConfig; `distill_pipeline` claims `out` (and the teacher's cache), checks the window, the data and the
--init / --from drafters before loading anything, then runs compress.distill.distill_from_dirs; a Ctrl-C there
becomes Interrupted, saying which step was saved in `<out>.partial` and how to continue. `report_lines` is what
the command prints.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpress.compress.config import DistillConfig


@dataclass(frozen=True)
class DistillRequest:
    config: DistillConfig
    target_quant: Any = None  # TargetQuant (compress/quantize/target.py) or None
    target_quant_data: str | None = None


@dataclass
class DistillRunReport:
    request: DistillRequest
    report: Any  # compress.distill.DistillReport (not imported here: that module imports torch)


def distill_request(family: str, *, steps: int | None = None, minutes: float | None = None, dtype: str = "auto",
                    legacy_bf16: bool | None = None, compile: bool = False, target_quant: str | None = None,
                    target_quant_data: str | None = None, **fields: Any) -> DistillRequest:
    """Check one combination of distill's options and build its config (defaults are DistillConfig's).

    A budget (steps and/or minutes) is required (UsageError); legacy_bf16: the deprecated --bf16 / --fp32
    (warns, then replaces `dtype`); target_quant: a --target-quant spec, parsed (its data: target_quant_data).
    fields: the other DistillConfig fields (lr, batch, seq_len, taps, ...); the config validates them.
    """
    from specpress.compress.quantize.target import parse_spec
    from specpress.device import train_dtype
    from specpress.errors import UsageError, deprecated

    if steps is None and minutes is None:
        raise UsageError("give a budget: --steps N and/or --minutes M")
    if legacy_bf16 is not None:
        dtype = "bf16" if legacy_bf16 else "fp32"
        deprecated("--bf16 / --fp32", f"use --dtype {dtype}")
    tq = parse_spec(target_quant, target_quant_data, data_default="--data")
    config = DistillConfig(family=family, steps=steps, minutes=minutes, **fields,
                           bf16=None if dtype == "auto" else train_dtype(dtype) == "bf16",
                           compile=compile)
    return DistillRequest(config, tq, target_quant_data)


def distill_pipeline(request: DistillRequest, target_dir: str | Path, data_path: str | Path, out: str | Path, *,
                     from_dir: str | Path | None = None, init_dir: str | Path | None = None, resume: bool = False,
                     force: bool = False, cache_dir: str | Path | None = None, target_dtype: str = "bf16",
                     progress: bool = False) -> DistillRunReport:
    """Claim `out`, check the inputs, distill (compress.distill.distill_from_dirs), write `out`.

    resume: continue `<out>.partial` (a note says when there is none); force: replace an existing `out` (and
    discard a partial run without resume); cache_dir: the teacher's signal cache, claimed like an output.
    Raises Interrupted on Ctrl-C (the checkpoint saved, or that nothing was).
    """
    from specpress.artifacts import claim_cache, claim_output
    from specpress.compress.guards import check_not_quantized, check_seq_len, distill_saved, interrupted
    from specpress.compress.data import check_data
    from specpress.compress.distill import distill_from_dirs

    config = request.config
    inputs = {"--target": target_dir, "--data": data_path, "--from": from_dir, "--init": init_dir,
              "--cache-teacher": cache_dir}
    with claim_output(out, force=force, inputs=inputs, partial=True, resume=resume, writes="drafter") as claim, ExitStack() as stack:
        if cache_dir is not None:  # the teacher's cache is written too: claimed like an output
            for leftover in stack.enter_context(claim_cache(cache_dir)):
                print(f"note: {leftover}", file=sys.stderr)
        check_seq_len(target_dir, config.seq_len, config.batch)
        check_data(data_path)  # a device, a FIFO or more text than memory: refused before loading
        for flag, d in (("--init", init_dir), ("--from", from_dir)):
            if d is not None:
                check_not_quantized(Path(d), flag)
        try:
            report = distill_from_dirs(target_dir, config, data_path, out, from_dir=from_dir, init_dir=init_dir,
                                       resume=resume, force=force, cache_dir=cache_dir, progress=progress,
                                       target_dtype=target_dtype, target_quant=request.target_quant,
                                       target_quant_data=request.target_quant_data)
        except KeyboardInterrupt:
            assert claim.partial is not None
            raise interrupted(claim.partial, distill_saved(claim.partial)) from None
    return DistillRunReport(request, report)


def report_lines(run: DistillRunReport) -> list[str]:
    """The summary `specpress distill` prints: where the drafter went, steps / loss / acc@k (held-out), and the
    last training batches' acc@k with the passes over the data (held-out well below it after several passes
    says: more data)."""
    config, tq, report = run.request.config, run.request.target_quant, run.report
    acc = " ".join(f"{a:.3f}" for a in report.agreement)
    tokens = int(report.data.get("tokens", 0))
    seen = report.steps * config.batch * config.seq_len
    train = " ".join(f"{a:.3f}" for a in report.train_agreement)
    head = f"{config.family} drafter written to {report.out}" + (
        "" if tq is None else f" (trained against the target compressed as {tq.label})")
    run_line = (f"  steps {report.steps}/{report.planned_steps} ({report.stopped_by})  loss {report.final_loss:.4f}  "
                f"acc@k {'held-out' if report.heldout else 'train-data'} {acc}  {report.seconds:.0f} s")
    data_line = (f"  acc@k last training batches {train}  ({seen / max(1, tokens):.1f} passes over {tokens:,} "
                 f"training tokens)")
    return [head, run_line, data_line]


__all__ = ["DistillRequest", "DistillRunReport", "distill_pipeline", "distill_request", "report_lines"]
