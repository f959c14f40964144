"""The sweep's output directory: recipe.json (which recipe it belongs to) and results.jsonl (one run a line).

results.jsonl is appended by the parent process only, one JSON object per run, flushed as each run ends,
so an interrupted sweep loses at most the run in progress. A run that is re-measured (a failed run retried
on --resume) appends a new line; the last line of a run key wins, and `finalize` rewrites the file with
one line per run (atomically) carrying the `pareto` flags.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable

from specpress.errors import RequestError
from specpress.readback import parse_json, read_json_object
from specpress.sweep.recipe import Recipe

RESULTS = "results.jsonl"
RECIPE = "recipe.json"
OUTPUTS = (RESULTS, "table.md", "table.csv", "search.json", "plots")  # what --force clears (points/ is kept)


def run_key(point_id: str, policy: str, temperature: float, backend: str) -> str:
    return f"{point_id}|{policy}|T={float(temperature):g}|{backend}"


def record_key(rec: dict[str, Any]) -> str:
    return run_key(rec["point"], rec["policy"], rec["temperature"], rec["backend"])


def guard_out(out: Path, recipe: Recipe, *, resume: bool, force: bool) -> None:
    """Claim `out` for `recipe`: refuse another recipe's results (unless force) and finished results of
    this one without --resume (unless force); force clears the previous outputs (built artifacts under
    points/ stay and are reused when their key matches)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RequestError(f"--out {out} exists and is not a directory")
    rfile = out / RECIPE
    if out.is_dir() and any(out.iterdir()):
        if not rfile.is_file():  # --force clears a sweep's outputs; it never writes into a foreign directory
            from specpress.artifacts import dir_listing

            raise RequestError(f"--out {out} is not empty and holds no {RECIPE}: not a sweep output directory (it "
                               f"holds {dir_listing(out)}); --force replaces only a sweep's outputs: remove it by hand "
                               f"or choose another --out")
        else:
            old = read_json_object(rfile, f"it is not a sweep's {RECIPE}: remove {out} by hand or choose another --out",
                                   error=RequestError)
            n = len(read_results(out))
            if old.get("hash") != recipe.hash() and not force:
                raise RequestError(f"--out {out} holds results of a different recipe ({old.get('source')}, hash "
                                   f"{old.get('hash')}; this one is {recipe.hash()}); choose another --out, or pass "
                                   f"--force to discard them")
            if old.get("hash") == recipe.hash() and n and not (resume or force):
                raise RequestError(f"--out {out} already holds {n} result(s) of this recipe; pass --resume to continue "
                                   f"(finished runs are skipped) or --force to start over")
        if force:
            for name in OUTPUTS:
                p = out / name
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    write_recipe(out, recipe)


def write_recipe(out: Path, recipe: Recipe) -> None:
    from specpress import __version__
    from specpress.artifacts import write_json

    write_json(out / RECIPE, {"hash": recipe.hash(), "source": str(recipe.source) if recipe.source else None,
                              "specpress": __version__, "recipe": recipe.to_dict(),
                              "skipped": list(recipe.skipped)})


def read_results(out: Path) -> list[dict[str, Any]]:
    """Every line of results.jsonl (a torn last line, from a kill mid-write, is ignored)."""
    f = Path(out) / RESULTS
    if not f.is_file():
        return []
    recs = []
    lines = f.read_bytes().decode("utf-8", "replace").splitlines()  # a bad byte fails its line's JSON below
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        where, fix = f"{f}:{i + 1}", "fix or remove that line"
        try:
            rec = parse_json(line, where, fix, error=RequestError)
        except RequestError:
            if i != len(lines) - 1:
                raise
            continue
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), (str, int, float)) and rec.get(k) is not None
                                                for k in ("point", "policy", "temperature", "backend")):
            raise RequestError(f"{where} is not a sweep result (an object with point, policy, temperature and "
                               f"backend); {fix}")
        recs.append(rec)
    return recs


def latest(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last record of each run key, in first-seen order."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        out[record_key(r)] = r
    return out


def append_result(out: Path, rec: dict[str, Any]) -> None:
    path = Path(out) / RESULTS
    if path.is_file() and path.stat().st_size:
        data = path.read_bytes()
        if not data.endswith(b"\n"):  # a line cut short by a kill: drop it before appending
            with open(path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def rewrite_results(out: Path, records: list[dict[str, Any]]) -> None:
    from specpress.artifacts import write_file

    write_file(Path(out) / RESULTS, "".join(json.dumps(r) + "\n" for r in records))
