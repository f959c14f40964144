"""The sweep loop: claim OUT, resolve target and base drafter, run the base then every point (serially or in
N spawned processes), pair each run with the base, append results.jsonl, then finalize (Pareto flags,
tables, plots). `Sweep.find_smallest` runs the same machinery over a search instead of the whole grid.

    sweep = Sweep(load_recipe("recipes/quickstart.yaml"), Path("runs/qs"), console)
    sweep.open()
    sweep.run_all(jobs=1)
    records = sweep.finalize()
"""

from __future__ import annotations

import copy
import datetime as _dt
import itertools
import os
from pathlib import Path
from typing import Any

from specpress.errors import RequestError, UsageError
from specpress.stats import paired_comparison, pareto_flags
from specpress.sweep import results as R
from specpress.sweep.executors import ExecutorSpec
from specpress.sweep.grid import Point
from specpress.sweep.recipe import Recipe


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Sweep:
    def __init__(self, recipe: Recipe, out: Path, console: Any = None, *, resume: bool = False,
                 force: bool = False) -> None:
        from rich.console import Console

        self.recipe, self.out = recipe, Path(out).expanduser().resolve()
        self.console = console or Console(stderr=True)
        self.resume, self.force = resume, force
        self.ctx: Any = None

    def log(self, msg: str, style: str | None = None) -> None:
        from rich.markup import escape

        self.console.print(escape(msg), style=style, highlight=False)

    # ------------------------------------------------------------------ setup

    def open(self) -> None:
        from specpress.sweep.context import dir_digest, open_context, resolve_drafter, resolve_target

        torn = R.torn_line(self.out) if self.resume and not self.force else None
        R.guard_out(self.out, self.recipe, resume=self.resume, force=self.force)
        if torn is not None:
            self.log(f"note: {self.out / R.RESULTS}:{torn} was cut short (a write interrupted by a kill); dropped, "
                     f"its run is measured again")
        for s in self.recipe.skipped:
            self.log(f"skipped (no such combination): {s}", style="dim")
        target_dir = resolve_target(self.recipe, self.log)
        base_dir = resolve_drafter(self.recipe, target_dir, self.log)
        self.ctx = open_context(self.recipe, self.out, target_dir, base_dir, dir_digest(base_dir))
        self._check_policies()
        self._prepare()
        self.log(f"sweep {self.recipe.name or ''} -> {self.out}: {len(self.recipe.points)} points x "
                 f"{len(self.runs())} run(s) each, {len(self.ctx.prompts)} prompts x "
                 f"{self.recipe.max_new_tokens} new tokens; base drafter {base_dir} "
                 f"({self.ctx.base_info['family']}, {self.ctx.base_info['params']:,} params)"
                 + ("" if not self.recipe.target_quant else
                    f"; targets {', '.join(t.label for t in self.recipe.targets)}"))

    def _check_policies(self) -> None:
        from specpress.runtime.drafting import check_policy
        from specpress.runtime.policy import parse_policy

        family = self.ctx.base_info["family"]
        for p in self.ctx.policies:
            try:
                check_policy(family, parse_policy(p))
            except RequestError as exc:
                raise RequestError(f"{self.recipe.source or 'recipe'}: policies: {exc}") from None

    def _prepare(self) -> None:
        """Tokenize the shared data streams once, here, so workers memory-map them (and errors come early)."""
        from specpress.sweep.run import _uses_calibration

        self.ctx.agreement_sampler()
        if any(_uses_calibration(s) for p in self.recipe.points for s in p.steps) or \
                any(t.needs_data() for t in self.recipe.target_quant):
            self.ctx.stream(self.recipe.calibration)

    def runs(self, primary_only: bool = False, target: str | None = None) -> list[tuple[str, float, str, str]]:
        """(policy, temperature, backend, target label) of every run of a point; primary_only: the first
        policy / temperature / backend, on every target (or on `target`)."""
        r = self.recipe
        targets = [t.label for t in r.targets if target is None or t.label == target]
        settings = list(itertools.product(self.ctx.policies, r.temperatures, r.backends))
        return [(*run, t) for run in (settings[:1] if primary_only else settings) for t in targets]

    def missing(self, point: Point, runs: list[tuple[str, float, str, str]]) -> list[tuple[str, float, str, str]]:
        done = R.latest(R.read_results(self.out))
        return [run for run in runs if done.get(R.run_key(point.id, *run), {}).get("status") != "ok"]

    # ------------------------------------------------------------------ records

    def complete(self, rec: dict[str, Any]) -> dict[str, Any]:
        """Add the recipe hash, bytes vs the base at 16 bits, and the paired comparison with the base."""
        rec = {"recipe": self.recipe.hash(), **rec,
               "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        base_params = self.ctx.base_info.get("params") or 0
        if rec["status"] == "ok":
            rec["bytes_pct_base16"] = 100 * rec["bytes"] / (2 * base_params) if base_params else None
            done = R.latest(R.read_results(self.out))
            target = rec.get("target_quant", R.FLOAT_TARGET)
            base = done.get(R.run_key("base", rec["policy"], rec["temperature"], rec["backend"], target))
            pair_with_float_target(rec, done, self.recipe.seed)
            if rec["point"] == "base":
                rec["paired"], rec["retention"] = None, 1.0
            elif base is None or base["status"] != "ok":
                rec["paired"], rec["retention"] = None, None
            else:
                rec["paired"] = paired_comparison(rec["per_prompt_tau"], base["per_prompt_tau"], seed=self.recipe.seed)
                rec["retention"] = rec["tau"] / base["tau"] if base["tau"] else None
        rec["pareto"] = None
        return rec

    def _append(self, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for rec in recs:
            rec = self.complete(rec)
            R.append_result(self.out, rec)
            self._report(rec)
            out.append(rec)
        return out

    def _report(self, r: dict[str, Any]) -> None:
        head = f"{r['point']:<22} {r['policy']} T={r['temperature']:g}"
        target = r.get("target_quant", R.FLOAT_TARGET)
        if target != R.FLOAT_TARGET:
            head += f" target {target}"
        if r["status"] != "ok":
            self.log(f"{head}: failed: {r['error']}", style="red")
            return
        from specpress.sweep.report import fmt_bytes

        p = r.get("paired") or {}
        ci = p.get("ci")
        delta = "" if p.get("delta_tau") is None else f"  Δτ {p['delta_tau']:+.3f}" + (
            f" [{ci[0]:+.3f}, {ci[1]:+.3f}]{' resolved' if p['resolved'] else ''}" if ci else "")
        ret = "" if r.get("retention") is None else f" ({100 * r['retention']:.1f} %)"
        if target != R.FLOAT_TARGET:
            tp, drift = r.get("target_paired") or {}, r.get("target_agreement") or {}
            if tp.get("delta_tau") is not None:
                delta += f"  vs float target Δτ {tp['delta_tau']:+.3f}" + (
                    f" [{tp['ci'][0]:+.3f}, {tp['ci'][1]:+.3f}]" if tp.get("ci") else "")
            if drift.get("prefix") is not None:
                delta += f"  greedy agreement {100 * drift['prefix']:.1f} % ({drift['exact_prompts']}/" \
                         f"{drift['prompts']} identical)"
        acc = f"  acc@1 {r['agreement'][0]:.3f}" if r.get("agreement") else ""
        ev, cal = r.get("eval_coverage"), r.get("calibration_coverage")
        cov = "" if ev is None else f"  vocab coverage {100 * ev:.1f} %" + (
            "" if cal is None else f" (calibration {100 * cal:.1f} %)")
        self.log(f"{head}: τ {r['tau']:.3f}{ret}{delta}  {fmt_bytes(r['bytes'])}{acc}  speedup {r['speedup']:.2f}×"
                 f"{cov}  [{r['wall_s']:.0f} s]")

    # ------------------------------------------------------------------ running

    def evaluate(self, point: Point, runs: list[tuple[str, float, str]], progress: Any = None
                 ) -> list[dict[str, Any]]:
        """Measure `runs` of one point in this process (bench progress on `progress`); append the records."""
        from specpress.sweep.run import measure_point

        task = None
        if progress is not None:
            task = progress.add_task(f"{point.id}", total=len(self.ctx.prompts) * len(runs))
        try:
            recs = measure_point(self.ctx, point, runs, log=self.log,
                                 on_prompt=(lambda run, i: progress.advance(task)) if task is not None else None)
        finally:
            if task is not None:
                progress.remove_task(task)
        return self._append(recs)

    def run_all(self, jobs: int | None = 1, points: list[Point] | None = None,
                executor: ExecutorSpec | None = None) -> None:
        """The base first (in this process), then every other point with missing runs: in this process
        (local, jobs 1), or handed to an executor (local with jobs > 1: worker processes; ray: Ray tasks)."""
        from rich.progress import Progress

        from specpress.ticker import bar_columns

        spec = executor or self.recipe.executor or ExecutorSpec()
        pts = list(points or self.recipe.points)
        todo = [(p, self.missing(p, self.runs())) for p in pts]
        todo = [(p, runs) for p, runs in todo if runs]
        skipped = len(pts) - len(todo)
        if skipped:
            self.log(f"resuming: {skipped} point(s) already measured, {len(todo)} to go")
        base = [(p, r) for p, r in todo if p.is_base]
        rest = [(p, r) for p, r in todo if not p.is_base]
        with Progress(*bar_columns(), console=self.console, transient=True) as progress:
            overall = progress.add_task("sweep points", total=len(todo))
            for p, runs in base:
                self.evaluate(p, runs, progress)
                progress.advance(overall)
            if spec.kind == "local" and ((jobs or 1) <= 1 or len(rest) <= 1):
                for p, runs in rest:
                    self.evaluate(p, runs, progress)
                    progress.advance(overall)
            elif rest:
                self._dispatch(rest, spec, jobs, progress, overall)

    def _dispatch(self, todo: list[tuple[Point, list]], spec: ExecutorSpec, jobs: int | None, progress: Any,
                  overall: Any) -> None:
        """Hand `todo` to the executor; records come back here (the only writer), in completion order."""
        from specpress.sweep.executors import WorkerSetup, clear_running, make_executor

        ex = make_executor(spec, jobs)
        c = self.ctx
        threads = ex.threads(cores())
        setup = WorkerSetup(self.recipe, self.out, c.target_dir, c.base_dir, c.base_digest, threads)
        self.log(ex.describe(len(todo), threads))
        n_done = 0

        def on_result(point: Point, runs: list, recs: list[dict[str, Any]]) -> None:
            nonlocal n_done
            self._append(recs)
            clear_running(self.out, point)
            n_done += 1
            progress.advance(overall)

        def on_status(running: int, failed: int) -> None:
            progress.update(overall, description=f"sweep points: {n_done} done / {running} running / "
                                                 f"{failed} failed")

        ex.run(setup, todo, on_result, on_status)

    # ------------------------------------------------------------------ outputs

    def finalize(self, show: bool = True) -> list[dict[str, Any]]:
        """One record per run (the last), Pareto flags per series; rewrite results.jsonl, tables, plots."""
        from specpress.sweep.plots import write_plots
        from specpress.sweep.report import group_key, rich_tables, write_tables

        latest = R.latest(R.read_results(self.out))
        recs = list(latest.values())
        series: dict[Any, list[dict[str, Any]]] = {}
        for r in recs:
            r["pareto"] = None
            pair_with_float_target(r, latest, self.recipe.seed)  # a float run measured after it (a resume)
            if r["status"] == "ok":
                series.setdefault(group_key(r), []).append(r)
        for rows in series.values():
            for r, flag in zip(rows, pareto_flags([(r["bytes"], r["tau"]) for r in rows])):
                r["pareto"] = flag
        R.rewrite_results(self.out, recs)
        paths = write_tables(self.out, recs, title=f"sweep {self.recipe.name}".strip())
        paths += write_plots(self.out, recs)
        if show:
            from rich.console import Console

            out = Console()
            if not out.is_terminal:  # piped or captured: no terminal width to fit, so do not wrap at 80
                out = Console(width=200)
            for t in rich_tables(recs):
                out.print(t)
            self.log(f"wrote {', '.join(str(p.relative_to(self.out)) for p in paths[:2])}, results.jsonl and "
                     f"plots/ under {self.out}")
        return recs

    # ------------------------------------------------------------------ find-smallest

    def find_smallest(self, loss: float) -> Any:
        """Search the grid for the smallest point keeping retention >= 1 - loss, once per target (find.py);
        writes search.json; returns the float target's SearchResult."""
        from specpress.sweep.find import find_smallest_per_target

        return find_smallest_per_target(self, loss)

    def point_bytes(self, point: Point) -> int:
        """The point's stored bytes: from its artifact when built, else from a cheap in-memory build (gptq as
        rtn, no recovery after pruning or quantizing, magnitude importance: the same shapes and storage)."""
        from specpress.models.inspect import inspect_artifact
        from specpress.sweep.run import artifact_key, key_matches, point_dir

        art = point_dir(self.out, point) / "drafter"
        if (art / "config.json").is_file() and key_matches(art.parent / "point.json", artifact_key(self.ctx, point)):
            return int(inspect_artifact(art)["bytes"])
        return sizing_bytes(self.ctx, point, self._base_copy())

    def _base_copy(self) -> Any:
        if not hasattr(self, "_base_model"):
            from specpress.models.drafter_io import load_drafter

            self._base_model = load_drafter(self.ctx.base_dir, self.ctx.target)
        return copy.deepcopy(self._base_model)


def pair_with_float_target(rec: dict[str, Any], done: dict[str, dict[str, Any]], seed: int) -> None:
    """A run on a compressed target against the same point's run on the float target (same prompts, policy,
    temperature, backend): `target_paired` (per-prompt Δτ, 95 % CI) and `target_retention` (τ / float τ);
    None when either is missing. Runs on the float target get neither."""
    target = rec.get("target_quant", R.FLOAT_TARGET)
    if target == R.FLOAT_TARGET or rec.get("status") != "ok":
        return
    ref = done.get(R.run_key(rec["point"], rec["policy"], rec["temperature"], rec["backend"]))
    if ref is None or ref.get("status") != "ok":
        rec["target_paired"] = rec["target_retention"] = None
        return
    rec["target_paired"] = paired_comparison(rec["per_prompt_tau"], ref["per_prompt_tau"], seed=seed)
    rec["target_retention"] = rec["tau"] / ref["tau"] if ref["tau"] else None


def sizing_bytes(ctx: Any, point: Point, drafter: Any) -> int:
    """Stored bytes of `point` built cheaply from `drafter` (a private copy of the base)."""
    from specpress.compress.quantize.api import quantize, stored_bytes
    from specpress.sweep.grid import Step
    from specpress.sweep.run import apply_step

    for step in point.steps:
        cfg = step.config()
        if step.kind == "prune":
            opts = {**dict(step.options), "recover_steps": 0}
            if cfg.structural:
                opts["importance"] = "magnitude"
            step = Step("prune", tuple(opts.items()))
        elif cfg.needs_data() or step.recovery() is not None:  # the same bytes without calibrating or
            # recovering (GPTQ -> RTN codes, scales fixed; recovery trains the values, not the storage)
            drafter = quantize(drafter, cfg.sizing_config(), None, float_dtype=ctx.stored_dtype())
            continue
        drafter = apply_step(ctx, drafter, step)
    return int(stored_bytes(drafter, ctx.stored_dtype()))


def failure_summary(records: list[dict[str, Any]]) -> str:
    """'' when every run succeeded, else 'N of M runs failed: point (policy): error; …'."""
    bad = [r for r in records if r.get("status") != "ok"]
    if not bad:
        return ""
    what = "; ".join(f"{r['point']} ({r.get('policy')}, T={r.get('temperature')}): {r.get('error')}" for r in bad[:5])
    return f"{len(bad)} of {len(records)} runs failed: {what}{' …' if len(bad) > 5 else ''}"


def parse_loss(text: str) -> float:
    """'3%' or '0.03' -> 0.03; must lie in (0, 1)."""
    s = str(text).strip()
    try:
        v = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise UsageError(f"--max-tau-loss {text!r}: give a percentage like 3% or a fraction like 0.03") from None
    if not 0 < v < 1:
        raise UsageError(f"--max-tau-loss {text!r} must lie strictly between 0 and 100 %")
    return v
