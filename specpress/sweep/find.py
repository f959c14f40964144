"""`sweep --find-smallest`: the search of search.py run over a sweep's grid, once per target.

For each target of the recipe (the float one, then each `target_quant` copy) the search looks for the
smallest point whose τ retention against the base drafter ON THAT TARGET stays >= 1 - loss, on the recipe's
first policy / temperature / backend: "which drafter can I deploy beside an FP8 target?". Candidates are
sized once (their bytes do not depend on the target); every evaluation is a full run recorded in
results.jsonl. search.json holds the float target's search at the top level (the layout of a sweep without
`target_quant`) and, with compressed targets, every target's under `by_target`. A recipe with a `search:`
block adds its knob candidates to the grid's and prunes them all by a τ proxy first (knobs.py): search.json
then holds a `knobs` section too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specpress.errors import RequestError
from specpress.sweep import results as R

CRITERION = ("retention point estimate tau/tau_base >= 1 - max_tau_loss (pooled tau; paired CI reported, not "
             "required); tau_base is the base drafter's on the same target")


def find_smallest_per_target(sweep: Any, loss: float) -> Any:
    """Run the search for every target of `sweep`'s recipe; write search.json; return the float target's result."""
    from rich.progress import Progress

    from specpress.artifacts import write_json
    from specpress.sweep.search import Candidate
    from specpress.ticker import bar_columns

    labels = [t.label for t in sweep.recipe.targets]
    payloads: dict[str, dict[str, Any]] = {}
    results = {}
    with Progress(*bar_columns(), console=sweep.console, transient=True) as progress:
        cands, unsized = [], []
        search = sweep.recipe.search
        for p in (*sweep.recipe.points[1:], *(search.points if search else ())):
            try:
                cands.append(Candidate(p.id, sweep.point_bytes(p)))
            except Exception as exc:  # such a point cannot be built either: left out, and said so
                unsized.append({"point": p.id, "error": f"{type(exc).__name__}: {exc}"})
                sweep.log(f"{p.id}: cannot be sized ({exc}); left out of the search", style="red")
        for label in labels:
            results[label], payloads[label] = _search(sweep, loss, label, cands, progress)
            payloads[label]["unsized"] = unsized
    out = dict(payloads[labels[0]])
    if len(labels) > 1:
        out["by_target"] = payloads
    write_json(sweep.out / "search.json", out)
    return results[labels[0]]


def _search(sweep: Any, loss: float, label: str, cands: list[Any], progress: Any) -> tuple[Any, dict[str, Any]]:
    """One target's search (logged as it goes); (its SearchResult, its search.json entry)."""
    from specpress.sweep.report import fmt_bytes
    from specpress.sweep.search import Trial, find_smallest

    run = sweep.runs(primary_only=True, target=label)
    on = "" if label == R.FLOAT_TARGET else f" on target {label}"
    base = sweep.recipe.points[0]
    if sweep.missing(base, run):
        sweep.evaluate(base, run, progress)
    brec = R.latest(R.read_results(sweep.out))[R.run_key("base", *run[0])]
    if brec["status"] != "ok":
        raise RequestError(f"the base drafter's run{on} failed ({brec['error']}); nothing to compare against")
    fastest = sweep.recipe.search is not None and sweep.recipe.search.objective == "speed"
    sweep.log(f"searching {len(cands)} points (sorted by bytes){on} for the {'fastest' if fastest else 'smallest'} "
              f"with τ retention >= "
              f"{100 * (1 - loss):.1f} % of the base's τ {brec['tau']:.3f} ({run[0][0]}, T={run[0][1]:g})")

    speeds: dict[str, float | None] = {}  # speedup of each benched point (a speed objective picks by it)

    def evaluate(pid: str) -> Trial:
        point = sweep.recipe.point(pid)
        if sweep.missing(point, run):
            sweep.evaluate(point, run, progress)
        r = R.latest(R.read_results(sweep.out))[R.run_key(pid, *run[0])]
        speeds[pid] = r.get("speedup") if r["status"] == "ok" else None
        p = r.get("paired") or {}
        return Trial(pid, r.get("bytes"), r.get("retention") if r["status"] == "ok" else None,
                     tau=r.get("tau"), delta_tau=p.get("delta_tau"), ci=p.get("ci"), error=r.get("error"))

    knobs = None
    if sweep.recipe.search is None:
        result = find_smallest(cands, evaluate, 1 - loss)
    else:
        result, knobs = _search_knobs(sweep, loss, label, cands, evaluate, speeds.get)
    for i, t in enumerate(result.trials, 1):
        verdict = "error" if t.retention is None else ("pass" if t.passed else "fail")
        ret = "–" if t.retention is None else f"{100 * t.retention:.1f} %"
        sweep.log(f"  tried {i}: {t.id:<22} {fmt_bytes(t.bytes):>10}  retention {ret:>8}  {verdict}")
    if result.found and fastest:
        sweep.log(f"fastest point{on} keeping >= {100 * (1 - loss):.1f} % of τ: {result.found} (speedup "
                  f"{speeds[result.found]:.2f}×); benched {len(result.trials)} of {len(cands)} points", style="bold")
    elif result.found:
        t = next(t for t in result.trials if t.id == result.found)
        sweep.log(f"smallest point{on} keeping >= {100 * (1 - loss):.1f} % of τ: {result.found} "
                  f"({fmt_bytes(t.bytes)}, retention {100 * (t.retention or 0):.1f} %); evaluated "
                  f"{len(result.trials)} of {len(cands)} points", style="bold")
    else:
        sweep.log(f"no compressed point{on} keeps >= {100 * (1 - loss):.1f} % of τ (evaluated {len(result.trials)} "
                  f"of {len(cands)}): the base drafter is the smallest that does")
    payload = {"criterion": CRITERION, "max_tau_loss": loss, "policy": run[0][0], "temperature": run[0][1],
               "backend": run[0][2], "target_quant": label, "base_tau": brec["tau"], **result.to_dict()}
    if knobs is not None:
        payload["knobs"] = knobs
    return result, payload


def _search_knobs(sweep: Any, loss: float, label: str, cands: list[Any], evaluate: Callable[[str], Any],
                  speed: Callable[[str], float | None]) -> tuple[Any, dict[str, Any]]:
    """The proxy-pruned search of knobs.py over `cands` (logged); (its SearchResult, search.json's `knobs`)."""
    from specpress.sweep.knobs import search_knobs
    from specpress.sweep.report import fmt_bytes

    spec = sweep.recipe.search
    proxy, base = _proxy(sweep, label, spec.proxy_batches)
    floor, sizes = 1 - loss - spec.margin, {c.id: c.bytes for c in cands}
    sweep.log(f"taking the τ proxy of {len(cands)} candidates (each built; base proxy τ {base:.3f}); pruning those "
              f"under {100 * floor:.1f} % of the base's, then searching the rest by real τ")

    def logged(pid: str) -> float:
        try:
            p = proxy(pid)
        except Exception as exc:  # search_knobs records it and leaves the candidate out
            sweep.log(f"  proxy {pid}: cannot be built ({exc}); left out of the search", style="red")
            raise
        sweep.log(f"  proxy {pid:<22} {fmt_bytes(sizes[pid]):>10}  {100 * p:6.1f} %"
                  + ("  pruned (not benched)" if p < floor else ""))
        return p

    ks = search_knobs(cands, logged, evaluate, 1 - loss, spec.margin, speed if spec.objective == "speed" else None)
    out = {**ks.to_dict(cands, spec.margin), "objective": spec.objective, "proxy_batches": spec.proxy_batches,
           "base_proxy": base}
    if out["spearman"] is not None:
        sweep.log(f"proxy vs real retention: Spearman {out['spearman']:+.2f} over {out['spearman_n']} benched "
                  f"candidates")
    return ks.result, out


def _proxy(sweep: Any, label: str, batches: int) -> tuple[Callable[[str], float], float]:
    """(candidate id -> proxy retention, the base's proxy τ) against target `label`, on the recipe's calibration
    windows; taking a candidate's proxy builds its artifact as a run would (OUT/points/<id>, reused by it)."""
    from specpress.compress.agreement import agreement
    from specpress.models.drafter_io import load_drafter_for
    from specpress.sweep.knobs import tau_proxy
    from specpress.sweep.run import build_point

    ctx = sweep.ctx
    target = ctx.target_for(label)[0]
    sampler = ctx.windows(sweep.recipe.calibration)

    def proxy_tau(art: Any) -> float:
        drafter = load_drafter_for(target, art, warn=lambda m: None)
        return tau_proxy(agreement(target, drafter, sampler, batches))

    base = proxy_tau(ctx.base_dir)

    def proxy(pid: str) -> float:
        art, _ = build_point(ctx, sweep.recipe.point(pid), sweep.log)
        return proxy_tau(art) / base

    return proxy, base
