"""The CLI's path: drafter dir (+ target and data) -> quantized artifact, with its size and acceptance cost.

With a target and data, the data's token stream is split as distill splits it (the last 5% held out when
it holds >= 20 windows): calibration windows come from the rest, and the per-position top-1 agreement
with the target (specpress.compress.agreement) is measured on the held-out windows before and after
quantization (on fresh windows of the same stream when nothing is held out). Both go into the step.

With `recovery` (quantize --recover-steps N) the quantized drafter is then trained against the target on
windows of the same training split (recover.py), and the after-agreement is measured on the recovered one.
The quantized drafter before recovery and the training checkpoints go to `<out>.partial/`; with `resume` a
run continues from them (the quantization is not redone), and they are removed once `out` is written.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specpress.compress.quantize.api import (
    dequantize,
    quantize,
    resolve_float_dtype,
    round_floats,
    select_modules,
    stored_bytes,
    update_step,
)
from specpress.compress.quantize.budget import Budget, Candidate
from specpress.compress.quantize.recover import RecoverConfig, recover, source_weights
from specpress.device import DTYPES
from specpress.errors import CheckpointError, UsageError
from specpress.models.quantized.configs import QuantizeConfig


@dataclass
class QuantizeReport:
    out: Path
    family: str
    step: dict[str, Any]  # the provenance step written
    before: list[float] | None  # per-position agreement with the target, before
    after: list[float] | None  # … and after
    heldout: bool  # agreement measured on held-out windows (else fresh windows of the calibration stream)
    seconds: float


def quantize_from_dirs(drafter_dir: str | Path, config: QuantizeConfig, out: str | Path, *,
                       target_dir: str | Path | None = None, data_path: str | Path | None = None,
                       dequantize_out: bool = False, force: bool = False, calib_batches: int | None = None,
                       batch: int = 4,
                       seq_len: int = 128, seed: int = 0, eval_batches: int = 4,
                       float_dtype: str | torch.dtype | None = "auto", calib_inputs: str = "rounds",
                       recovery: RecoverConfig | None = None, resume: bool = False, progress: bool = False,
                       budget: Budget | None = None, candidates: tuple[Candidate, ...] = (),
                       sensitivity: str | None = None, target_dtype: str = "bf16", target_quant: Any = None,
                       target_quant_data: str | Path | None = None) -> QuantizeReport:
    """Load, quantize, measure, write `out` atomically.

    float_dtype: what the kept float tensors (norms, biases, unquantized Linears, embeddings) are stored
    in; "auto" keeps a 16-bit source's dtype and stores an fp32 source in bfloat16 (resolve_float_dtype).
    They are rounded to it before the after-agreement is measured, so the cost reported is the stored one;
    with `dequantize_out` the dequantised weights are rounded and measured the same way.
    calib_inputs: what a config that needs data calibrates on (calibrate.calibration_loop): real speculative
    rounds (`rounds[:POLICY]`) or the teacher-forced first step (`first-step`). calib_batches None: the
    method's default (calibrate.default_calib_batches: more for GPTQ on wide Linears).
    recovery: quantization-aware distillation after quantizing (needs target and data); resume: continue an
    interrupted one from `<out>.partial/`; progress: bars on stderr (calibration, recovery).
    budget: allocate a scheme per Linear among `candidates` (budget.py; `config` then only selects the
    Linears), scoring each by `sensitivity` (kl: on `calib_batches` calibration windows, needs the target;
    weight: data-free; None: kl with a target, else weight). Not with `recovery` (it trains one scheme).
    target_quant (a TargetQuant, with a target): calibrate and measure against the target compressed so (the
    re-calibration of a drafter to a compressed target), itself calibrated, when the spec needs data, on
    target_quant_data or else on the calibration windows; the step records it.
    """
    from specpress.artifacts import check_new, partial_path
    from specpress.models.drafter_io import load_drafter, save_drafter
    from specpress.models.inspect import inspect_artifact

    t0 = time.monotonic()
    out = Path(out).expanduser()
    if (target_dir is None) != (data_path is None):
        raise UsageError("--target and --data go together: the drafter runs on the target's hidden states over "
                         "the data (calibration and the before/after agreement)")
    if target_quant is not None and target_dir is None:
        raise UsageError("--target-quant compresses the target the drafter is calibrated and measured on: pass "
                         "--target DIR and --data PATH")
    recovering = recovery is not None and recovery.steps > 0
    if recovering and target_dir is None:
        raise UsageError("--recover-steps trains the quantized drafter against the target: pass --target DIR and "
                         "--data PATH")
    if recovering and dequantize_out:
        raise UsageError("--recover-steps trains the stored codes; --dequantize would throw them away: drop one")
    if recovering and budget is not None:
        raise UsageError("--recover-steps trains one scheme's codes and --budget writes a scheme per Linear; "
                         "recovery of a mixed drafter is not supported: drop one")
    if config.needs_data() and target_dir is None:
        what = f"--method {config.method}" if config.needs_calibration else "--activations static"
        raise UsageError(f"{what} calibrates on the activations entering each Linear: pass --target DIR and --data "
                         f"PATH")
    check_new(out, force, writes="drafter")
    source = inspect_artifact(drafter_dir)
    stored = resolve_float_dtype(float_dtype, DTYPES.get(str(source["dtype"]), torch.float32))
    target = cal = sampler = compressed = None
    first_eval, heldout = 0, False
    if target_dir is not None:
        from specpress.compress.calibration import FRESH_WINDOWS, load_calibration
        from specpress.models.target import load_target

        target = load_target(target_dir, dtype=target_dtype)
        cal = load_calibration(target, target_dir, data_path, seq_len, batch, seed)  # type: ignore[arg-type]
        sampler = cal.sampler()
        evals = cal.heldout() or sampler
        heldout, first_eval = cal.held is not None, 0 if cal.held is not None else FRESH_WINDOWS
        if target_quant is not None:
            compressed = cal.compress_target(target, target_dir, target_quant, target_quant_data)
    drafter = load_drafter(drafter_dir, target)
    before = after = None
    if target is not None:
        from specpress.compress.agreement import agreement

        before = agreement(target, drafter, evals, eval_batches, first_step=first_eval)
    extra: dict[str, Any] = {"source": str(drafter_dir), "source_bytes": source["bytes"],
                             "source_dtype": source["dtype"], "float_dtype": str(stored).removeprefix("torch.")}
    if compressed is not None:
        extra["target_quant"] = compressed
    sources = source_weights(drafter, select_modules(drafter, config)[0]) if recovering else None
    part = partial_path(out)
    resumed = _resume_quantized(part, config, extra, target) if recovering and resume else None
    if resumed is not None:
        drafter = resumed.to(drafter.compute_param().dtype)  # computes as the freshly quantized one would
    else:
        calibration = None
        if config.needs_data():
            from specpress.compress.quantize.calibrate import calibration_loop, default_calib_batches

            assert target is not None and sampler is not None
            calib_batches = calib_batches or default_calib_batches(drafter, config, batch, seq_len)
            calibration = calibration_loop(calib_inputs, target, drafter, sampler, calib_batches, progress)
        if budget is None:
            quantize(drafter, config, calibration, float_dtype=stored)
        else:
            from specpress.compress.quantize.budget import KLProbe, quantize_to_budget
            from specpress.compress.quantize.calibrate import CALIB_BATCHES

            measure = sensitivity or ("kl" if target is not None else "weight")
            probe = (KLProbe(target, drafter, sampler, calib_batches or CALIB_BATCHES)
                     if measure == "kl" and target is not None else None)
            quantize_to_budget(drafter, config, candidates, budget, float_dtype=stored, measure=measure, probe=probe,
                               progress=True)
            if probe is not None:
                calibration = probe  # type: ignore[assignment]  (its windows are recorded as the calibration)
        update_step(drafter, **extra)
        if calibration is not None:
            assert cal is not None
            inputs = "first-step" if budget is not None else calib_inputs
            update_step(drafter, calibration=cal.record(calibration, inputs, with_seq_len=True))
        if recovering:  # what a --resume continues from, whatever the quantizer's determinism
            save_drafter(drafter, part / "quantized", force=True, dtype=stored)
    if recovering:
        assert recovery is not None and target is not None and cal is not None
        rs = cal.sampler(recovery.seq_len, recovery.batch, recovery.seed)
        drafter = recover(drafter, target, rs, recovery, sources=sources, checkpoint_dir=part, resume=resume,
                          progress=progress)
        round_floats(drafter, stored)  # the trained float tensors as they are stored
    if dequantize_out:  # what is written, and measured: the dequantised weights rounded to the float dtype
        dequantize(drafter)
        round_floats(drafter, stored)
        extra.update(dequantized=True, bytes_after=stored_bytes(drafter, stored))
    if target is not None:
        after = agreement(target, drafter, evals, eval_batches, first_step=first_eval)
        extra["agreement"] = {"before": [round(a, 4) for a in before or []], "after": [round(a, 4) for a in after],
                              "windows": eval_batches * batch, "heldout": heldout, "data": str(data_path)}
    step = update_step(drafter, **extra)
    save_drafter(drafter, out, force=force, dtype=stored)
    if recovering:
        shutil.rmtree(part, ignore_errors=True)
    return QuantizeReport(out, drafter.family, step, before, after, heldout, time.monotonic() - t0)


def _resume_quantized(part: Path, config: QuantizeConfig, extra: dict[str, Any], target: Any) -> Any | None:
    """The quantized drafter an interrupted recovery left in `<out>.partial/quantized`, or None when there is none;
    one quantized from another source or config is an error naming the difference."""
    from specpress.compress.training import START_OVER
    from specpress.models.drafter_io import load_drafter
    from specpress.models.quantized.restore import active_quantize_step

    qdir = part / "quantized"
    if not (qdir / "config.json").is_file():
        return None
    d = load_drafter(qdir, target)
    step = active_quantize_step(d.provenance) or {}
    for key, want in (("config", config.to_dict()), ("source", extra["source"]),
                      ("source_bytes", extra["source_bytes"]), ("float_dtype", extra["float_dtype"])):
        if step.get(key) != want:
            raise CheckpointError(f"{qdir} is from a different run: its quantize step's {key} is {step.get(key)!r}, "
                                  f"now {want!r}; rerun with the original settings, or "
                                  + START_OVER.format(partial=part))
    return d
