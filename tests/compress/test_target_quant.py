"""--target-quant: the spec grammar, and a compressed target's parity with its dequantized float copy."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from drafters_common import SHAPE, randomize

from specpress.compress.data import WindowSampler
from specpress.compress.quantize.target import ReferenceLinear, TargetCalibration, parse_target_quant, quantize_target
from specpress.errors import ConfigError, UsageError
from specpress.models.kv import Fp8KVCache, KVCache
from specpress.models.target import TargetConfig, TargetModel

V = SHAPE["vocab_size"]


@pytest.fixture(scope="module")
def target() -> TargetModel:
    """A random 4-layer target whose Linears every scheme takes (K = 32 or 64: blocks of 16 and 32 divide)."""
    torch.manual_seed(0)
    return randomize(TargetModel(TargetConfig(**{**SHAPE, "intermediate_size": 64}, num_hidden_layers=4)), 0)


@pytest.fixture(scope="module")
def calibration() -> TargetCalibration:
    stream = np.random.default_rng(0).integers(1, V, 4000).astype(np.int32)
    return TargetCalibration(WindowSampler(stream, 32, 4, 0), batches=2)


def compressed(target: TargetModel, spec: str, calibration=None) -> tuple[TargetModel, dict]:
    q = copy.deepcopy(target)
    return q, quantize_target(q, parse_target_quant(spec), calibration)


@torch.no_grad()
def decode_logits(model: TargetModel, ids: torch.Tensor) -> torch.Tensor:
    """Logits of a prefill of ids[:, :6] and then one cached step per remaining token: [1, T, V]."""
    cache = model.new_cache(ids.shape[1])
    out = [model(ids[:, :6], cache=cache).logits]
    for t in range(6, ids.shape[1]):
        out.append(model(ids[:, t:t + 1], cache=cache).logits)
    return torch.cat(out, dim=1)


IDS = torch.randint(1, V, (1, 14), generator=torch.Generator().manual_seed(7))


def float_copy(target: TargetModel, q: TargetModel) -> TargetModel:
    """The float target with each quantized Linear's weight replaced by its scheme's dequantized weight
    (weight-only: a pre_quant_scale folded in, as --dequantize writes it)."""
    f = copy.deepcopy(target)
    for name, m in q.named_modules():
        if isinstance(m, ReferenceLinear):
            mod = m.quantized
            w = mod.to_linear().weight if mod.act_mode == "none" else mod.dequantize(torch.float32)
            with torch.no_grad():
                f.get_submodule(name).weight.copy_(w)
    return f


WEIGHT_ONLY = ["int8", "int4:group=16", "int4:group=32,symmetric=false", "fp8:activations=none", "nvfp4",
               "mxfp4:activations=none", "nf4:group=32", "int4:group=16,include=lm_head"]
CALIBRATED = ["int4:group=16,method=gptq", "int4:group=16,method=awq"]


@pytest.mark.parametrize("spec", WEIGHT_ONLY + CALIBRATED)
def test_weight_only_target_equals_its_dequantized_float_copy(target, calibration, spec):
    q, summary = compressed(target, spec, calibration if "method=" in spec else None)
    ref = float_copy(target, q)
    got, want, orig = decode_logits(q, IDS), decode_logits(ref, IDS), decode_logits(target, IDS)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - orig).abs().max() > 1e-3, "the compressed target computes what the float target does"
    n = 29 if "include=lm_head" in spec else 28  # 4 layers x 7 Linears (+ the head when included)
    assert summary["quantized"] == n and sum(isinstance(m, ReferenceLinear) for m in q.modules()) == n
    assert torch.equal(q.model.embed_tokens.weight, target.model.embed_tokens.weight)
    if "lm_head" not in spec:
        assert isinstance(q.lm_head, torch.nn.Linear) and torch.equal(q.lm_head.weight, target.lm_head.weight)
    assert 0 < summary["linear_bytes_after"] < summary["linear_bytes_before"]


def e4m3_per_token(x: torch.Tensor) -> torch.Tensor:
    s = x.abs().amax(-1, keepdim=True).clamp(min=1e-30) / 448.0
    return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s


def int8_per_token(x: torch.Tensor) -> torch.Tensor:
    s = x.abs().amax(-1, keepdim=True).clamp(min=1e-30) / 127.0
    return torch.round(x / s).clamp(-128, 127) * s


@pytest.mark.parametrize("spec,quantizer", [("fp8", e4m3_per_token), ("int8:activations=dynamic", int8_per_token),
                                            ("nvfp4:activations=static", None)])
def test_activation_quantized_target_equals_float_copy_with_quantized_inputs(target, calibration, spec, quantizer):
    """W8A8 / W4A4: the float copy, each dequantized Linear's input put through the activation quantizer
    (an independent e4m3 / int8 per-token rounding; NVFP4's own, with its calibrated global scale)."""
    q, _ = compressed(target, spec, calibration if "static" in spec else None)
    ref = float_copy_with_inputs(target, q, quantizer)
    got, want = decode_logits(q, IDS), decode_logits(ref, IDS)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    weights_only = float_copy(target, q)
    assert (got - decode_logits(weights_only, IDS)).abs().max() > 1e-4, "activations left unquantized"
    if "static" in spec:
        scales = [m.quantized.input_scale for m in q.modules() if isinstance(m, ReferenceLinear)]
        assert all(s is not None and float(s) != 1.0 for s in scales), "static scales were never calibrated"


def float_copy_with_inputs(target: TargetModel, q: TargetModel, quantizer) -> TargetModel:
    f = float_copy(target, q)
    for name, m in q.named_modules():
        if isinstance(m, ReferenceLinear):
            fn = quantizer or m.quantized.quantize_input
            f.get_submodule(name).register_forward_pre_hook(lambda mod, args, fn=fn: (fn(args[0].float()),))
    return f


def test_kv_cache_fp8_rounds_the_cache_only(target):
    q, summary = compressed(target, "none:kv=fp8")
    assert summary["quantized"] == 0 and summary["label"] == "float-kv8"
    assert isinstance(q.new_cache(8), Fp8KVCache) and type(target.new_cache(8)) is KVCache
    with torch.no_grad():
        torch.testing.assert_close(q(IDS).logits, target(IDS).logits, rtol=0, atol=0)  # no cache: same network
    assert (decode_logits(q, IDS) - decode_logits(target, IDS)).abs().max() > 1e-4
    q2, _ = compressed(target, "fp8:kv=fp8")
    assert isinstance(q2.new_cache(8), Fp8KVCache)


@torch.no_grad()
def shape_gap(model: TargetModel, ids: torch.Tensor) -> float:
    """The largest logit difference between one many-token forward (a verify pass's shape) and a prefill plus
    one-token cached steps (plain decoding's) over the same tokens."""
    whole = model(ids, cache=model.new_cache(ids.shape[1])).logits
    return float((whole - decode_logits(model, ids)).abs().max())


@pytest.mark.parametrize("spec", ["fp8", "int8:activations=dynamic", "nvfp4:activations=static", "none:kv=fp8"])
def test_exact_emulation_makes_both_kernel_shapes_agree(target, calibration, spec):
    """A spec that rounds activations (or the KV cache), computed in float64 around its fp32-input quantizers:
    the verify shape and the decode shape agree to float64 rounding, where in fp32 they differ by rounding the
    quantizers can amplify (the lossless check's mismatches, issue 38); and it stays the same network (its
    float64 logits equal its fp32 ones to fp32 rounding, but where a quantizer's code flips)."""
    from specpress.compress.quantize.target import exact_emulation

    q, _ = compressed(target, spec, calibration if "static" in spec else None)
    ids = torch.randint(1, V, (1, 40), generator=torch.Generator().manual_seed(3))
    wide = copy.deepcopy(q)
    exact_emulation(wide)
    assert wide.lm_head.weight.dtype == torch.float64
    assert all(b.dtype != torch.float64 for m in wide.modules() if isinstance(m, ReferenceLinear)
               for b in m.quantized.buffers())  # codes and scales as quantized
    assert shape_gap(q, ids) > 1e-9  # fp32: the two shapes round differently
    assert shape_gap(wide, ids) < 1e-12
    gap = (decode_logits(wide, ids).float() - decode_logits(q, ids)).abs()
    # The same network: most logits agree to fp32 rounding (~1e-6). Where an fp32 value sits at a quantizer's
    # rounding boundary, float64 may land on the other code; that moves the logits from there on by about one
    # grid step's effect (up to 4e-4 of logits near 2 seen on an AVX-512 machine without AMX), never by a
    # different network's margin.
    assert float(gap.median()) < 1e-5
    assert float(gap.max()) < 1e-2


def test_compressed_copy_is_exact_only_where_values_are_rounded(target, calibration):
    """runtime's compressed_copy widens what the lossless check needs widened, and nothing else."""
    from specpress.compress.quantize.target import compressed_copy

    fp8, summary = compressed_copy(target, parse_target_quant("fp8"))
    assert fp8.lm_head.weight.dtype == torch.float64 and summary["compute_dtype"] == "float64"
    int4, summary = compressed_copy(target, parse_target_quant("int4:group=16"))
    assert int4.lm_head.weight.dtype == torch.float32 and "compute_dtype" not in summary
    assert target.lm_head.weight.dtype == torch.float32


def test_calibrated_spec_needs_data_and_a_target_is_compressed_once(target, calibration):
    with pytest.raises(UsageError, match="--target-quant-data"):
        compressed(target, "nvfp4:activations=static")
    with pytest.raises(UsageError, match="--target-quant-data"):
        compressed(target, "int4:group=16,method=gptq")
    q, summary = compressed(target, "nvfp4:activations=static,calibration=weights")  # no data needed
    assert "calibration" not in summary
    with pytest.raises(UsageError, match="already compressed"):
        quantize_target(q, parse_target_quant("int8"))


@pytest.mark.parametrize("text,label", [
    ("none", "float"), ("none:kv=fp8", "float-kv8"), ("int8", "int8"), ("int4", "int4-g64"), ("fp8", "fp8-dyn"),
    ("int4:method=gptq,group=32", "int4-g32-gptq"), ("nvfp4:activations=static", "nvfp4-static"),
    ("fp8:kv=fp8,activations=static,calibration=max", "fp8-static-max-kv8"), ("int8:exclude=down_proj+o_proj",
                                                                              "int8-exc_down_proj_o_proj")])
def test_spec_labels_and_canonical_text(text, label):
    tq = parse_target_quant(text)
    assert tq.label == label
    assert parse_target_quant(tq.text) == tq  # the canonical text parses back to the same spec


@pytest.mark.parametrize("text,needle", [
    ("int5", "unknown scheme 'int5'; choose none (float weights) or one of int8, int4"),
    ("int4:grp=4", "unknown option 'grp'; options: method, group, symmetric"),
    ("int4:group", "'group' is not key=value"),
    ("int4:group=x", "group='x' must be a positive integer"),
    ("int4:group=8,group=16", "option 'group' is given twice"),
    ("fp8:activations=foo", "activations='foo': choose one of none, dynamic, static"),
    ("int4:method=smoothquant", "int4 does not take method=smoothquant: use method=rtn or gptq or awq"),
    ("nvfp4:activations=dynamic", "nvfp4 does not take activations=dynamic"),
    ("none:group=4", "none keeps the weights in float and takes only kv=fp8"),
    ("int4:kv=fp16", "kv='fp16'; choose none or fp8"),
    ("int8:symmetric=maybe", "symmetric='maybe' must be true or false"),
    ("fp8:calibration=median", "calibration='median': choose one of max"),
    ("", "give SCHEME[:key=value,...]"),
])
def test_bad_specs_are_one_clear_error(text, needle):
    with pytest.raises(ConfigError) as exc:
        parse_target_quant(text)
    msg = str(exc.value)
    assert needle in msg and msg.startswith(f"--target-quant {text!r}" if text else "--target-quant")
    assert "--group-size" not in msg and "--method" not in msg  # the spec's words, not `quantize`'s flags


@pytest.mark.parametrize("text,needle", [("int4:group=24", "group=16 (divides every quantized layer)"),
                                         ("fp8:include=nothing", "include='nothing' matches no Linear of the target")])
def test_specs_the_target_cannot_take_are_refused_before_it_changes(target, text, needle):
    q = copy.deepcopy(target)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        quantize_target(q, parse_target_quant(text))
    assert not any(isinstance(m, ReferenceLinear) for m in q.modules())
