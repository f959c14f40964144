"""GPTQ (Frantar et al. 2022, arXiv:2210.17323) for the drafter's Linears, on CPU.

Per Linear with calibration inputs X [M, K]: H = 2·XᵀX / M (+ damp·mean(diag H)·I). With U the upper
Cholesky factor of H⁻¹, columns are quantized left to right; column i's rounding error e = (w_i - q_i) / U_ii
is spread over the columns still to come (W[:, j] -= e·U_ij, j > i), in lazy blocks of `block_size`
columns. Group-wise scales are chosen on the already-updated weights when a group's first column is
reached (the reference implementation's static_groups=False); per-channel scales come from the whole
row up front. No act-order. An input channel that calibration never exercised (diag H = 0) gets
H_ii = 1, so its column is simply rounded (its weight is kept, not zeroed: it may matter at run time).

`gptq_model` drives it over a model: a forward hook records which Linears read the very same input
tensor (q/k/v, gate/up), and in `sequential` mode each such group is calibrated on inputs that already
flow through the quantized groups before it (one pass of the forward loop per group).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from specpress.compress.quantize.handlers import ForwardLoop, register_handler
from specpress.errors import RequestError
from specpress.models.quantized import lowbit as LB
from specpress.models.quantized import primitives as P
from specpress.models.quantized.integer import GPTQConfig, IntLinear, quantize_rtn
from specpress.models.quantized.lowbit import LowBitGPTQConfig
from specpress.models.quantized.restore import replace_module
from specpress.ticker import count_bar


GroupParams = Callable[[Tensor], tuple[Tensor, Tensor]]  # one group's weights [N, G] -> (scales, zeros) [N, 1]


def gptq_codes(w: Tensor, h: Tensor, *, bits: int, group_size: int | None, symmetric: bool, damp: float = 0.01,
               block_size: int = 128, params: GroupParams | None = None,
               qrange: tuple[int, int] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """W [N, K], H [K, K] -> (codes [N, K] int16, scales [N, K/G] f32, zeros [N, K/G] f32). params / qrange: a
    scheme's own scale rule and code range (the low-bit schemes'; default: int-`bits` codes, int_params)."""
    params = params or (lambda g: P.int_params(g, bits, None, symmetric))
    w = w.detach().float().cpu().clone()  # on CPU whatever the model's device (the loop is column by column)
    n, k = w.shape
    h = h.detach().to("cpu", torch.float64, copy=True)
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0
    u = _inverse_cholesky(h, damp)
    ng = P.num_groups(k, group_size)
    g = k if group_size is None else group_size
    scales = torch.empty(n, ng)
    zeros = torch.empty(n, ng)
    if group_size is None:
        s, z = params(w)
        scales[:, 0], zeros[:, 0] = s[:, 0], z[:, 0]
    q = torch.empty(n, k, dtype=torch.int16)
    for b0 in range(0, k, block_size):
        b1 = min(b0 + block_size, k)
        wb = w[:, b0:b1].clone()
        err = torch.zeros_like(wb)
        ub = u[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            gi = col // g
            if group_size is not None and col % g == 0:
                # the group's scale from its current (error-compensated) weights
                grp = torch.cat([wb[:, i:], w[:, b1:]], dim=1)[:, :g]
                s, z = params(grp)
                scales[:, gi], zeros[:, gi] = s[:, 0], z[:, 0]
            wi = wb[:, i:i + 1]
            qi = P.quantize_with(wi, scales[:, gi:gi + 1], zeros[:, gi:gi + 1], bits, symmetric, qrange)
            q[:, col] = qi[:, 0]
            deq = P.dequantize_int(qi, scales[:, gi:gi + 1], zeros[:, gi:gi + 1])
            e = (wi - deq) / ub[i, i]
            wb[:, i:] -= e @ ub[i:i + 1, i:]
            err[:, i:i + 1] = e
        w[:, b1:] -= err @ u[b0:b1, b1:]
    return q, scales, zeros


def _inverse_cholesky(h: Tensor, damp: float) -> Tensor:
    """Upper Cholesky factor of (H + λI)⁻¹ (float32), λ = damp·mean(diag H); λ grows ×10 if H is not
    positive definite, up to 4 times."""
    mean = float(torch.diagonal(h).mean())
    for attempt in range(5):  # at most three K x K float64 matrices at a time (at K = 14,336: 1.6 GB each)
        lam = damp * (10 ** attempt) * mean
        a = h.clone()
        a.diagonal().add_(lam)
        chol, info = torch.linalg.cholesky_ex(a)
        del a
        if int(info) == 0:
            hinv = torch.cholesky_inverse(chol)
            del chol
            u, info = torch.linalg.cholesky_ex(hinv, upper=True)
            del hinv
            if int(info) == 0:
                return u.float()
    raise RequestError(f"GPTQ: the calibration Hessian is not positive definite even with damping "
                       f"{damp * 1e4:g}x its mean diagonal; give more or more varied calibration data")


# ----------------------------------------------------------------------------------------------
# Driving GPTQ over a model
# ----------------------------------------------------------------------------------------------


@dataclass
class _Hessian:
    h: Tensor | None = None
    rows: int = 0

    def add(self, x: Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).float()
        xtx = x.T @ x
        self.h = xtx if self.h is None else self.h + xtx
        self.rows += x.shape[0]

    def value(self) -> Tensor:
        assert self.h is not None
        return 2 * self.h / max(self.rows, 1)


@dataclass
class _Calls:
    order: list[str] = field(default_factory=list)  # first-call order
    leaders: dict[str, list[str]] = field(default_factory=dict)  # per call: the Linear whose input it shared


def call_groups(model: nn.Module, names: list[str], forward_loop: ForwardLoop) -> tuple[list[list[str]], list[str]]:
    """(groups of Linears that always read the same input tensor, in call order; names never called)."""
    calls = _Calls()
    last: list = [None, None]  # (input tensor object, leader name); the reference keeps its id unique

    def hook(name: str) -> Callable:
        def fn(_mod: nn.Module, args: tuple) -> None:
            x = args[0]
            leader = last[1] if x is last[0] else name
            last[0], last[1] = x, leader
            if name not in calls.leaders:
                calls.order.append(name)
                calls.leaders[name] = []
            calls.leaders[name].append(leader)
        return fn

    handles = [model.get_submodule(n).register_forward_pre_hook(hook(n)) for n in names]
    try:
        forward_loop(model)
    finally:
        for hd in handles:
            hd.remove()
    last[0] = None
    groups: dict[str, list[str]] = {}
    for name in calls.order:
        seq = calls.leaders[name]
        lead = seq[0]
        ok = all(s == lead for s in seq) and lead in calls.leaders and all(s == lead for s in calls.leaders[lead])
        groups.setdefault(lead if ok else name, []).append(name)
    return list(groups.values()), [n for n in names if n not in calls.leaders]


def collect_hessians(model: nn.Module, names: list[str], forward_loop: ForwardLoop) -> dict[str, tuple[Tensor, int]]:
    """(H = 2·XᵀX/M, M) of the inputs X [M, K] entering each named Linear over one run of the forward loop."""
    acc = {n: _Hessian() for n in names}
    handles = [model.get_submodule(n).register_forward_pre_hook(lambda _m, args, n=n: acc[n].add(args[0]))
               for n in names]
    try:
        forward_loop(model)
    finally:
        for hd in handles:
            hd.remove()
    return {n: (a.value(), a.rows) for n, a in acc.items() if a.rows}


@register_handler(GPTQConfig)
def quantize_gptq(model: nn.Module, names: list[str], config: GPTQConfig, calibration: ForwardLoop | None,
                  notes: list[str]) -> None:
    """GPTQ codes for the named Linears, group by group (q/k/v share a Hessian, as do gate/up)."""

    def codes(lin: nn.Linear, h: Tensor) -> nn.Module:
        q, s, z = gptq_codes(lin.weight, h, bits=config.bits, group_size=config.group_size,
                             symmetric=config.symmetric, damp=config.damp, block_size=config.block_size)
        return IntLinear.from_codes(lin, q, s, z, bits=config.bits, group_size=config.group_size,
                                    symmetric=config.symmetric)

    _gptq_model(model, names, config, calibration, notes, codes, quantize_rtn)


@register_handler(LowBitGPTQConfig)
def quantize_gptq_lowbit(model: nn.Module, names: list[str], config: LowBitGPTQConfig,
                         calibration: ForwardLoop | None, notes: list[str]) -> None:
    """GPTQ codes for int3 / int2 / ternary: the same column loop, each group's scale by the low-bit rule
    (fp16-representable; ternary's mean |w|) on the error-compensated weights."""
    fmt, g, sym = config.format, config.group_size, config.symmetric

    def codes(lin: nn.Linear, h: Tensor) -> nn.Module:
        q, s, z = gptq_codes(lin.weight, h, bits=LB.BITS[fmt], group_size=g, symmetric=sym, damp=config.damp,
                             block_size=config.block_size, qrange=LB.code_range(fmt, sym),
                             params=lambda grp: LB.rtn_params(grp, fmt, grp.shape[1], sym))
        return LB.LowBitLinear.from_codes(lin, q, s, z, format=fmt, group_size=g, symmetric=sym)

    _gptq_model(model, names, config, calibration, notes, codes, LB.quantize_rtn)


def _gptq_model(model: nn.Module, names: list[str], config: Any, calibration: ForwardLoop | None, notes: list[str],
                codes: Callable[[nn.Linear, Tensor], nn.Module],
                rtn: Callable[[nn.Module, list[str], Any, list[str]], None]) -> None:
    """Drive GPTQ over the named Linears: `codes(linear, H)` makes one Linear's module, `rtn` rounds the ones
    calibration never ran."""
    assert calibration is not None
    if getattr(calibration, "progress", False):
        from rich.console import Console

        Console(stderr=True).print(f"gptq: a first calibration pass groups the {len(names)} Linears by input "
                                   f"(then one pass per group)", highlight=False)
    groups, uncalled = call_groups(model, names, calibration)
    if uncalled:
        notes.append(f"gptq: {', '.join(uncalled)} never ran in the calibration forward: rounded to nearest")
        rtn(model, uncalled, config, notes)
    if not config.sequential:
        hs = collect_hessians(model, [g[0] for g in groups], calibration)
    thin = []
    label = f"gptq: {len(groups)} groups of Linears" + (", one calibration pass each" if config.sequential else "")
    with count_bar(getattr(calibration, "progress", False), label, len(groups)) as advance:
        for group in groups:
            h, rows = collect_hessians(model, [group[0]], calibration)[group[0]] if config.sequential else hs[group[0]]
            k = model.get_submodule(group[0]).in_features
            if rows < 2 * k:
                thin.append(f"{'/'.join(group)} ({rows} rows for {k} inputs)")
            for name in group:
                replace_module(model, name, codes(model.get_submodule(name), h))
            del h
            advance()
    if thin:
        notes.append(f"gptq: few calibration rows for {', '.join(thin)}; with fewer than 2x in_features rows the "
                     f"codes can overfit the calibration windows: give more --calib-batches / --seq-len")
