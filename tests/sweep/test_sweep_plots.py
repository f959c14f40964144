"""tau_vs_bytes: error bars from the paired CIs, a retention axis, the 16-bit size, labels that stay apart."""

from __future__ import annotations

import pytest
from matplotlib.container import ErrorbarContainer
from matplotlib.text import Annotation

from specpress.sweep.plots import _tau_vs_bytes, tau_interval, write_plots

PARAMS = 1_000_000


def rec(point, nbytes, tau, delta=None, ci=None, pareto=False, policy="chain:4"):
    return {"point": point, "status": "ok", "bytes": nbytes, "tau": tau, "params": PARAMS, "policy": policy,
            "temperature": 0.0, "backend": "torch", "pareto": pareto, "ar": [0.8, 0.5],
            "speedup": 1.5, "paired": None if delta is None else {"delta_tau": delta, "ci": ci, "resolved": True}}


RECORDS = [rec("base", 2 * PARAMS, 3.0, pareto=True),
           rec("int8", PARAMS, 2.98, -0.02, [-0.05, 0.01]),
           rec("int4-g64-gptq", 290_000, 2.80, -0.20, [-0.26, -0.14], pareto=True),
           rec("nf4-g64", 292_000, 2.81, -0.19, [-0.25, -0.12]),  # the quickstart's colliding pair
           rec("fp8", 1_010_000, 2.97, -0.03, [-0.07, 0.00])]


def test_tau_interval_places_the_paired_ci_around_the_points_tau():
    assert tau_interval(RECORDS[2]) == pytest.approx((2.74, 2.86))
    assert tau_interval(RECORDS[0]) is None  # the base is the reference: no interval


def test_tau_plot_has_error_bars_retention_axis_16bit_line_and_separate_labels():
    fig = _tau_vs_bytes(RECORDS)
    ax = fig.axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()
    spans = sorted((round(s[0][1], 6), round(s[1][1], 6)) for s in segments)
    assert spans == sorted((round(a, 6), round(b, 6)) for a, b in (tau_interval(r) for r in RECORDS[1:]))
    assert any(c.get_ylabel() == "retention (% of base τ)" for c in ax.child_axes)
    assert any(list(line.get_xdata()) == [2 * PARAMS, 2 * PARAMS] for line in ax.get_lines())
    lo, hi = ax.get_ylim()
    assert lo <= 0.8 * 3.0 and hi >= 1.05 * 3.0 and lo >= 1.0  # not zoomed onto the points: 80-105 % at least
    renderer = fig.canvas.get_renderer()
    boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts if isinstance(t, Annotation)}
    assert set(boxes) == {r["point"] for r in RECORDS}
    names = sorted(boxes)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not boxes[a].overlaps(boxes[b]), (a, b)


def test_one_panel_per_series_and_pngs_written(tmp_path):
    other = [dict(r, policy="chain:2", tau=r["tau"] - 0.5) for r in RECORDS]
    fig = _tau_vs_bytes(RECORDS + other)
    assert len([a for a in fig.axes if a.get_xscale() == "log"]) == 2
    paths = write_plots(tmp_path, RECORDS)
    assert (tmp_path / "plots" / "tau_vs_bytes.png") in paths and all(p.stat().st_size > 1000 for p in paths)
