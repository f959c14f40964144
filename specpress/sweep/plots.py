"""Sweep plots, each as PNG and SVG under OUT/plots/ (matplotlib's object API with the Agg canvas: no pyplot,
no global backend switch):

    tau_vs_bytes      tau against drafter bytes (log x), one panel per policy / temperature / backend: each
                      compressed point with its paired 95 % CI as an error bar (the CI of the per-prompt
                      delta tau vs the base, placed around the point's tau), the Pareto front (smaller bytes,
                      higher tau) as a step line, retention (tau / base tau, %) on the right axis, the base
                      drafter's size at 16 bits as a dashed line; the tau axis spans at least 80-105 % of the base
    speedup_vs_bytes  measured speedup against drafter bytes (log x)
    acceptance        per-position acceptance AR[k] = P(accepted >= k) per point, one panel per series
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specpress.artifacts import atomic_file
from specpress.sweep.labels import place_labels
from specpress.sweep.report import group_title, groups

FORMATS = ("png", "svg")


def _figure(w: float = 7.0, h: float = 4.5) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, out: Path, name: str) -> list[Path]:
    paths = []
    for fmt in FORMATS:
        p = out / f"{name}.{fmt}"
        with atomic_file(p) as tmp:
            fig.savefig(tmp, dpi=120, format=fmt)
        paths.append(p)
    return paths


def _scatter(records: list[dict[str, Any]], field: str, ylabel: str) -> Any:
    fig = _figure()
    ax = fig.add_subplot()
    for (key, rows), marker in zip(groups(records).items(), "osD^v<>px"):
        ok = [r for r in rows if r["status"] == "ok" and r.get(field) is not None and r.get("bytes")]
        if not ok:
            continue
        ax.scatter([r["bytes"] for r in ok], [r[field] for r in ok], marker=marker, label=group_title(key))
    ax.set_xscale("log")
    ax.set_xlabel("drafter bytes (stored, log scale)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ok = [r for r in records if r["status"] == "ok" and r.get(field) is not None and r.get("bytes")]
    place_labels(fig, ax, [(r["point"], r["bytes"], r[field]) for r in ok])
    return fig


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] == "ok" and r.get("tau") is not None and r.get("bytes")]


def tau_interval(rec: dict[str, Any]) -> tuple[float, float] | None:
    """The point's 95 % interval on tau: its paired delta-tau CI vs the base, placed around its tau
    (tau - (delta - ci_low), tau + (ci_high - delta)); None for the base or without a CI."""
    p = rec.get("paired") or {}
    if p.get("ci") is None or p.get("delta_tau") is None:
        return None
    lo, hi = p["ci"]
    return rec["tau"] - (p["delta_tau"] - lo), rec["tau"] + (hi - p["delta_tau"])


def tau_limits(ok: list[dict[str, Any]], intervals: list[tuple[float, float]], base_tau: float | None
               ) -> tuple[float, float]:
    """The tau axis: every point and interval, and at least 80-105 % of the base's tau (so a 1 % and a 6 %
    loss look as different as they are), never below 1 (no speculation)."""
    lo = min([r["tau"] for r in ok] + [a for a, _ in intervals])
    hi = max([r["tau"] for r in ok] + [b for _, b in intervals])
    if base_tau:
        lo, hi = min(lo, 0.8 * base_tau), max(hi, 1.05 * base_tau)
    pad = 0.04 * (hi - lo or 1.0)
    return max(1.0, lo - pad), hi + pad


def _tau_panel(fig: Any, ax: Any, rows: list[dict[str, Any]], title: str) -> None:
    ok = _ok(rows)
    base = next((r for r in ok if r["point"] == "base"), None)
    sc = ax.scatter([r["bytes"] for r in ok], [r["tau"] for r in ok], zorder=3)
    color = sc.get_facecolor()[0]
    with_ci = [(r, iv) for r in ok if (iv := tau_interval(r)) is not None]
    if with_ci:
        ax.errorbar([r["bytes"] for r, _ in with_ci], [r["tau"] for r, _ in with_ci],
                    yerr=[[r["tau"] - iv[0] for r, iv in with_ci], [iv[1] - r["tau"] for r, iv in with_ci]],
                    fmt="none", ecolor=color, elinewidth=1.2, capsize=3, label="95 % CI (paired Δτ vs base)")
    f = sorted((r["bytes"], r["tau"]) for r in ok if r.get("pareto"))
    if f:
        ax.step([b for b, _ in f], [t for _, t in f], where="post", color=color, linewidth=1.2, alpha=0.7,
                label="Pareto front")
        ax.scatter([b for b, _ in f], [t for _, t in f], s=140, facecolors="none", edgecolors=color)
    if base is not None and base.get("params"):
        ax.axvline(2 * base["params"], color="gray", linestyle="--", linewidth=1,
                   label="base drafter at 16-bit")
    ax.set_xscale("log")
    ax.set_ylim(*tau_limits(ok, [iv for _, iv in with_ci], None if base is None else base["tau"]))
    if base is not None and base["tau"]:
        b = float(base["tau"])
        ret = ax.secondary_yaxis("right", functions=(lambda t: 100 * t / b, lambda p: p * b / 100))
        ret.set_ylabel("retention (% of base τ)")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("drafter bytes (stored, log scale)")
    ax.set_ylabel("τ (tokens per target forward)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")


def _tau_vs_bytes(records: list[dict[str, Any]]) -> Any:
    gs = {k: rows for k, rows in groups(records).items() if _ok(rows)} or groups(records)
    fig = _figure(7.0, 4.5 * max(1, len(gs)))
    axes = [fig.add_subplot(max(1, len(gs)), 1, i + 1) for i in range(max(1, len(gs)))]
    for ax, (key, rows) in zip(axes, gs.items()):
        _tau_panel(fig, ax, rows, group_title(key))
    for ax, rows in zip(axes, gs.values()):
        place_labels(fig, ax, [(r["point"], r["bytes"], r["tau"]) for r in _ok(rows)])
    return fig


def _acceptance(records: list[dict[str, Any]]) -> Any:
    gs = groups(records)
    fig = _figure(7.0, 3.2 * max(1, len(gs)))
    for i, (key, rows) in enumerate(gs.items()):
        ax = fig.add_subplot(max(1, len(gs)), 1, i + 1)
        ok = [r for r in rows if r["status"] == "ok"]
        depth = max((len(r.get("ar") or []) for r in ok), default=0)
        for r in ok:  # AR[k] is 0 beyond the deepest acceptance a point reached: pad to the series' depth
            ar = list(r.get("ar") or []) + [0.0] * (depth - len(r.get("ar") or []))
            if ar:
                ax.plot(range(1, depth + 1), ar, marker="o", markersize=3, label=r["point"])
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(group_title(key), fontsize=9)
        ax.set_xlabel("draft position k")
        ax.set_ylabel("AR[k] = P(accepted ≥ k)")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, ncol=2)
    return fig


def write_plots(out: Path, records: list[dict[str, Any]]) -> list[Path]:
    """Write the three plots (PNG + SVG) into OUT/plots/; returns the paths written."""
    pdir = Path(out) / "plots"
    pdir.mkdir(parents=True, exist_ok=True)
    paths = _save(_tau_vs_bytes(records), pdir, "tau_vs_bytes")
    paths += _save(_scatter(records, "speedup", "speedup vs plain decoding"), pdir, "speedup_vs_bytes")
    paths += _save(_acceptance(records), pdir, "acceptance")
    return paths
