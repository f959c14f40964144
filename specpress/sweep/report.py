"""The sweep's tables: table.md (one table per policy / temperature / backend), table.csv, and a rich table.

Columns: point, bytes, bytes as % of the base drafter stored in 16-bit (its params x 2 bytes), bits/param,
tau, retention (tau / base tau), paired delta tau [95 % CI], resolved (the CI excludes 0), acc@1
(top-1 agreement with the target at draft position 1), speedup, lossless (greedy mismatches / prompts),
front (on the Pareto front of smaller bytes / higher tau); in a table with a reduced draft vocabulary (EAGLE-3)
also vocab coverage: the share of the target's emitted tokens on the sweep's prompts that the draft vocabulary holds,
beside the share `prune --vocab` recorded on its ranking data (runtime/coverage.py). A point whose evaluation
coverage is more than COVERAGE_GAP (3 points) below its calibration coverage gets a warning under the table.
In a table where some point reads target tensors in place of its own (a shared draft head: `prune
--share-head`), a "shared" column after bytes gives those bytes (inspect's shared_bytes), counted apart.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Iterable

from specpress.runtime.coverage import coverage_warning

HEADERS = ("point", "bytes", "% base@16-bit", "bits/param", "τ", "retention", "Δτ [95 % CI]", "resolved", "acc@1",
           "speedup", "lossless", "front")
COVERAGE = "vocab coverage eval / calib"  # a column only in tables with a reduced-vocabulary drafter
SHARED = "shared"  # a column only in tables where some point reads target bytes in place of its own
CSV_FIELDS = ("point", "policy", "temperature", "backend", "status", "bytes", "shared_bytes", "bytes_pct_base16",
              "bits_per_param",
              "tau", "retention", "delta_tau", "ci_low", "ci_high", "resolved", "acc1", "speedup",
              "lossless_mismatches", "eval_coverage", "calibration_coverage", "prompts", "pareto", "steps", "error")


def group_key(rec: dict[str, Any]) -> tuple[str, float, str]:
    return rec["policy"], float(rec["temperature"]), rec["backend"]


def group_title(key: tuple[str, float, str]) -> str:
    return f"policy {key[0]}, temperature {key[1]:g}, backend {key[2]}"


def groups(records: Iterable[dict[str, Any]]) -> dict[tuple[str, float, str], list[dict[str, Any]]]:
    """Records per (policy, temperature, backend): the base first, then by bytes (largest first), failures last."""
    out: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(group_key(r), []).append(r)
    for rows in out.values():
        rows.sort(key=lambda r: (r["status"] != "ok", r["point"] != "base", -(r.get("bytes") or 0), r["point"]))
    return out


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "–"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _f(v: Any, spec: str, default: str = "–") -> str:
    return default if v is None else format(v, spec)


def headers(rows: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """HEADERS, with the coverage column before "front" when some record drafts a reduced vocabulary, and the
    shared column after "bytes" when some record reads target bytes in place of its own."""
    rows = list(rows)
    out = HEADERS
    if any(r.get("shared_bytes") for r in rows):
        out = out[:2] + (SHARED,) + out[2:]
    if any(r.get("eval_coverage") is not None for r in rows):
        out = out[:-1] + (COVERAGE, out[-1])
    return out


def cells(rec: dict[str, Any], coverage: bool = False, shared: bool = False) -> list[str]:
    """The display cells of one record (HEADERS order; with `coverage` / `shared`, headers() order)."""
    if rec["status"] != "ok":
        err = str(rec.get("error") or "failed").splitlines()[0]
        return [rec["point"], f"failed: {err[:80]}"] + [""] * (len(HEADERS) + coverage + shared - 2)
    paired = rec.get("paired")
    if paired and paired.get("delta_tau") is not None:
        ci = paired.get("ci")
        delta = f"{paired['delta_tau']:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")
        resolved = "yes" if paired["resolved"] else "no"
    else:
        delta = resolved = "–"
    acc = rec.get("agreement") or []
    mism = rec.get("lossless_mismatches")
    return [rec["point"], fmt_bytes(rec.get("bytes")),
            *([fmt_bytes(rec.get("shared_bytes")) if rec.get("shared_bytes") else "–"] if shared else []),
            _f(rec.get("bytes_pct_base16"), ".1f") + " %",
            _f(rec.get("bits_per_param"), ".2f"), _f(rec.get("tau"), ".3f"),
            _f(None if rec.get("retention") is None else 100 * rec["retention"], ".1f") + " %", delta, resolved,
            _f(acc[0] if acc else None, ".3f"), _f(rec.get("speedup"), ".2f") + "×",
            "n/a" if mism is None else f"{mism}/{rec.get('prompts')}", *([coverage_cell(rec)] if coverage else []),
            "yes" if rec.get("pareto") else ""]


def coverage_cell(rec: dict[str, Any]) -> str:
    """"88.5 / 94.9 %" (evaluation / calibration coverage), "88.5 / – %" without a prune --vocab, "–" for a
    drafter that drafts the target's whole vocabulary."""
    ev, cal = rec.get("eval_coverage"), rec.get("calibration_coverage")
    if ev is None:
        return "–"
    return f"{100 * ev:.1f} / " + ("–" if cal is None else f"{100 * cal:.1f}") + " %" + (
        " ⚠" if coverage_warning(ev, cal) else "")


def coverage_warnings(rows: Iterable[dict[str, Any]]) -> list[str]:
    """One line per ok record whose evaluation coverage falls well below its calibration coverage."""
    return [f"{r['point']}: {w}" for r in rows if r["status"] == "ok"
            and (w := coverage_warning(r.get("eval_coverage"), r.get("calibration_coverage")))]


def markdown(records: list[dict[str, Any]], title: str = "") -> str:
    parts = [f"# {title}\n" if title else ""]
    for key, rows in groups(records).items():
        parts.append(f"## {group_title(key)}\n")
        n = rows[0].get("prompts")
        parts.append(f"{n} prompts, {rows[0].get('max_new_tokens')} new tokens each; Δτ: mean per-prompt τ "
                     f"change vs the base on the same prompts, 95 % bootstrap CI; resolved = CI excludes 0.\n")
        cols = headers(rows)
        parts.append("| " + " | ".join(cols) + " |")
        parts.append("|" + "|".join("---" for _ in cols) + "|")
        for r in rows:
            row = cells(r, COVERAGE in cols, SHARED in cols)
            parts.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        parts.append("")
        parts.extend(f"**Warning** {w}\n" for w in coverage_warnings(rows))
    return "\n".join(parts)


def csv_text(records: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for rows in groups(records).values():
        for r in rows:
            p = r.get("paired") or {}
            ci = p.get("ci") or [None, None]
            acc = r.get("agreement") or [None]
            w.writerow({"point": r["point"], "policy": r["policy"], "temperature": r["temperature"],
                        "backend": r["backend"], "status": r["status"], "bytes": r.get("bytes"),
                        "shared_bytes": r.get("shared_bytes"),
                        "bytes_pct_base16": r.get("bytes_pct_base16"), "bits_per_param": r.get("bits_per_param"),
                        "tau": r.get("tau"), "retention": r.get("retention"), "delta_tau": p.get("delta_tau"),
                        "ci_low": ci[0], "ci_high": ci[1], "resolved": p.get("resolved"), "acc1": acc[0],
                        "speedup": r.get("speedup"), "lossless_mismatches": r.get("lossless_mismatches"),
                        "eval_coverage": r.get("eval_coverage"),
                        "calibration_coverage": r.get("calibration_coverage"), "prompts": r.get("prompts"),
                        "pareto": r.get("pareto"),
                        "steps": " -> ".join(next(iter(s)) + " " + str(next(iter(s.values()))) for s in r["steps"]),
                        "error": r.get("error")})
    return buf.getvalue()


def write_tables(out: Path, records: list[dict[str, Any]], title: str = "") -> list[Path]:
    md, cs = Path(out) / "table.md", Path(out) / "table.csv"
    from specpress.artifacts import write_file

    write_file(md, markdown(records, title))
    write_file(cs, csv_text(records))
    return [md, cs]


def rich_tables(records: list[dict[str, Any]]) -> list[Any]:
    from rich.markup import escape
    from rich.table import Table

    tables = []
    for key, rows in groups(records).items():
        t = Table(title=group_title(key), title_justify="left")
        cols = headers(rows)
        for h in cols:
            t.add_column(h, justify="left" if h in ("point", "Δτ [95 % CI]") else "right", overflow="fold")
        for r in rows:
            style = "red" if r["status"] != "ok" else ("bold" if r.get("pareto") else None)
            t.add_row(*(escape(c) for c in cells(r, COVERAGE in cols, SHARED in cols)), style=style)
        warnings = coverage_warnings(rows)
        if warnings:
            t.caption = "\n".join("warning: " + w for w in warnings)
            t.caption_justify, t.caption_style = "left", "yellow"
        tables.append(t)
    return tables
