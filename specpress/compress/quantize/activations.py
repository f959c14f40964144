"""Static activation scales: what each quantized Linear's input looks like on calibration data, and the
`input_scale` that --act-calibration chooses from it (models/quantized/activations.py defines the rules).

    stats = collect_inputs(model, names, forward_loop)        # amax and a sample of input rows per Linear
    calibrate_inputs(model, names, config, forward_loop, notes)   # sets every static module's input_scale

While inputs are collected every quantized module passes its input through unquantized (ModelOpt's
calibration mode): the scales are found on the inputs the float activations produce, with the weights
already quantized. A module's input is what its activation quantizer sees: after its pre_quant_scale.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from specpress.errors import UsageError
from specpress.models.quantized.activations import parse_calibration
from specpress.models.quantized.modules import QuantizedLinear, quantized_modules

ForwardLoop = Callable[[nn.Module], None]
SAMPLE_ROWS = 2048  # input rows kept per Linear (a uniform sample of every row seen) for percentile and mse
MSE_FRACTIONS = torch.linspace(0.25, 1.0, 16)  # amax candidates searched by mse, as fractions of the max


@dataclass
class InputStats:
    """The running amax of one Linear's inputs and a reservoir sample of its rows."""

    k: int
    seed: int
    amax: float = 0.0
    rows: int = 0
    sample: list[Tensor] = field(default_factory=list)
    chan_amax: Tensor | None = None  # [K] max |x| per input channel (SmoothQuant)
    chan_abssum: Tensor | None = None  # [K] sum of |x| per input channel (AWQ's mean |x|)

    def add(self, x: Tensor) -> None:
        x = x.detach().reshape(-1, self.k).float().cpu()
        if not len(x):
            return
        ax = x.abs()
        self.amax = max(self.amax, float(ax.max()))
        cmax, csum = ax.amax(dim=0), ax.sum(dim=0)
        self.chan_amax = cmax if self.chan_amax is None else torch.maximum(self.chan_amax, cmax)
        self.chan_abssum = csum if self.chan_abssum is None else self.chan_abssum + csum
        g = torch.Generator().manual_seed(self.seed + self.rows)
        self.rows += len(x)
        held = sum(len(t) for t in self.sample)
        if held + len(x) <= SAMPLE_ROWS:
            self.sample.append(x.clone())
            return
        # keep each row seen so far with equal probability: replace into a flat reservoir
        pool = torch.cat([*self.sample, x])
        keep = torch.randperm(len(pool), generator=g)[:SAMPLE_ROWS]
        self.sample = [pool[keep.sort().values]]

    def rows_tensor(self) -> Tensor:
        return torch.cat(self.sample) if self.sample else torch.zeros(0, self.k)

    def chan_absmean(self) -> Tensor:
        return torch.zeros(self.k) if self.chan_abssum is None else self.chan_abssum / max(self.rows, 1)


@contextmanager
def calibrating(model: nn.Module) -> Iterator[None]:
    """Every quantized module passes its input through unquantized for the duration."""
    mods = list(quantized_modules(model).values())
    before = [m.calibrating for m in mods]
    for m in mods:
        m.calibrating = True
    try:
        yield
    finally:
        for m, b in zip(mods, before):
            m.calibrating = b


def collect_inputs(model: nn.Module, names: list[str], forward_loop: ForwardLoop) -> dict[str, InputStats]:
    """Run `forward_loop(model)` once (activation quantizers off) and record each named module's inputs."""
    stats: dict[str, InputStats] = {}
    handles = []
    for i, name in enumerate(names):
        mod = model.get_submodule(name)
        st = stats[name] = InputStats(mod.in_features, seed=1009 * i)

        def hook(m: Any, args: tuple[Tensor, ...], st: InputStats = st) -> None:
            x = args[0]
            st.add(x * m.pre_quant_scale.to(x.dtype) if getattr(m, "pre_quant_scale", None) is not None else x)

        handles.append(mod.register_forward_pre_hook(hook))
    try:
        with calibrating(model), torch.no_grad():
            forward_loop(model)
    finally:
        for h in handles:
            h.remove()
    return stats


def choose_amax(mod: QuantizedLinear, st: InputStats, method: str) -> float:
    """The activation amax --act-calibration `method` picks for module `mod` from its inputs `st`."""
    cal = parse_calibration(method)
    if cal.kind == "max":
        return st.amax
    rows = st.rows_tensor()
    if cal.kind == "percentile":
        assert cal.value is not None
        return float(torch.quantile(rows.abs().flatten()[:16_000_000], cal.value / 100))
    assert cal.kind == "mse"
    best, best_err = st.amax, float("inf")
    saved = mod.input_scale.clone()
    try:
        for f in MSE_FRACTIONS.tolist():
            amax = f * st.amax
            mod.input_scale.copy_(mod.input_scale_for(torch.tensor(amax)))
            err = float((mod.quantize_input(rows) - rows).pow(2).mean())
            if err < best_err:
                best, best_err = amax, err
    finally:
        mod.input_scale.copy_(saved)
    return best


def calibrate_inputs(model: nn.Module, names: list[str], config: Any, forward_loop: ForwardLoop | None,
                     notes: list[str]) -> dict[str, float]:
    """Set the input_scale of every named module in static mode per the config's act_calibration; returns
    name -> the activation amax chosen (recorded in the provenance step)."""
    static = [n for n in names if model.get_submodule(n).act_mode == "static"]
    if not static:
        return {}
    cal = parse_calibration(config.act_calibration)
    amax: dict[str, float] = {}
    if cal.kind == "fixed":
        assert cal.value is not None
        amax = {n: cal.value for n in static}
    elif cal.kind == "weights":
        amax = {n: float(model.get_submodule(n).dequantize(torch.float32).abs().max()) for n in static}
    else:
        if forward_loop is None:
            raise UsageError(f"--activations static with --act-calibration {cal} measures the activations: pass "
                             f"--target DIR and --data PATH (or --act-calibration fixed:V)")
        stats = collect_inputs(model, static, forward_loop)
        unseen = [n for n in static if stats[n].rows == 0]
        if unseen:
            notes.append(f"activations: {', '.join(unseen)} never ran in the calibration forward: input amax 1.0")
        amax = {n: choose_amax(model.get_submodule(n), stats[n], str(cal)) if stats[n].rows else 1.0 for n in static}
        rows = sorted({stats[n].rows for n in static})
        notes.append(f"activations: static input scales by {cal} on {rows[0]:,}-{rows[-1]:,} input rows per Linear")
    with torch.no_grad():
        for n in static:
            mod = model.get_submodule(n)
            mod.input_scale.copy_(mod.input_scale_for(torch.tensor(max(amax[n], 1e-12))))
    return {n: round(v, 6) for n, v in amax.items()}
