"""Optimization profiles: min / opt / max for every dynamic axis of an export, from the tree budget and
the context length.

The dynamic axes are read from the ONNX graphs themselves (each input's symbolic dims, which the export
manifest declares too), so the engines cover exactly what the export left dynamic. Each axis name is
classified by what it counts; an axis no rule knows is an error naming it and the flag that sets it.
No torch, no TensorRT: pure bookkeeping, unit-tested.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from specpress.errors import ConfigError


@dataclass(frozen=True)
class AxisRange:
    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.opt <= self.max or self.max == 0:
            raise ConfigError(f"an axis range needs 0 <= min <= opt <= max and max > 0, got "
                              f"{self.min}:{self.opt}:{self.max}")

    @classmethod
    def parse(cls, text: str) -> "AxisRange":
        """'MIN:OPT:MAX' (or one number N for a fixed size N:N:N)."""
        parts = text.split(":")
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            nums = []
        if len(nums) not in (1, 3):
            raise ConfigError(f"an axis range is MIN:OPT:MAX or N, got {text!r}")
        return cls(*(nums * 3 if len(nums) == 1 else nums))


@dataclass(frozen=True)
class Budget:
    """max_tree: most new positions one drafter call takes (tree budget / block size / prefill chunk);
    max_context: most positions the drafter's K/V holds. opt_* default to a typical round."""

    max_tree: int = 64
    max_context: int = 2048
    opt_tree: int | None = None
    opt_context: int | None = None

    def __post_init__(self) -> None:
        if self.max_tree < 1 or self.max_context < self.max_tree:
            raise ConfigError(f"need 1 <= max_tree <= max_context, got max_tree={self.max_tree}, "
                              f"max_context={self.max_context}")

    @property
    def tree(self) -> AxisRange:
        return AxisRange(1, self.opt_tree or min(self.max_tree, 16), self.max_tree)

    @property
    def prefill(self) -> AxisRange:
        """New positions in a prefill call: up to the whole context (the prompt's taps in one pass)."""
        return AxisRange(1, self.opt_context or min(self.max_context, 256), self.max_context)

    @property
    def context(self) -> AxisRange:
        return AxisRange(1, self.opt_context or min(self.max_context, 256), self.max_context)


# (pattern over the lower-cased axis name, kind); first match wins
_RULES: tuple[tuple[str, str], ...] = (
    (r"batch|^b$", "batch"),
    (r"word", "words"),
    (r"past|cache|context|ctx|slot|total|kv|key|memory", "context"),
    (r"tree|new|token|quer|seq|step|block|position|^t$|^n$|len", "tree"),
)


def classify(axis: str) -> str | None:
    """'tree_size' -> 'tree', 'past_len' -> 'context', 'mask_words' -> 'words', 'batch' -> 'batch'."""
    low = axis.lower()
    return next((kind for pattern, kind in _RULES if re.search(pattern, low)), None)


PHASES = ("draft", "prefill")  # one optimization profile each, in this order


def axis_range(axis: str, budget: Budget, phase: str = "draft") -> AxisRange:
    """The range of one dynamic axis in the profile for `phase` ("draft": a tree level / block / chain
    step, new positions <= max_tree; "prefill": new positions up to the context length)."""
    if phase not in PHASES:
        raise ConfigError(f"unknown profile phase {phase!r}; expected one of {PHASES}")
    kind = classify(axis)
    if kind == "batch":
        return AxisRange(1, 1, 1)
    new = budget.tree if phase == "draft" else budget.prefill
    if kind == "tree":
        return new
    if kind == "words":  # int32 words of the packed mask over the uncommitted slots (<= the new positions)
        t = new
        return AxisRange(1, math.ceil(t.opt / 32), math.ceil(t.max / 32))
    if kind == "context":
        c = budget.context
        # a past length may be 0 (the first call); other context axes count at least the new position
        return AxisRange(0 if "past" in axis.lower() else 1, c.opt, c.max)
    raise ConfigError(f"dynamic axis {axis!r} is not one specpress knows how to size (tree, context, mask words "
                      f"or batch); give it a range with --axis {axis}=MIN:OPT:MAX")


InputShapes = Mapping[str, tuple[int | str, ...]]  # input name -> dims (int, or the axis name when dynamic)


def sum_parts(axis: str, axes: set[str]) -> tuple[str, ...] | None:
    """'context_block' -> ('context', 'block') when both are axes of the same graph: a length that is their
    sum (DFlash's positions cover the context and then the block). Its range must be the sum of theirs,
    or the profile's min / opt / max shapes contradict the graph (a Concat of the two against it), which
    TensorRT for RTX 1.7 does not report but aborts on (heap corruption in the builder)."""
    parts = tuple(axis.split("_"))
    return parts if len(parts) > 1 and all(p in axes for p in parts) else None


def onnx_input_shapes(path: Path) -> dict[str, tuple[int | str, ...]]:
    """The graph inputs of an ONNX file (not initializers) -> dims, dynamic ones as their axis name."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    shapes: dict[str, tuple[int | str, ...]] = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        dims: list[int | str] = []
        for i, d in enumerate(inp.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.dim_param:
                dims.append(d.dim_param)
            else:
                raise ConfigError(f"input {inp.name!r} of {path.name} has an unnamed dynamic dim {i}; the export "
                                  f"must name its dynamic axes")
        shapes[inp.name] = tuple(dims)
    return shapes


Shapes = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


def profile_shapes(inputs: InputShapes, budget: Budget, overrides: Mapping[str, AxisRange] | None = None,
                   phase: str = "draft") -> Shapes:
    """input name -> (min, opt, max) shapes for the optimization profile of `phase`. Fixed inputs are
    included too (the manifest records every binding). `overrides` (axis -> range) apply to every phase.
    An axis named `a_b` after two other axes of the graph is sized as their sum (`sum_parts`)."""
    overrides = overrides or {}
    axes = {d for dims in inputs.values() for d in dims if isinstance(d, str)}
    ranges: dict[str, AxisRange] = {}
    sums = {axis: parts for axis in axes if axis not in overrides and (parts := sum_parts(axis, axes))}
    for axis in sorted(axes - set(sums)):
        ranges[axis] = overrides.get(axis) or axis_range(axis, budget, phase)
    for axis, parts in sorted(sums.items()):  # parts hold no "_", so none is a sum: all sized above
        rs = [ranges[p] for p in parts]
        ranges[axis] = AxisRange(sum(r.min for r in rs), sum(r.opt for r in rs), sum(r.max for r in rs))
    out = {}
    for name, dims in inputs.items():
        lo: list[int] = []
        mid: list[int] = []
        hi: list[int] = []
        for d in dims:
            if isinstance(d, str):
                r = ranges[d]
                lo.append(r.min)
                mid.append(r.opt)
                hi.append(r.max)
            else:
                lo.append(d)
                mid.append(d)
                hi.append(d)
        out[name] = (tuple(lo), tuple(mid), tuple(hi))
    return out


def profiles(inputs: InputShapes, budget: Budget, overrides: Mapping[str, AxisRange] | None = None
             ) -> dict[str, Shapes]:
    """phase -> its profile's shapes; a graph with no axis that differs between phases gets one profile."""
    out = {phase: profile_shapes(inputs, budget, overrides, phase) for phase in PHASES}
    return {"draft": out["draft"]} if out["draft"] == out["prefill"] else out
