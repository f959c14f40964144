"""`specpress sweep`: the options parsed, then specpress.sweep.pipeline (sweep_request, run_sweep)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("recipe")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Output directory of the sweep.")
@click.option("--resume", is_flag=True, help="Continue a sweep in --out: runs already in results.jsonl are skipped.")
@click.option("--force", is_flag=True,
              help="Discard --out's previous results (another recipe's, or this one's); built artifacts whose "
                   "settings match are still reused.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Points measured at once: local, N worker processes with cores/N torch threads each "
                   "[default: 1]; ray, at most N tasks in flight [default: as many as the cluster's resources "
                   "allow].")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None,
              help="Where points run: local (this machine) or ray (one Ray task per point; pip install "
                   "'specpress[ray]')  [default: the recipe's executor:, else local]")
@click.option("--address", default=None,
              help="With --executor ray: the cluster to join (auto, ray://HOST:10001, HOST:6379); default: a "
                   "local Ray instance started for this sweep.")
@click.option("--find-smallest", is_flag=True,
              help="Search for the smallest drafter keeping tau (see --max-tau-loss) instead of running every "
                   "point: the grid's points, plus the recipe's `search:` knob ranges; with `search:` every "
                   "candidate is built and screened by a teacher-forced tau proxy (a few forward passes, no "
                   "speculative decoding) before the survivors are benched.")
@click.option("--tolerate-failures", is_flag=True,
              help="Exit 0 even when some points fail (they are recorded either way); the recipe key "
                   "`tolerate_failures: true` says the same.")
@click.option("--allow-large", is_flag=True,
              help="Run a grid of more than 64 points (refused without it, with the point count and a lower bound "
                   "on the time they take, so that a recipe expanding to hundreds of points does not start "
                   "unnoticed).")
@click.option("--max-tau-loss", default=None,
              help="With --find-smallest: the tau loss allowed, as 3% or 0.03 (retention >= 1 - loss)  [default: 3%]")
def sweep(recipe: str, out: Path, resume: bool, force: bool, jobs: int | None, executor: str | None,
          address: str | None, find_smallest: bool, tolerate_failures: bool, max_tau_loss: str | None,
          allow_large: bool) -> None:
    """Run a recipe: compress the base drafter every way its grid says and measure each on the same prompts.

    RECIPE is a YAML file (recipes/*.yaml) or the name of a bundled one (quickstart). Each grid point's
    drafter is built under OUT/points/<id>/ (reused when it exists), benched against the same prompts as
    the base drafter, and appended to OUT/results.jsonl with its bytes, tau, AR[k], acc@k, speedup and a
    paired comparison with the base (mean per-prompt delta tau, 95 % bootstrap CI). At the end:
    OUT/table.md, OUT/table.csv, OUT/plots/*.png|svg, and the Pareto front (bytes vs tau).

    A recipe (validated strictly: an unknown key names itself and the allowed keys) gives the target (a
    path or `zoo`), the base drafter (a path, or a `distill:` block: distilled once, cached under
    ~/.cache/specpress/drafters and reused), a grid of compression points (quantize schemes x group sizes
    x methods, prune ratios, draft-vocabulary sizes, and `chain:` lists of steps such as prune then
    quantize), policies, prompts (a file or held-out code), temperatures and the token budget, and
    optionally `target_quant:` (--target-quant specs such as fp8 or nvfp4:activations=static): every point is
    then measured against each compressed copy of the target too, after the float one, each run checked
    lossless against its own target and paired with the same point on the float target (Δτ and the
    target's greedy drift in a target-precision table, plots/tau_vs_target; --find-smallest searches once
    per target).
    A `search:` block (only read by --find-smallest) declares knob ranges as grid entries, e.g.
    `search: {knobs: [{prune: {head_rank: [32, 64], recover_steps: [0, 200]}}], margin: 0.05}`: their product
    joins the grid's points; each candidate is built and gets a tau proxy (teacher-forced acc@k with the target on
    the calibration windows, as an expected chain length over the base's); those under 1 - loss - margin are
    skipped unbenched, the rest searched by real tau, so the answer is always confirmed by real tau.
    search.json's `knobs` section has each candidate's bytes, proxy and real retention, and the proxy's Spearman
    correlation with real retention. `objective: speed` benches every candidate the proxy keeps and picks the
    fastest (highest measured speedup) that keeps tau, instead of the fewest bytes.
    float_dtype (default auto: bf16 for an fp32 base) is what compressed points store their remaining
    floats in; their bytes and tau are those of the stored drafter. Each results.jsonl line holds the
    settings, provenance, bytes, bits/param, tau, AR[k], per-prompt tau, the paired delta tau with its CI
    and whether it is resolved (the CI excludes 0), agreement with the target, tokens/s, speedup and
    lossless mismatches. A failed point is recorded and the sweep goes on; an output folder of another
    recipe is refused without --force.

    \b
    Examples:
      specpress sweep recipes/quickstart.yaml --out runs/quickstart
      specpress sweep recipes/quickstart.yaml --out runs/quickstart --resume --jobs 2
      specpress sweep recipes/eagle3.yaml --out runs/e3-search --find-smallest --max-tau-loss 3%
      specpress sweep quickstart --out /shared/runs/qs --executor ray --address auto

    With --executor ray every point (build + bench) is a Ray task reserving the recipe's executor.resources
    (default 1 CPU, 1 GPU when the cluster has GPUs, no memory reservation); a point whose worker dies is
    retried (executor.retries, default 2) and then recorded as failed. Workers write under OUT, so on a
    multi-node cluster OUT must be on a filesystem every node mounts at the same path (checked at start).
    """
    from specpress.sweep.pipeline import run_sweep, sweep_request

    req = sweep_request(recipe, executor=executor, address=address, find_smallest=find_smallest,
                        max_tau_loss=max_tau_loss, jobs=jobs, tolerate_failures=tolerate_failures,
                        allow_large=allow_large)
    run_sweep(req, out, resume=resume, force=force)
