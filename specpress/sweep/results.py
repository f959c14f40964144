"""The sweep's output directory: recipe.json (which recipe it belongs to) and results.jsonl (one run a line).

results.jsonl is appended by the parent process only, one JSON object per run, flushed as each run ends,
so an interrupted sweep loses at most the run in progress. A run that is re-measured (a failed run retried
on --resume) appends a new line; the last line of a run key wins, and `finalize` rewrites the file with
one line per run (atomically) carrying the `pareto` flags.
"""

from __future__ import annotations

import json
import math
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


FLOAT_TARGET = "float"  # the label of the uncompressed target (compress/quantize/target.py FLOAT_LABEL)


def run_key(point_id: str, policy: str, temperature: float, backend: str, target: str = FLOAT_TARGET) -> str:
    """One run's key; a compressed target (a recipe's `target_quant`) adds `|target=<label>`."""
    key = f"{point_id}|{policy}|T={float(temperature):g}|{backend}"
    return key if target == FLOAT_TARGET else f"{key}|target={target}"


def record_key(rec: dict[str, Any]) -> str:
    return run_key(rec["point"], rec["policy"], rec["temperature"], rec["backend"],
                   rec.get("target_quant", FLOAT_TARGET))


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
    """Every line of results.jsonl, each checked as a record (`check_record`: a line edited by hand is refused,
    naming the file and line). A last line without its newline is a write a kill cut short: it is dropped
    (`torn_line` says so), and its run is measured again."""
    f = Path(out) / RESULTS
    if not f.is_file():
        return []
    data = f.read_bytes()
    lines = data.decode("utf-8", "replace").splitlines()  # a bad byte fails its line's JSON below
    if lines and not data.endswith(b"\n"):
        lines = lines[:-1]
    recs, where = [], []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        at, fix = f"{f}:{i + 1}", FIX
        rec = parse_json(line, at, fix, error=RequestError)
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), (str, int, float)) and rec.get(k) is not None
                                                for k in ("point", "policy", "temperature", "backend")):
            raise RequestError(f"{at} is not a sweep result (an object with point, policy, temperature and "
                               f"backend); {fix}")
        check_record(rec, at)
        recs.append(rec)
        where.append(at)
    check_retention(recs, where)
    return recs


FIX = "a result is what the sweep measured: remove that line to measure its run again (--resume)"


def torn_line(out: Path) -> int | None:
    """The number of results.jsonl's last line when a kill cut it short (no newline), else None."""
    f = Path(out) / RESULTS
    if not f.is_file():
        return None
    data = f.read_bytes()
    return data.count(b"\n") + 1 if data and not data.endswith(b"\n") else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_record(rec: dict[str, Any], where: str) -> None:
    """A record's schema and invariants, as the sweep writes them: status ok or failed; an ok run's bytes a
    positive integer, its tau (and each prompt's) between 1 and the policy's longest accepted path + 1 (the
    bonus token), its retention a number or null. A RequestError naming `where` (file:line) otherwise."""
    from specpress.errors import ConfigError
    from specpress.runtime.policy import parse_policy

    def bad(what: str) -> RequestError:
        return RequestError(f"{where}: {what}; {FIX}")

    status = rec.get("status")
    if status not in ("ok", "failed"):
        raise bad(f"status must be 'ok' or 'failed', found {status!r}")
    if status != "ok":
        return
    n = rec.get("bytes")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise bad(f"bytes must be a positive integer (the drafter's stored bytes), found {n!r}")
    try:
        most = parse_policy(str(rec["policy"])).max_depth + 1
    except (ConfigError, RequestError, ValueError):
        raise bad(f"policy {rec['policy']!r} is not a draft policy") from None
    if not isinstance(rec.get("per_prompt_tau", []), list):
        raise bad(f"per_prompt_tau must be a list, found {rec.get('per_prompt_tau')!r}")
    taus = [("tau", rec.get("tau"))] + [(f"per_prompt_tau[{i}]", t) for i, t in enumerate(rec.get("per_prompt_tau")
                                                                                      or [])]
    for name, tau in taus:
        if not _number(tau) or not 1 <= tau <= most:
            raise bad(f"{name} must be between 1 and {most} (policy {rec['policy']}: at most {most - 1} drafted "
                      f"tokens accepted a round, plus the target's own), found {tau!r}")
    ret = rec.get("retention")
    if ret is not None and not _number(ret):
        raise bad(f"retention must be a number or null, found {ret!r}")


def check_retention(recs: list[dict[str, Any]], where: list[str]) -> None:
    """Each ok run's retention is its tau over the base drafter's on the same run (1 for the base itself), to
    rounding: against a base tau recorded in the file for that run (a base measured again may have replaced
    one), so an edited tau or retention is refused."""
    bases: dict[str, list[float]] = {}
    for r in recs:
        if r["point"] == "base" and r.get("status") == "ok":
            bases.setdefault(record_key(r), []).append(r["tau"])
    for r, at in zip(recs, where):
        ret = r.get("retention")
        if r.get("status") != "ok" or ret is None:
            continue
        key = run_key("base", r["policy"], r["temperature"], r["backend"], r.get("target_quant", FLOAT_TARGET))
        ratios = [1.0] if r["point"] == "base" else [r["tau"] / b for b in bases.get(key, []) if b]
        if ratios and not any(math.isclose(ret, x, rel_tol=1e-6) for x in ratios):
            raise RequestError(f"{at}: retention {ret!r} is not tau / base tau ({', '.join(f'{x:.6g}' for x in ratios)}"
                               f"); {FIX}")


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
