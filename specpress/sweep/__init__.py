"""Sweeps: recipe -> grid of compression chains -> points (built, benched on the same prompts, paired with the
base drafter) -> results.jsonl + table.md / table.csv + plots + the Pareto front.

    recipe.py   strict YAML recipes (frozen dataclasses)      grid.py     steps, points, product expansion
    context.py  target / base drafter / prompts / data        run.py      one point: build, acc@k, bench
    results.py  OUT/recipe.json guard, results.jsonl          stats.py    paired bootstrap CI, Pareto front
    report.py   table.md / table.csv / rich tables            plots.py    PNG + SVG plots
    search.py   --find-smallest                               driver.py   the loop (serial or --jobs N)
    pipeline.py the CLI's path: sweep_request, run_sweep

Importing this package loads no torch; the modules that need it import it when they run.
"""
