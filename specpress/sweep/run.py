"""One grid point: build its artifact (reused when already built), measure acc@k, bench every run.

A run is (policy, temperature, backend: a name of the runtime/backends registry, target: the label of the
float target or of one of the recipe's `target_quant` compressed copies); every run of every point decodes
the SAME prompts, so the parent can pair each run with the base drafter's run of the same settings, and a
run on a compressed target with the same point's run on the float target (stats.py). The point's drafter is
built against the float target (compression steps calibrate on it) and measured unchanged on every target;
acc@k is measured against each target, and a compressed target's greedy drift from the float target
(runtime/compressed_target.py) is recorded beside its runs. The artifact goes to
OUT/points/<id>/drafter with OUT/points/<id>/point.json holding what it was built from (steps, base
drafter digest, target, calibration data, seed): it is reused only when that key matches. Records are
plain dicts; a failure (building or one run) becomes a record with `status: failed`, the error and a short
traceback, and the sweep goes on. Worker processes (--jobs) call `init_worker` once and then `work`.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any, Callable

from specpress.artifacts import write_json
from specpress.models.drafter_io import load_drafter_for
from specpress.runtime.backends import load_runner
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.bench import bench_speculative
from specpress.runtime.coverage import calibration_coverage
from specpress.runtime.sampling import SamplingParams
from specpress.sweep.context import SweepContext, file_digest, open_context
from specpress.sweep.grid import Point, Step
from specpress.sweep.recipe import Recipe
from specpress.sweep.results import FLOAT_TARGET

RunSpec = tuple[str, float, str, str]  # (policy, temperature, backend, target label); a 3-tuple: the float target
Log = Callable[[str], None]


def target_tag(target_dir: Path) -> dict[str, Any]:
    """Cheap identity of the target directory (config digest, weight file sizes)."""
    weights = sorted(p for p in Path(target_dir).iterdir() if p.suffix in (".safetensors", ".bin"))
    return {"config": file_digest(Path(target_dir) / "config.json"), "weights": {p.name: p.stat().st_size
                                                                                 for p in weights}}


def artifact_key(ctx: SweepContext, point: Point) -> dict[str, Any]:
    calib = any(_uses_calibration(s) for s in point.steps)
    return {"point": point.to_dict(), "base": ctx.base_digest, "target": target_tag(ctx.target_dir),
            "calibration": ctx.recipe.calibration.to_json() if calib else None, "seed": ctx.recipe.seed,
            "dtype": ctx.recipe.dtype, "float_dtype": str(ctx.stored_dtype()).removeprefix("torch.")}


def _uses_calibration(step: Step) -> bool:
    if step.is_budget:
        return step.budget()[2] == "kl"
    cfg = step.config()
    return bool(cfg.needs_data()) or (step.kind == "quantize" and step.recovery() is not None)


def key_matches(keyfile: Path, key: Any) -> bool:
    """Whether `keyfile` (a point's point.json) records `key`; unreadable or damaged counts as not (rebuilt)."""
    from specpress.errors import CheckpointError
    from specpress.readback import read_json

    try:
        return keyfile.is_file() and read_json(keyfile) == key
    except CheckpointError:
        return False


def point_dir(out: Path, point: Point) -> Path:
    return out / "points" / point.id


def apply_step(ctx: SweepContext, drafter: Any, step: Step, work: Path | None = None) -> Any:
    """One compression step on an in-memory drafter (attached to ctx.target); returns the new drafter. work: a
    directory a quantize step's recovery keeps its resumable state in (continued when it is there)."""
    cfg = step.config()
    source = ctx.recipe.calibration.to_json()
    if step.kind == "prune":
        from specpress.compress.prune import prune

        return prune(drafter, cfg, target=ctx.target if cfg.needs_target() else None,
                     calib=ctx.stream(ctx.recipe.calibration) if cfg.needs_data() else None,
                     provenance_extra={"source": source} if cfg.needs_data() else None)
    from specpress.compress.quantize.api import quantize, update_step

    if step.is_budget:
        return _apply_budget(ctx, drafter, step, cfg)
    calibration = None
    if cfg.needs_data():
        from specpress.compress.quantize.calibrate import calibration_loop, default_calib_batches

        c = step.calibration()
        if "calib_batches" not in dict(step.options):  # the method's default, as `specpress quantize`
            c["calib_batches"] = default_calib_batches(drafter, cfg, c["batch"], c["seq_len"])
        cal = ctx.calibration(c["seq_len"], c["batch"])
        sampler = cal.sampler()
        tq = step.target_quant()  # calibrate against a compressed target (re-calibration for that deployment)
        target = ctx.target if tq is None else ctx.compressed(tq)[0]
        calibration = calibration_loop(step.calib_inputs(), target, drafter, sampler, c["calib_batches"])
    rec = step.recovery()
    if rec is not None:
        from dataclasses import replace

        from specpress.compress.quantize.api import select_modules
        from specpress.compress.quantize.recover import source_weights

        rec = replace(rec, seed=ctx.recipe.seed)
        sources = source_weights(drafter, select_modules(drafter, cfg)[0])
    quantize(drafter, cfg, calibration, float_dtype=ctx.stored_dtype())
    # as `specpress quantize` records it: inspect reads the artifact's float dtype (and prices a shared head's
    # rows in it) from here, not from its quantizer scales' dtype
    update_step(drafter, float_dtype=str(ctx.stored_dtype()).removeprefix("torch."))
    if calibration is not None:
        update_step(drafter, calibration=cal.record(calibration, step.calib_inputs()),
                    **({"target_quant": {"spec": tq.text, "label": tq.label}} if tq is not None else {}))
    if rec is not None:
        drafter = _recover(ctx, drafter, rec, sources, source, work)
    return drafter


def _recover(ctx: SweepContext, drafter: Any, rec: Any, sources: Any, source: Any, work: Path | None) -> Any:
    """Quantization-aware distillation of a quantized drafter on the recipe's calibration data, resumable in
    `work` (a state from another run is discarded there)."""
    import shutil

    from specpress.compress.quantize.api import round_floats, update_step
    from specpress.compress.quantize.recover import recover
    from specpress.errors import CheckpointError

    sampler = ctx.calibration(rec.seq_len, rec.batch).sampler(seed=rec.seed)
    try:
        out = recover(drafter, ctx.target, sampler, rec, sources=sources, checkpoint_dir=work, resume=work is not None)
    except CheckpointError:
        assert work is not None
        shutil.rmtree(work, ignore_errors=True)
        out = recover(drafter, ctx.target, sampler, rec, sources=sources, checkpoint_dir=work)
    round_floats(out, ctx.stored_dtype())  # the trained float tensors as they are stored
    update_step(out, recovery={**out.provenance[-1]["recovery"], "data": source})
    return out


def _apply_budget(ctx: SweepContext, drafter: Any, step: Step, select: Any) -> Any:
    """A budget step (`quantize --budget`): sensitivity on the recipe's calibration windows, then the allocation."""
    from specpress.compress.quantize.api import update_step
    from specpress.compress.quantize.budget import KLProbe, quantize_to_budget

    budget, cands, measure = step.budget()
    probe = None
    if measure == "kl":
        c = step.calibration()
        cal = ctx.calibration(c["seq_len"], c["batch"])
        probe = KLProbe(ctx.target, drafter, cal.sampler(), c["calib_batches"])
    quantize_to_budget(drafter, select, cands, budget, float_dtype=ctx.stored_dtype(), measure=measure, probe=probe)
    if probe is not None:
        update_step(drafter, calibration=cal.record(probe, "first-step"))
    return drafter


def build_point(ctx: SweepContext, point: Point, log: Log | None = None) -> tuple[Path, bool]:
    """(artifact dir, reused?): the base drafter itself, or OUT/points/<id>/drafter built from it."""
    if point.is_base:
        return ctx.base_dir, True
    from specpress.models.drafter_io import load_drafter, save_drafter

    pdir = point_dir(ctx.out, point)
    art, keyfile = pdir / "drafter", pdir / "point.json"
    key = artifact_key(ctx, point)
    if (art / "config.json").is_file() and key_matches(keyfile, key):
        return art, True
    if log:
        log(f"{point.id}: building (" + " -> ".join(s.label() for s in point.steps) + ")")
    drafter = load_drafter(ctx.base_dir, ctx.target)
    work = pdir / "recovery.partial"  # a recovery's checkpoints, continued by a rerun of the same point
    if work.is_dir() and not key_matches(work / "point.json", key):
        import shutil

        shutil.rmtree(work)
    if any(s.kind == "quantize" and s.recovery() is not None for s in point.steps):
        work.mkdir(parents=True, exist_ok=True)
        write_json(work / "point.json", key)
    for step in point.steps:
        drafter = apply_step(ctx, drafter, step, work)
    pdir.mkdir(parents=True, exist_ok=True)
    save_drafter(drafter, art, force=True, dtype=ctx.stored_dtype())
    write_json(keyfile, key)
    if work.is_dir():
        import shutil

        shutil.rmtree(work)
    return art, False


def error_summary(exc: BaseException) -> dict[str, Any]:
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    return {"error": f"{type(exc).__name__}: {exc}",
            "traceback": [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in frames]}


def run_target(run: Any) -> str:
    """The target label of a run (a 3-tuple run is one on the float target)."""
    return run[3] if len(run) > 3 else FLOAT_TARGET


def _base_record(point: Point, run: Any, ctx: SweepContext) -> dict[str, Any]:
    policy, temperature, backend = run[:3]
    return {"point": point.id, "steps": [s.to_dict() for s in point.steps], "policy": policy,
            "temperature": float(temperature), "backend": backend, "target_quant": run_target(run),
            "prompts": len(ctx.prompts), "max_new_tokens": ctx.recipe.max_new_tokens}


def measure_point(ctx: SweepContext, point: Point, runs: list[Any], *, log: Log | None = None,
                  on_prompt: Callable[[Any, int], None] | None = None) -> list[dict[str, Any]]:
    """Build (or reuse) the point's artifact; per target (float first, then each compressed one) load it
    against that target, measure acc@k once and the target's greedy drift, then bench each run on it: one
    record per run."""
    from specpress.models.inspect import inspect_artifact

    t0 = time.monotonic()
    try:
        art, reused = build_point(ctx, point, log)
        build_s = time.monotonic() - t0
        info = inspect_artifact(art)
    except Exception as exc:  # recorded per run; the sweep goes on
        fail = {"status": "failed", **error_summary(exc), "wall_s": time.monotonic() - t0}
        return [{**_base_record(point, run, ctx), **fail} for run in runs]
    shared = {"drafter_dir": _rel(art, ctx.out), "artifact_reused": reused, "family": info["family"],
              "bytes": int(info["bytes"]), "shared_bytes": int(info.get("shared_bytes") or 0),
              "params": int(info["params"]), "bits_per_param": info["bits_per_param"],
              "dtype": info["dtype"], "provenance": info["provenance"], "build_s": build_s,
              "calibration_coverage": calibration_coverage(info["provenance"])}
    by_target: dict[str, list[Any]] = {}
    for run in runs:
        by_target.setdefault(run_target(run), []).append(run)
    labels = sorted(by_target, key=lambda t: t != FLOAT_TARGET)  # the float target first: the others pair with it
    records: list[dict[str, Any]] = []
    for label in labels:
        records += _measure_on_target(ctx, point, by_target[label], label, art, info, shared, log, on_prompt)
    return records


def _measure_on_target(ctx: SweepContext, point: Point, runs: list[Any], label: str, art: Path, info: dict[str, Any],
                       shared: dict[str, Any], log: Log | None, on_prompt: Callable[[Any, int], None] | None
                       ) -> list[dict[str, Any]]:
    """The runs of one point against one target (module docstring)."""
    from specpress.runtime.policy import parse_policy

    t1 = time.monotonic()
    try:
        target, summary = ctx.target_for(label)
        target_s = time.monotonic() - t1
        quiet = not point.is_base or log is None or label != FLOAT_TARGET  # warn once, for the base
        drafter = load_drafter_for(target, art, warn=(lambda m: None) if quiet else log)
        t2 = time.monotonic()
        acc = None
        sampler = ctx.agreement_sampler()
        if sampler is not None:
            from specpress.compress.agreement import agreement

            acc = agreement(target, drafter, sampler, ctx.recipe.agreement_batches)
        agreement_s = time.monotonic() - t2
    except Exception as exc:
        fail = {"status": "failed", **error_summary(exc), "wall_s": shared["build_s"] + time.monotonic() - t1}
        return [{**_base_record(point, run, ctx), **fail} for run in runs]
    tq = ctx.recipe.target_spec(label)
    mine = {**shared, "agreement": acc,
            "agreement_windows": None if sampler is None else ctx.recipe.agreement_batches * sampler.batch,
            "agreement_s": agreement_s, "target_quant_spec": tq.text, "target_s": target_s,
            "target_quant_summary": None if summary is None else {
                k: summary.get(k) for k in ("quantized", "linear_bytes_before", "linear_bytes_after",
                                            "weight_sqnr_db_min", "kv_cache", "calibration")}}
    records = []
    runners = {"torch": drafter_runner(drafter)}  # the module acc@k measured; other backends load per run
    verifier = TorchTarget(target)
    for run in runs:
        policy, temperature, backend = run[:3]
        t3 = time.monotonic()
        rec = {**_base_record(point, run, ctx), **mine}
        try:
            if backend not in runners:
                from specpress.export.ondemand import runner_input  # an ONNX export made once, cached

                runners[backend] = load_runner(backend, runner_input(backend, art, ctx.target_dir, target=ctx.target),
                                               target, verifier.device)
            keep = float(temperature) == 0 and not ctx.has_greedy(label)  # its plain greedy decodes: the drift's
            res = bench_speculative(
                verifier, runners[backend], ctx.prompts, ctx.recipe.max_new_tokens, parse_policy(policy),
                params=SamplingParams(temperature), seed=ctx.recipe.seed, drafter_bytes=int(info["bytes"]),
                config={"point": point.id, "drafter": str(art), "target": str(ctx.target_dir), "backend": backend,
                        "target_quant": tq.text},
                on_prompt=(lambda i, r=run: on_prompt(r, i)) if on_prompt else None, keep_plain=keep)
            if keep:
                ctx.note_greedy(label, res.pop("plain_outputs"))
        except Exception as exc:
            records.append({**rec, "status": "failed", **error_summary(exc), "wall_s": time.monotonic() - t3})
            continue
        per_prompt = res.get("per_prompt") or []
        rec.update({
            "status": "ok", "tau": res["tau"], "ar": res["ar"], "histogram": res["histogram"],
            "per_prompt_tau": [p["tau"] for p in per_prompt], "rounds": res.get("rounds"),
            "draft_acceptance_rate": res.get("draft_acceptance_rate"), "tokens_per_s": res["tokens_per_s"],
            "baseline_tokens_per_s": res["baseline_tokens_per_s"], "speedup": res["speedup"],
            "draft_ms": res["draft_ms"], "verify_ms": res["verify_ms"], "other_ms": res["other_ms"],
            "overhead_fraction": res["overhead_fraction"], "lossless_mismatches": res["lossless_mismatches"],
            "eval_coverage": res.get("eval_coverage"), "bench_config": res["config"],
            "bench_s": time.monotonic() - t3})
        rec["wall_s"] = shared["build_s"] + target_s + agreement_s + rec["bench_s"]
        records.append(rec)
    try:  # the target's greedy drift from the float target (from the plain decodes above where there were any)
        drift = ctx.target_drift(label)
    except Exception as exc:
        return [{**r, "status": "failed", **error_summary(exc)} for r in records]
    return [{**r, "target_agreement": drift} for r in records]


def _rel(path: Path, out: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(out).resolve()))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------------------------
# Worker processes (--jobs N): one context per process, opened once
# ----------------------------------------------------------------------------------------------

_WORKER: dict[str, SweepContext] = {}


def init_worker(recipe: Recipe, out: Path, target_dir: Path, base_dir: Path, base_digest: str,
                threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    _WORKER["ctx"] = open_context(recipe, out, target_dir, base_dir, base_digest)


def work(point: Point, runs: list[RunSpec]) -> list[dict[str, Any]]:
    return measure_point(_WORKER["ctx"], point, runs)
