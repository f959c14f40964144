"""Bits where acceptance needs them: `quantize --budget SIZE --candidates LIST`, one scheme per Linear.

    budget = parse_budget("1.5MiB")                       # or "4.5bpp" (bits per parameter of the allocated Linears)
    cands = parse_candidates("int8,int4:g64,int4:g128")   # any registered scheme word, plus `float`
    quantize_to_budget(drafter, select, cands, budget, float_dtype=torch.bfloat16, probe=KLProbe(...))

1. Sensitivity: each selected Linear is quantized alone with each candidate (the scheme's own quantizer,
   so a newly registered scheme is a candidate with no change here), its stored bytes are counted as
   `stored_bytes` counts them, and its cost is scored:
     kl      the mean KL(float drafter || drafter with that one Linear quantized) of the draft distribution,
             teacher-forced on calibration windows of the target (`KLProbe`): one drafter forward per
             (Linear, candidate). Chosen over the drop in teacher-forced acc@1 because acc@1 moves in steps
             of 1/positions and is mostly exactly 0 for one Linear at 8 or 6 bits, so it cannot rank them;
             KL is smooth, and its first-order sum over Linears predicts the joint cost.
     weight  data-free proxy: the squared Frobenius error ||W - Q(W)||^2 of the weight (no target, no data;
             it ignores how much the drafter's output depends on each Linear).
2. Allocation: start every Linear at its smallest candidate (infeasible: a BudgetError naming that size), then
   repeatedly take the upgrade with the largest score decrease per extra byte that still fits (ties: Linear
   order, then candidate order). Deterministic; the bytes are exact (the sum of per-Linear bytes plus what
   is not allocated), checked against the quantized drafter's `stored_bytes`.
3. `quantize(..., per_module=...)` writes one "mixed" step (module_configs) with the allocation attached.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from specpress.compress.quantize.api import (
    check_quantizable,
    quantize,
    quantize_linears,
    round_floats,
    select_modules,
    stored_bytes,
    update_step,
)
from specpress.errors import ConfigError, RequestError, UsageError
from specpress.models.quantized.configs import QuantizeConfig
from specpress.models.quantized.restore import replace_module

FLOAT = "float"  # the candidate that keeps a Linear in the stored float dtype
MEASURES = ("kl", "weight")
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "kib": 1024, "mib": 1024 ** 2,
          "gib": 1024 ** 3}


class BudgetError(RequestError):
    """No allocation of the candidates fits the budget."""


@dataclass(frozen=True)
class Budget:
    text: str  # as the user wrote it
    nbytes: int | None = None  # total stored bytes of the drafter
    bpp: float | None = None  # bits per parameter of the allocated Linears (the rest stored as it is)

    def total(self, fixed: int, params: int) -> int:
        """The byte limit for the whole drafter, given the bytes not allocated and the allocated parameters."""
        return self.nbytes if self.nbytes is not None else fixed + math.floor(float(self.bpp) * params / 8)  # type: ignore[arg-type]


def parse_budget(text: str) -> Budget:
    """'1500000', '1.5MB', '1.5MiB', '900KiB' (the whole drafter's stored bytes) or '4.5bpp' (bits per
    parameter of the Linears allocated)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if m and unit == "bpp" and float(m.group(1)) > 0:
        return Budget(str(text), bpp=float(m.group(1)))
    if m and unit in _UNITS and float(m.group(1)) * _UNITS[unit] >= 1:
        return Budget(str(text), nbytes=math.floor(float(m.group(1)) * _UNITS[unit]))
    raise UsageError(f"--budget {text!r}: give stored bytes (1500000, 1.5MB, 1.5MiB, 900KiB) or bits per parameter "
                     f"of the quantized Linears (4.5bpp)")


@dataclass(frozen=True)
class Candidate:
    label: str  # int4-g64, int8, nf4-g64, float
    config: QuantizeConfig | None  # None: kept in float


def parse_candidates(text: str) -> tuple[Candidate, ...]:
    """'int8,int4:g64,int4:g128:gptq,float': WORD[:gN][:METHOD] per candidate, any registered scheme word;
    `float` keeps the Linear in the stored float dtype."""
    from specpress.models.quantized.names import BY_WORD, METHOD_WORDS
    from specpress.models.quantized.scheme import config_for

    out: list[Candidate] = []
    for item in (s.strip() for s in str(text).split(",")):
        if not item:
            continue
        word, *parts = item.split(":")
        if word == FLOAT and not parts:
            out.append(Candidate(FLOAT, None))
            continue
        if word not in BY_WORD:
            raise UsageError(f"--candidates {item!r}: unknown scheme {word!r}; choose from {', '.join(BY_WORD)} or "
                             f"float, each as WORD[:gN][:METHOD] (e.g. int4:g64)")
        group = method = None
        for p in parts:
            if re.fullmatch(r"g[0-9]+", p):
                group = int(p[1:])
            elif p in METHOD_WORDS:
                method = p
            else:
                raise UsageError(f"--candidates {item!r}: {p!r} is neither a group size (g64) nor a method "
                                 f"({', '.join(METHOD_WORDS)})")
        cfg = config_for(word, method, group_size=group)
        if cfg.needs_data():
            raise UsageError(f"--candidates {item!r} needs calibration data per Linear ({cfg.method}); the budget "
                             f"allocates calibration-free schemes: drop :{cfg.method}")
        label = cfg.storage_label()
        if method is not None and method != BY_WORD[word].default_method and method not in label.split("-"):
            label += f"-{method}"
        out.append(Candidate(label, cfg))
    labels = [c.label for c in out]
    if len(out) < 2 or len(set(labels)) != len(labels):
        raise UsageError(f"--candidates {text!r}: give at least two different schemes, e.g. int8,int4:g64")
    return tuple(out)


Probe = Callable[[nn.Module], float]  # the drafter's cost against the float drafter it was made from


class KLProbe:
    """Mean KL(float || model) of the draft distributions, teacher-forced on `batches` windows of the target's
    signals (the float drafter's log-probs are computed once, here)."""

    def __init__(self, target: Any, drafter: Any, sampler: Any, batches: int = 4) -> None:
        from specpress.compress.quantize.calibrate import DrafterCalibration

        self.calib = DrafterCalibration(target, drafter, sampler, batches)
        self.windows, self.tokens = self.calib.windows, self.calib.tokens
        self.reference = [lp for lp in self._logprobs(drafter)]

    @torch.no_grad()
    def _logprobs(self, d: Any) -> list[torch.Tensor]:
        from specpress.models.drafter import get_family
        from specpress.models.forced import input_features

        steps, out = d.draft_modules(), []
        for b in self.calib.batches:
            forced = get_family(d.family).teacher_forced(d, b.ids, input_features(d, b.hidden, b.taps), steps=steps,
                                                         span=b.ids.shape[1] - steps)
            out.append(torch.log_softmax(forced.draft_logits(d).float(), dim=-1))
        return out

    def __call__(self, model: nn.Module) -> float:
        total = count = 0.0
        for ref, lp in zip(self.reference, self._logprobs(model), strict=True):
            kl = (ref.exp() * (ref - lp)).sum(-1)
            total, count = total + float(kl.sum()), count + kl.numel()
        return total / max(count, 1.0)


def _module_bytes(m: nn.Module, fsize: int | None) -> int:
    """Stored bytes of one Linear or quantized module, as `stored_bytes` counts them (floats at `fsize`)."""
    quantized = set(getattr(m, "KEYS", ())) if getattr(m, "is_quantized", False) else set()
    return sum(t.numel() * (t.element_size() if k in quantized or fsize is None or not t.is_floating_point()
                            else fsize) for k, t in m.state_dict().items())


def sensitivities(model: nn.Module, names: list[str], candidates: tuple[Candidate, ...], *, measure: str,
                  float_dtype: torch.dtype | None, probe: Probe | None = None,
                  advance: Callable[[], None] = lambda: None) -> tuple[dict[str, dict[str, int]],
                                                                     dict[str, dict[str, float]], list[str]]:
    """(bytes[name][label], score[name][label], notes): each Linear quantized alone with each candidate, then
    put back. A candidate a Linear cannot take (a group size that does not divide it) is left out, noted."""
    if measure not in MEASURES:
        raise UsageError(f"--sensitivity {measure!r}: choose one of {', '.join(MEASURES)}")
    if measure == "kl" and probe is None:
        raise UsageError("--sensitivity kl runs the drafter on the target's hidden states: pass --target DIR and "
                         "--data PATH, or use --sensitivity weight (data-free)")
    fsize = None if float_dtype is None else torch.empty((), dtype=float_dtype).element_size()
    sizes: dict[str, dict[str, int]] = {}
    scores: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    for n in names:
        original = model.get_submodule(n)
        sizes[n], scores[n] = {}, {}
        for c in candidates:
            if c.config is None:
                sizes[n][c.label], scores[n][c.label] = _module_bytes(original, fsize), 0.0
                advance()
                continue
            try:
                check_quantizable(model, [n], c.config)
            except (ConfigError, RequestError) as e:
                notes.append(f"{n} cannot take {c.label}: {e}")
                advance()
                continue
            try:
                quantize_linears(model, [n], c.config, None, [])
                q = model.get_submodule(n)
                sizes[n][c.label] = _module_bytes(q, fsize)
                if measure == "kl":
                    scores[n][c.label] = float(probe(model))  # type: ignore[misc]
                else:
                    err = original.weight.detach().float() - q.dequantize(torch.float32)
                    scores[n][c.label] = float((err * err).sum())
            finally:
                replace_module(model, n, original)
            advance()
        if not sizes[n]:
            raise ConfigError(f"{n} can take none of the candidates ({'; '.join(notes[-len(candidates):])}); add "
                              f"float or a scheme it fits")
    return sizes, scores, notes


def allocate(sizes: Mapping[str, Mapping[str, int]], scores: Mapping[str, Mapping[str, float]], fixed: int,
             limit: int, order: tuple[str, ...]) -> dict[str, str]:
    """One candidate label per Linear with fixed + sum(bytes) <= limit, greedily minimising the summed score:
    start at each Linear's smallest candidate, then take the upgrade with the best score decrease per extra
    byte that fits, until none does. `order` (the candidates' labels) breaks ties."""
    rank = {lab: i for i, lab in enumerate(order)}

    def key(n: str, lab: str) -> tuple[int, float, int]:
        return sizes[n][lab], scores[n][lab], rank[lab]

    choice = {n: min(sizes[n], key=lambda lab, n=n: key(n, lab)) for n in sizes}  # type: ignore[misc]
    total = fixed + sum(sizes[n][choice[n]] for n in sizes)
    if total > limit:
        raise BudgetError(f"--budget allows {limit:,} bytes but the smallest allocation of these candidates stores "
                          f"{total:,} bytes ({total / 1024 ** 2:.3f} MiB): raise the budget or add smaller candidates")
    while True:
        best: tuple[float, int, int, str, str] | None = None
        for i, n in enumerate(sizes):
            cur = choice[n]
            for lab in sizes[n]:
                gain, extra = scores[n][cur] - scores[n][lab], sizes[n][lab] - sizes[n][cur]
                if gain <= 0 or total + extra > limit:
                    continue
                ratio = math.inf if extra <= 0 else gain / extra
                cand = (ratio, -i, -rank[lab], n, lab)
                if best is None or cand[:3] > best[:3]:
                    best = cand
        if best is None:
            return choice
        _, _, _, n, lab = best
        total += sizes[n][lab] - sizes[n][choice[n]]
        choice[n] = lab


def quantize_to_budget(model: nn.Module, select: QuantizeConfig, candidates: tuple[Candidate, ...], budget: Budget,
                       *, float_dtype: torch.dtype | None, measure: str = "kl", probe: Probe | None = None,
                       progress: bool = False) -> nn.Module:
    """Measure, allocate and quantize `model` in place (Linears chosen by `select`'s include / exclude);
    the allocation goes into the quantize step's `allocation`."""
    from specpress.ticker import count_bar

    t0 = time.monotonic()
    names, _ = select_modules(model, select)
    if not names:
        raise RequestError("nothing to allocate: every Linear is excluded or skipped")
    if float_dtype is not None:  # the float drafter as stored is the reference
        round_floats(model, float_dtype)
    fsize = None if float_dtype is None else torch.empty((), dtype=float_dtype).element_size()
    with count_bar(progress, f"sensitivity ({measure})", len(names) * len(candidates)) as advance:
        sizes, scores, notes = sensitivities(model, names, candidates, measure=measure, float_dtype=float_dtype,
                                             probe=probe, advance=advance)
    fixed = stored_bytes(model, float_dtype) - sum(_module_bytes(model.get_submodule(n), fsize) for n in names)
    params = sum(p.numel() for n in names for p in model.get_submodule(n).parameters())
    limit = budget.total(fixed, params)
    order = tuple(c.label for c in candidates)
    choice = allocate(sizes, scores, fixed, limit, order)
    predicted = fixed + sum(sizes[n][choice[n]] for n in names)
    by_label = {c.label: c.config for c in candidates}
    if all(by_label[choice[n]] is None for n in names):
        raise BudgetError(f"--budget {budget.text} ({limit:,} bytes) holds the drafter with every Linear in float "
                          f"({predicted:,} bytes): nothing to quantize; give a smaller budget")
    quantize(model, select, None, float_dtype=float_dtype, per_module={n: by_label[choice[n]] for n in names})
    measured = stored_bytes(model, float_dtype)
    if measured != predicted or measured > limit:
        raise RuntimeError(f"budget allocation predicted {predicted:,} bytes but the drafter stores {measured:,} "
                           f"(limit {limit:,}): a scheme's bytes are not additive per Linear")
    smallest = fixed + sum(min(s.values()) for s in sizes.values())
    largest = fixed + sum(max(s.values()) for s in sizes.values())
    update_step(model, allocation={
        "budget": budget.text, "budget_bytes": limit, "candidates": list(order), "sensitivity": measure,
        "choice": choice, "predicted_bytes": predicted, "measured_bytes": measured, "min_bytes": smallest,
        "max_bytes": largest, "predicted_cost": sum(scores[n][choice[n]] for n in names),
        "bytes": sizes, "scores": {n: {k: float(f"{v:.6g}") for k, v in s.items()} for n, s in scores.items()},
        "notes": notes, "seconds": round(time.monotonic() - t0, 2),
        **({"windows": getattr(probe, "windows", None)} if measure == "kl" else {})})
    return model
