"""Loading a target holds it once: in a fresh process, the peak RSS above the interpreter's own is the
weights' bytes in the dtype asked for, whether they are stored in it (memory-mapped) or converted (one
tensor at a time). Loading bf16 weights as fp32 used to hold both: 1.5x the fp32 bytes."""

from __future__ import annotations

import pytest
from scale_common import run_peak, write_target

LOAD = """
import torch
from specpress.models.target import TargetConfig, TargetModel, load_target
with torch.device("meta"):  # the lazy imports a meta model pulls in (sympy, ...: ~80 MB) count as interpreter
    TargetModel(TargetConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                             num_attention_heads=1))
base = int(open("/proc/self/statm").read().split()[1]) * 4096
t = load_target({path!r}, dtype={dtype!r})
for p in t.parameters():
    p.detach().view(-1)[::1024].sum()  # every page of every tensor resident (mmap'd pages count once touched)
result = {{"base": base, "params": sum(p.numel() for p in t.parameters()), "es": t.lm_head.weight.element_size()}}
"""


@pytest.mark.slow  # writes and loads a 0.4 GB target twice (~30 s); .ci/run runs it
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_loading_a_target_holds_its_weights_once(tmp_path, dtype):
    write_target(tmp_path / "t", hidden=1024, layers=12, ffn=4096, vocab=8192)  # 218M params, bf16 on disk
    r = run_peak(LOAD.format(path=str(tmp_path / "t"), dtype=dtype))
    weights = r["params"] * r["es"]
    extra = r["peak_rss"] - r["base"]
    # one copy plus slack for the largest tensor read while converting (8 MB here) and the allocator
    assert extra < 1.15 * weights, f"{dtype}: {extra / 1e6:.0f} MB above the interpreter for {weights / 1e6:.0f} MB"
    assert extra > 0.8 * weights  # the weights really were read
