"""Calibrated input scaling before integer rounding: SmoothQuant (int8 W8A8) and AWQ (int4 weight-only).

Both find a per-input-channel scale s [K] for each group of Linears that read one input (q/k/v, gate/up:
gptq.call_groups finds them), multiply the group's weights by s before rounding, and store 1/s as the
Linears' `pre_quant_scale`, which multiplies the input at run time: (x / s) · (W · s)ᵀ = x · Wᵀ before
rounding. Engines fold it into the preceding norm where there is one (TensorRT-LLM, Model Optimizer's
export) or apply it as stored (`pre_quant_scale`, Model Optimizer's name).

    SmoothQuant (Xiao et al. 2023)  s_j = max|x_j|^α / max_i |w_ij|^(1-α), α = 0.5: activation outliers move
                                    into the weights so both quantize to int8
    AWQ (Lin et al. 2023)           s_j = mean|x_j|^r, normalized to a geometric mean of 1, with r chosen from
                                    `grid` points in [0, 1) to minimize the group's output error on the
                                    calibration inputs after round-to-nearest int4 (the llm-awq search)
A Linear the calibration forward never ran is rounded to nearest without a scale (noted).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from specpress.compress.quantize.activations import collect_inputs
from specpress.compress.quantize.gptq import call_groups
from specpress.compress.quantize.handlers import ForwardLoop, register_handler
from specpress.models.quantized import primitives as P
from specpress.models.quantized.integer import AWQConfig, IntConfig, IntLinear, SmoothQuantConfig, quantize_rtn
from specpress.models.quantized.restore import replace_module

EPS = 1e-5


def _scaled_linear(lin: nn.Linear, s: Tensor, config: IntConfig) -> IntLinear:
    """`lin` with its weight times s [K] rounded to nearest, and 1/s as its pre_quant_scale."""
    w = lin.weight.detach().float() * s[None, :]
    q, sc, z = P.quantize_int(w, config.bits, config.group_size, config.symmetric)
    return IntLinear.from_codes(lin, q, sc, z, bits=config.bits, group_size=config.group_size,
                                symmetric=config.symmetric, act_mode=config.act_mode, pre_quant_scale=1.0 / s)


def _groups(model: nn.Module, names: list[str], calibration: ForwardLoop, config: IntConfig,
            notes: list[str]) -> tuple[list[list[str]], dict]:
    groups, uncalled = call_groups(model, names, calibration)
    if uncalled:
        notes.append(f"{config.method}: {', '.join(uncalled)} never ran in the calibration forward: rounded to "
                     f"nearest without a scale")
        quantize_rtn(model, uncalled, config, notes)
    return groups, collect_inputs(model, [g[0] for g in groups], calibration)


@register_handler(SmoothQuantConfig)
def quantize_smoothquant(model: nn.Module, names: list[str], config: SmoothQuantConfig,
                         calibration: ForwardLoop | None, notes: list[str]) -> None:
    assert calibration is not None
    groups, stats = _groups(model, names, calibration, config, notes)
    for group in groups:
        xmax = stats[group[0]].chan_amax
        assert xmax is not None
        wmax = torch.stack([model.get_submodule(n).weight.detach().float().abs().amax(dim=0) for n in group]).amax(0)
        s = (xmax.clamp(min=EPS) ** config.alpha / wmax.clamp(min=EPS) ** (1 - config.alpha)).clamp(min=EPS)
        s = torch.where(xmax > 0, s, torch.ones_like(s))  # a channel that never fired keeps its weight as it is
        for n in group:
            replace_module(model, n, _scaled_linear(model.get_submodule(n), s, config))
    notes.append(f"smoothquant: alpha {config.alpha} over {len(groups)} input groups; activations {config.activations}")


def _awq_scale(xmean: Tensor, r: float) -> Tensor:
    s = xmean.clamp(min=EPS) ** r
    return s / (s.max() * s.min()).sqrt()


@register_handler(AWQConfig)
def quantize_awq(model: nn.Module, names: list[str], config: AWQConfig, calibration: ForwardLoop | None,
                 notes: list[str]) -> None:
    assert calibration is not None
    groups, stats = _groups(model, names, calibration, config, notes)
    chosen = []
    for group in groups:
        x = stats[group[0]].rows_tensor()
        xmean = stats[group[0]].chan_absmean()
        lins = [model.get_submodule(n) for n in group]
        ref = [x @ lin.weight.detach().float().T for lin in lins]
        best_r, best_err = 0.0, float("inf")
        for i in range(config.grid):
            r = i / config.grid
            s = _awq_scale(xmean, r)
            err = 0.0
            for lin, y in zip(lins, ref):
                w = lin.weight.detach().float() * s[None, :]
                q, sc, z = P.quantize_int(w, config.bits, config.group_size, config.symmetric)
                err += float(((x / s) @ P.dequantize_int(q, sc, z).T - y).pow(2).mean())
            if err < best_err:
                best_r, best_err = r, err
        s = _awq_scale(xmean, best_r)
        for n, lin in zip(group, lins):
            replace_module(model, n, _scaled_linear(lin, s, config))
        chosen.append(f"{'/'.join(group)} r={best_r:.2f}")
    notes.append(f"awq: scale exponent per input group ({config.grid} grid points): {'; '.join(chosen)}")
