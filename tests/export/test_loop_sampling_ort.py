"""Speculative sampling with the onnxruntime drafter reproduces the target's law, as the torch one does
(tests/runtime/test_loop_sampling.py: the same tiny 6-token target, the same chi-square bound). Slow:
1200 decodes; the loop's accept rule, not the backend, decides the law, so this guards the wiring."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from test_loop_sampling import CRIT, chi2, tiny  # noqa: E402

from specpress.export.onnx import ExportOptions, export_onnx  # noqa: E402
from specpress.models.lm import LMConfig, LMDrafter  # noqa: E402
from specpress.runtime.backends.onnxruntime.runner import load_runner  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("form", ["standard", "plugin"])
def test_onnxruntime_drafter_sampling_matches_target_law(tmp_path, form):
    target = tiny(0, 2)
    d = LMDrafter(LMConfig.from_target_config(target.config))
    d.load_state_dict(tiny(1, 2).state_dict())
    d.eval().attach_target(target)
    export_onnx(d, tmp_path / "lm", ExportOptions(attention=form), target=target)
    runner = load_runner(tmp_path / "lm", target, torch.device("cpu"))
    stat = chi2(target, runner, "chain:2")
    assert stat < CRIT, f"speculative sampling law through onnxruntime differs from the target's (chi2 {stat:.1f})"
