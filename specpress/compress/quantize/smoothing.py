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
                                    calibration inputs after round-to-nearest int4 (the llm-awq search);
                                    then, with `clip` (llm-awq's auto_clip, Model Optimizer's awq_clip), each
                                    weight group's range is shrunk to the ratio in [0.5, 1] that minimizes
                                    that group's share of the Linear's output error
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


CLIP_STEPS, CLIP_SHRINK, CLIP_TOKENS = 20, 0.5, 512  # llm-awq's auto_clip grid and token sample


def _scaled_linear(lin: nn.Linear, s: Tensor, config: IntConfig, x: Tensor | None = None) -> IntLinear:
    """`lin` with its weight times s [K] rounded to nearest, and 1/s as its pre_quant_scale; with inputs `x`
    (the Linear's own, before scaling), each weight group clipped first to the range that best keeps the
    output (_clip)."""
    w = lin.weight.detach().float() * s[None, :]
    if x is not None:
        w = _clip(w, x / s, config)
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


def _clip(w: Tensor, x: Tensor, config: IntConfig) -> Tensor:
    """w [N, K] with every (row, input group) clamped to ±r · its amax, r from CLIP_STEPS ratios in
    [1 - CLIP_SHRINK, 1], chosen per (row, group) to minimize the mean square of that group's part of the
    output error, x_g · (w_g - Q(clamp(w_g)))ᵀ, over (at most CLIP_TOKENS of) the inputs x [n, K]."""
    n, k = x.shape[0], w.shape[1]
    g = config.group_size or k
    if n == 0:
        return w
    x = x[torch.linspace(0, n - 1, min(n, CLIP_TOKENS)).long()]
    wg, xg = w.reshape(w.shape[0], k // g, g), x.reshape(x.shape[0], k // g, g)
    amax = wg.abs().amax(-1, keepdim=True)
    best, best_err = amax.clone(), torch.full(amax.shape[:2], float("inf"))
    for i in range(CLIP_STEPS):
        m = amax * (1 - CLIP_SHRINK * i / CLIP_STEPS)
        q, sc, z = P.quantize_int(torch.maximum(torch.minimum(wg, m), -m).reshape(w.shape), config.bits,
                                  config.group_size, config.symmetric)
        d = wg - P.dequantize_int(q, sc, z).reshape(wg.shape)
        err = torch.einsum("tgk,ngk->tng", xg, d).pow(2).mean(0)
        better = err < best_err
        best = torch.where(better[..., None], m, best)
        best_err = torch.where(better, err, best_err)
    return torch.maximum(torch.minimum(wg, best), -best).reshape(w.shape)


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
            replace_module(model, n, _scaled_linear(lin, s, config, x if config.clip else None))
        chosen.append(f"{'/'.join(group)} r={best_r:.2f}")
    clipped = ", weight ranges clipped" if config.clip else ""
    notes.append(f"awq: scale exponent per input group ({config.grid} grid points){clipped}: {'; '.join(chosen)}")
