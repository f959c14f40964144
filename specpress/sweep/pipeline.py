"""The CLI's path for `specpress sweep`: recipe and options -> checked request -> the sweep run in OUT -> its records.

    req = sweep_request("recipes/quickstart.yaml", jobs=2)  # or find_smallest=True, max_tau_loss="3%"
    rep = run_sweep(req, "runs/quickstart")  # resume=True continues, force=True replaces OUT's results
    print(rep.records[0]["tau"], rep.failed or "every run succeeded")

`sweep_request` refuses the option combinations the command refuses (the same UsageError messages, in the same
order), loads the recipe and resolves where points run (the recipe's executor:, --executor, --address; Ray is
required before any work when it is chosen). `run_sweep` claims OUT, opens the sweep (driver.Sweep), runs every
point or searches for the smallest (--find-smallest), finalizes (results.jsonl, tables, plots, printed as it
goes on the sweep's console) and returns the records; failed points raise SweepFailed unless tolerated.

Importing this module does not import torch (`specpress sweep --help` must not).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specpress.sweep.executors import ExecutorSpec
from specpress.sweep.recipe import Recipe


@dataclass(frozen=True)
class SweepRequest:
    """One sweep, checked (sweep_request): what run_sweep takes."""

    recipe: Recipe
    executor: ExecutorSpec  # resolved: the recipe's, then --executor / --address
    find_smallest: bool = False
    loss: float = 0.03  # with find_smallest: the tau loss allowed (retention >= 1 - loss)
    jobs: int | None = None
    tolerate_failures: bool = False  # --tolerate-failures (the recipe's own key is read from `recipe`)


@dataclass
class SweepReport:
    out: Path
    records: list[dict[str, Any]]  # one per run (the last of each), as results.jsonl holds them after finalize
    failed: str  # driver.failure_summary: '' when every run succeeded
    sweep: Any  # the driver.Sweep that ran (its ctx, its console)


def sweep_request(recipe: str | Path, *, executor: str | None = None, address: str | None = None,
                  find_smallest: bool = False, max_tau_loss: str | None = None, jobs: int | None = None,
                  tolerate_failures: bool = False, allow_large: bool = False) -> SweepRequest:
    """Check one combination of sweep's options and load the recipe (a YAML path or a bundled name).

    executor: "local" or "ray" (None: the recipe's executor:, else local); address: the Ray cluster to join;
    max_tau_loss: "3%" or "0.03", only with find_smallest (default 3%). allow_large: run a grid of more than
    LARGE_GRID points (sweep/size.py). Raises UsageError naming the option.
    """
    from specpress.errors import UsageError
    from specpress.sweep.driver import parse_loss
    from specpress.sweep.executors import require_ray
    from specpress.sweep.recipe import load_recipe

    if max_tau_loss is not None and not find_smallest:
        raise UsageError("--max-tau-loss only applies with --find-smallest")
    loss = parse_loss(max_tau_loss or "3%")
    r = load_recipe(str(recipe))
    spec = r.executor or ExecutorSpec()
    if executor is not None and executor != spec.kind:
        spec = replace(spec, kind=executor, address=None)
    if address is not None:
        if spec.kind != "ray":
            raise UsageError("--address only applies with --executor ray")
        spec = replace(spec, address=address)
    if spec.kind == "ray":
        require_ray()  # before any work: without Ray, say how to install it
    if not find_smallest:  # a search measures a few of the points, not every one
        from specpress.sweep.size import check_grid

        check_grid(r, recipe, allow_large)
    return SweepRequest(r, spec, find_smallest, loss, jobs, tolerate_failures)


def run_sweep(req: SweepRequest, out: str | Path, *, resume: bool = False, force: bool = False,
              console: Any = None) -> SweepReport:
    """Claim `out`, run the sweep (every point, or the --find-smallest search), finalize; the records.

    resume: skip the runs already in out/results.jsonl; force: discard out's previous results. console: the rich
    Console the sweep logs on (stderr by default). Raises SweepFailed when a run failed and neither
    req.tolerate_failures nor the recipe's tolerate_failures accepts it (the message says what failed).
    """
    from specpress.artifacts import claim_output
    from specpress.sweep.driver import Sweep, failure_summary

    out = Path(out)
    r, spec, jobs = req.recipe, req.executor, req.jobs
    inputs = {"target": r.target.path, "drafter": r.drafter.path, "prompts": r.prompts.path,
              "calibration": r.calibration.path, "agreement_data": r.agreement_data.path, "recipe": r.source}
    # what is already in --out (a sweep to resume or replace, or something else) is the Sweep's to check;
    # a second sweep into the same --out fails at once
    with claim_output(out, force=force, inputs=inputs, in_place=True):
        s = Sweep(r, out, console, resume=resume, force=force)
        s.open()
        try:
            if req.find_smallest:
                if (jobs or 1) > 1 or spec.kind != "local":
                    s.log("--find-smallest evaluates one point at a time (each choice depends on the last), in this "
                          "process; --jobs and --executor ignored")
                s.find_smallest(req.loss)
            else:
                s.run_all(jobs=jobs, executor=spec)
        except KeyboardInterrupt:
            from specpress.errors import Interrupted
            from specpress.sweep.results import RESULTS, latest, read_results

            done = sum(rec.get("status") == "ok" for rec in latest(read_results(out)).values())
            raise Interrupted(f"interrupted: {done} finished run(s) kept in {out / RESULTS} (the run in progress is "
                              f"lost); to continue, run the same command again with --resume") from None
        records = s.finalize()
    failed = failure_summary(records)
    if failed and (req.tolerate_failures or r.tolerate_failures):
        s.log(f"{failed} (tolerated: {'--tolerate-failures' if req.tolerate_failures else 'tolerate_failures: true'})")
    elif failed:
        from specpress.errors import SweepFailed

        raise SweepFailed(f"{failed}; every other result is in {out}. Fix the points, or pass --tolerate-failures "
                          f"(recipe: tolerate_failures: true) to accept failed points")
    return SweepReport(out, records, failed, s)
