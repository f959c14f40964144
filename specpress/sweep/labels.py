"""Point labels that stay apart: each label takes the first of a ring of offsets around its point where it
overlaps no label placed before it, no other point's marker, and stays inside the axes (or, when none does,
the offset overlapping least), with a thin leader line once it sits away from its point. Extents come from
the Agg renderer after the figure's layout has run, so what is checked is what is drawn."""

from __future__ import annotations

from typing import Any, Sequence

MARKER_PX = 5.0  # half-size of the box kept clear around every point's marker, in pixels
FONT = 7


def _offsets() -> list[tuple[float, float, str]]:
    """(dx, dy) in points and horizontal alignment: beside the point first, then further above / below."""
    out: list[tuple[float, float, str]] = [(5, 3, "left"), (5, -10, "left"), (-5, 3, "right"), (-5, -10, "right")]
    for step in range(1, 6):
        d = 10 * step
        out += [(5, 3 + d, "left"), (5, -10 - d, "left"), (-5, 3 + d, "right"), (-5, -10 - d, "right")]
    return out


def _overlap(a: Any, b: Any) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def place_labels(fig: Any, ax: Any, items: Sequence[tuple[str, float, float]]) -> list[Any]:
    """Annotate `items` (text, x, y in data coordinates) on `ax` without collisions; returns the annotations."""
    from matplotlib.transforms import Bbox

    if not items:
        return []
    fig.canvas.draw()  # run the layout once: the extents measured below are those saved
    fig.set_layout_engine("none")
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    pts = [ax.transData.transform((x, y)) for _, x, y in items]
    markers = [Bbox.from_extents(px - MARKER_PX, py - MARKER_PX, px + MARKER_PX, py + MARKER_PX) for px, py in pts]
    placed: list[Any] = []
    texts = []
    for i in sorted(range(len(items)), key=lambda j: (pts[j][0], -pts[j][1])):
        text, x, y = items[i]
        others = placed + [m for j, m in enumerate(markers) if j != i]
        best = None
        for dx, dy, ha in _offsets():
            far = abs(dy) > 12
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), ha=ha, fontsize=FONT,
                              arrowprops=dict(arrowstyle="-", linewidth=0.5, color="0.4") if far else None)
            box = ann.get_window_extent(renderer)
            outside = box.x0 < frame.x0 or box.x1 > frame.x1 or box.y0 < frame.y0 or box.y1 > frame.y1
            cost = sum(_overlap(box, o) for o in others) + (1e6 if outside else 0.0)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, ann, box)
            else:
                ann.remove()
            if cost == 0:
                break
        assert best is not None
        placed.append(best[2])
        texts.append(best[1])
    return texts


__all__ = ["place_labels"]
