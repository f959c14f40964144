"""Sweep plots, each as PNG and SVG under OUT/plots/ (matplotlib's object API with the Agg canvas: no pyplot,
no global backend switch):

    tau_vs_bytes      tau against drafter bytes (log x), one series per policy / temperature / backend,
                      the Pareto front (smaller bytes, higher tau) drawn as a step line
    speedup_vs_bytes  measured speedup against drafter bytes (log x)
    acceptance        per-position acceptance AR[k] = P(accepted >= k) per point, one panel per series
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
        fig.savefig(p, dpi=120)
        paths.append(p)
    return paths


def _scatter(records: list[dict[str, Any]], field: str, ylabel: str, front: bool) -> Any:
    fig = _figure()
    ax = fig.add_subplot()
    for (key, rows), marker in zip(groups(records).items(), "osD^v<>px"):
        ok = [r for r in rows if r["status"] == "ok" and r.get(field) is not None and r.get("bytes")]
        if not ok:
            continue
        sc = ax.scatter([r["bytes"] for r in ok], [r[field] for r in ok], marker=marker, label=group_title(key))
        for r in ok:
            ax.annotate(r["point"], (r["bytes"], r[field]), textcoords="offset points", xytext=(4, 3), fontsize=7)
        if front:
            f = sorted((r["bytes"], r[field]) for r in ok if r.get("pareto"))
            if f:
                ax.step([b for b, _ in f], [t for _, t in f], where="post", color=sc.get_facecolor()[0],
                        linewidth=1.2, alpha=0.7, label="Pareto front")
                ax.scatter([b for b, _ in f], [t for _, t in f], s=140, facecolors="none",
                           edgecolors=sc.get_facecolor()[0])
    ax.set_xscale("log")
    ax.set_xlabel("drafter bytes (stored, log scale)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
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
    paths = _save(_scatter(records, "tau", "τ (tokens per target forward)", True), pdir, "tau_vs_bytes")
    paths += _save(_scatter(records, "speedup", "speedup vs plain decoding", False), pdir, "speedup_vs_bytes")
    paths += _save(_acceptance(records), pdir, "acceptance")
    return paths
