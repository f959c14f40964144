"""NVFP4 shares one global scale within each group the engines fuse (q/k/v, gate/up: models/quantized/fusion.py):
TensorRT-LLM asserts it, vLLM and SGLang take the max without rescaling the block scales. The shared scale is the
group's largest amax, so no member's block scales overflow e4m3, and every other Linear keeps its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))

from engines_common import drafter, wide_target  # noqa: E402

from specpress.compress.quantize.api import quantize  # noqa: E402
from specpress.models.quantized import minifloat as M  # noqa: E402
from specpress.models.quantized.fusion import fused_groups  # noqa: E402
from specpress.models.quantized.modules import quantized_modules  # noqa: E402
from specpress.models.quantized.scheme import config_for  # noqa: E402


@pytest.mark.parametrize("family", ["eagle3", "lm", "dflash"])
def test_nvfp4_shares_the_global_scale_within_fused_groups(family):
    t = wide_target()
    d = drafter(family, t)
    originals = {n: m.weight.detach().float().clone() for n, m in d.named_modules() if isinstance(m, torch.nn.Linear)}
    quantize(d, config_for("nvfp4"))
    mods = quantized_modules(d)
    groups = fused_groups(mods)
    assert groups and all(len(g) in (2, 3) for g in groups)
    grouped = {n for g in groups for n in g}
    for g in groups:
        amax = torch.stack([originals[n].abs().max() for n in g]).max()
        for n in g:
            assert torch.equal(mods[n].global_scale, M.nvfp4_global_scale(amax)), n
    for n, m in mods.items():
        if n not in grouped:
            assert torch.equal(m.global_scale, M.nvfp4_global_scale(originals[n].abs().max())), n
        err = (m.dequantize(torch.float32) - originals[n]).norm() / originals[n].norm()
        assert err < 0.2, f"{n}: relative error {err:.3f}"  # NVFP4 on random weights: about 0.1


def test_fused_groups_are_siblings_only():
    names = ["a.self_attn.q_proj", "a.self_attn.k_proj", "a.self_attn.v_proj", "a.self_attn.o_proj",
             "a.mlp.gate_proj", "a.mlp.up_proj", "a.mlp.down_proj", "b.self_attn.q_proj", "fc"]
    assert fused_groups(names) == [["a.mlp.gate_proj", "a.mlp.up_proj"],
                                   ["a.self_attn.q_proj", "a.self_attn.k_proj", "a.self_attn.v_proj"]]
