"""nf4 / fp4 Bnb4bitLinear on an AVX512-BF16 CPU through bitsandbytes' fused 4-bit kernel
(specpress/models/quantized/bnb_cpu.py): matches the dequantize path at bf16 precision, falls back with the
reason where the kernel does not apply, never writes the repacked copy, and a quantized drafter using it
stays lossless in the speculative loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specpress.compress.quantize.api import quantize
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.eagle3 import Eagle3Config
from specpress.models.quantized import bnb_cpu
from specpress.models.quantized.bnb import Bnb4bitLinear
from specpress.models.quantized.modules import quantized_modules
from specpress.models.quantized.scheme import config_for
from specpress.models.target import TargetConfig, TargetModel
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.loop import speculative_generate
from specpress.runtime.plain import decode_plain
from specpress.runtime.policy import parse_policy

bnb = pytest.importorskip("bitsandbytes")
needs_kernel = pytest.mark.skipif(not bnb.functional.has_avx512bf16(),
                                  reason="bitsandbytes' fused 4-bit CPU kernel needs AVX512-BF16")
OP = "bitsandbytes.gemv_4bit.default"

from test_quantize import _Ops, fallback_call  # noqa: E402  (_Ops records the aten ops a block dispatches)


def module(n: int, k: int, quant_type: str, blocksize: int) -> Bnb4bitLinear:
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(k, n)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * 0.02)
        lin.bias.normal_(0, 0.1, generator=g)
    return Bnb4bitLinear.from_linear(lin, quant_type, blocksize)


def reference(m: Bnb4bitLinear, x: torch.Tensor) -> torch.Tensor:
    return x @ m.dequantize(torch.float32).T + m.bias


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


@needs_kernel
@pytest.mark.parametrize("n,k,quant_type,blocksize", [(64, 128, "nf4", 64), (96, 256, "nf4", 32),
                                                      (32, 768, "fp4", 128), (256, 96, "nf4", 32)])
@pytest.mark.parametrize("rows", [1, 9, 33])
def test_forward_runs_the_kernel_at_bf16_precision(n, k, quant_type, blocksize, rows):
    m = module(n, k, quant_type, blocksize)
    assert m.kernel_note == bnb_cpu.NAME and m.cpu_packed.shape == (n, k // 2)
    x = torch.randn(2, rows, k, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), _Ops() as log:
        y = m(x)
    assert OP in log.ops and y.dtype == torch.float32 and y.shape == (2, rows, n)
    assert rel(y, reference(m, x)) < 1e-2  # bf16 activations and absmax (measured <= 3.2e-3)


@needs_kernel
@pytest.mark.parametrize("make,inp,reason", [
    (lambda: module(48, 128, "nf4", 64), None, "out_features 48 is not a multiple of 32"),
    (lambda: module(64, 96, "nf4", 64), None, "blocksize 64 does not divide in_features 96"),
    (lambda: module(64, 128, "nf4", 64).half(), torch.float16, "float16 activations"),
    (lambda: module(64, 128, "nf4", 64), "grad", None),
])
def test_fallbacks_dequantize_and_say_why(make, inp, reason):
    m = make()
    x, y, ops = fallback_call(m, inp, seed=2)
    assert OP not in ops
    if reason is not None:
        assert m.cpu_packed is None and reason in m.kernel_note and reason in repr(m)
    assert rel(y.float(), reference(m, x.float()).detach()) < (1e-2 if inp is torch.float16 else 1e-5)


def test_state_dict_holds_only_the_stored_tensors():
    m = module(64, 128, "nf4", 64)
    assert set(m.state_dict()) == {"weight", "weight.absmax", "weight.quant_map",
                                   "weight.quant_state.bitsandbytes__nf4", "bias"}


@needs_kernel
def test_nf4_drafter_runs_the_kernel_and_stays_lossless(tmp_path):
    shape = dict(vocab_size=61, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=128)
    torch.manual_seed(0)
    target = TargetModel(TargetConfig(**shape, num_hidden_layers=8)).eval()
    d = build_drafter(Eagle3Config(**shape, draft_vocab_size=32)).eval().attach_target(target)
    d.set_draft_vocab(torch.arange(32))
    quantize(d, config_for("nf4", group_size=32, include=("lm_head",)))
    d = load_drafter(save_drafter(d, tmp_path / "nf4"), target)  # repacked at load
    notes = {name: m.kernel_note for name, m in quantized_modules(d).items()}
    assert sum(note == bnb_cpu.NAME for note in notes.values()) >= 5, notes  # N = 32 or 64: fc, q, o, down, head
    prompts = [[3, 17, 5, 40, 22, 9, 11], [50, 2, 2, 8, 31]]
    with _Ops() as log:
        got = [speculative_generate(TorchTarget(target), drafter_runner(d), p, 16,
                                    parse_policy("dynamic:depth=3,topk=2,budget=6"),
                                    eos_ids=()).tokens for p in prompts]
    assert OP in log.ops
    assert got == [decode_plain(TorchTarget(target), p, 16, eos_ids=()).tokens for p in prompts]
