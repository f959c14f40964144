"""Activation quantization: the fake quantizers against onnxruntime's own QuantizeLinear / Cast kernels, the
calibration rules, SmoothQuant / AWQ's scaling, real-round calibration inputs, and static scales that
survive a save / load and keep the loop lossless."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from drafters_common import V, make, random_eos_target
from torch import nn

from specpress.compress.data import WindowSampler
from specpress.compress.quantize.activations import (
    InputStats,
    choose_amax,
    collect_inputs,
)
from specpress.compress.quantize.api import quantize
from specpress.compress.quantize.calibrate import (
    DrafterCalibration,
    RoundsCalibration,
    calibration_loop,
)
from specpress.errors import ConfigError, RequestError
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.quantized import activations as A
from specpress.models.quantized.modules import quantized_modules
from specpress.models.quantized.scheme import config_for
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.loop import speculative_generate
from specpress.runtime.plain import decode_plain
from specpress.runtime.policy import parse_policy

STREAM = np.random.default_rng(0).integers(1, V, size=600).astype(np.int32)
POLICY = {"eagle": "chain:3", "eagle3": "chain:3", "mtp": "mtp:3", "dflash": "block:4", "lm": "chain:4"}


def _ort_qdq(x: np.ndarray, scale: float, elem: int) -> np.ndarray:
    """onnxruntime's QuantizeLinear -> DequantizeLinear of x with a per-tensor scale (an independent kernel)."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto as T, helper

    zero = helper.make_tensor("z", elem, [], [0])
    g = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                           helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "qdq",
                          [helper.make_tensor_value_info("x", T.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", T.FLOAT, list(x.shape))],
                          [helper.make_tensor("s", T.FLOAT, [], [scale]), zero])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_fake_quantizers_equal_onnxruntimes_kernels():
    from onnx import TensorProto as T

    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(0)) * 5
    x[0, :6] = torch.tensor([0.25, 0.75, 1.125, 900.0, -900.0, 0.0])  # ties, saturation, zero
    for scale in (0.5, 0.013):
        s = torch.tensor(scale)
        assert np.array_equal(A.fake_fp8(x, s).numpy(), _ort_qdq(x.numpy(), scale, T.FLOAT8E4M3FN))
        assert np.array_equal(A.fake_int8(x, s).numpy(), _ort_qdq(x.numpy(), scale, T.INT8))
    dyn = A.fp8_input(x, "dynamic", None)  # per token: each row's amax maps to 448 exactly
    assert torch.allclose(dyn.abs().amax(dim=1), x.abs().amax(dim=1), rtol=1e-6)
    assert torch.allclose(A.int8_input(x, "dynamic", None).abs().amax(dim=1), x.abs().amax(dim=1), rtol=1e-6)


def test_calibration_words():
    assert str(A.parse_calibration("percentile:99.9")) == "percentile:99.9"
    assert A.parse_calibration("fixed:448").value == 448
    for bad in ("percentile:0", "percentile", "fixed:-1", "mean", "max:3"):
        with pytest.raises(ConfigError, match="--act-calibration"):
            A.parse_calibration(bad)
    assert A.act_label("static", "percentile:99.9") == "-static-p99.9" and A.act_label("dynamic", "max") == "-dyn"
    with pytest.raises(ConfigError, match="does not take --activations dynamic"):
        config_for("int4", activations="dynamic")
    with pytest.raises(ConfigError, match="weight-only here"):
        config_for("nf4", activations="static")
    with pytest.raises(ConfigError, match="use --activations static or dynamic"):
        config_for("int8", "smoothquant", activations="none")
    assert config_for("fp8").activations == "dynamic" and config_for("int8").activations == "none"
    assert config_for("int8", "smoothquant").activations == "static"
    assert config_for("fp8", activations="static").needs_data()
    assert not config_for("fp8", activations="static", act_calibration="fixed:448").needs_data()


def _module(word: str = "int8"):
    return quantize(nn.Sequential(nn.Linear(32, 8)), config_for(word, activations="static", act_calibration="fixed:1"))[0]


def test_amax_choices():
    m = _module()
    st = InputStats(32, seed=0)
    x = torch.randn(4000, 32, generator=torch.Generator().manual_seed(1))
    x[7, 3] = 40.0  # one outlier
    st.add(x)
    assert st.amax == 40.0 and st.rows == 4000 and len(st.rows_tensor()) <= 2048
    assert choose_amax(m, st, "max") == 40.0
    p = choose_amax(m, st, "percentile:99")
    assert 2.0 < p < 3.0  # the 99th percentile of |N(0, 1)|: 2.58, whatever the outlier
    mse = choose_amax(m, st, "mse")
    assert mse < 40.0  # int8's uniform steps: clipping the lone outlier costs less than coarse steps for the rest
    assert choose_amax(_module("fp8"), st, "mse") == 40.0  # e4m3 is floating point: no scale gains on the rest
    rows = st.rows_tensor()

    def err(amax: float) -> float:
        m.input_scale.copy_(m.input_scale_for(torch.tensor(amax)))
        return float((m.quantize_input(rows) - rows).pow(2).mean())

    assert err(mse) <= min(err(40.0), err(p)) + 1e-12


def test_static_scales_calibrate_save_load_and_stay_lossless(tmp_path):
    target = random_eos_target()
    d = make("eagle3", target)
    cal = DrafterCalibration(target, d, WindowSampler(STREAM, 24, 2, 0), batches=2)
    quantize(d, config_for("fp8", activations="static", act_calibration="max"), cal)
    step = d.provenance[-1]
    mods = quantized_modules(d)
    assert set(step["input_amax"]) == set(mods)
    for name, m in mods.items():
        assert m.act_mode == "static" and float(m.input_scale) == pytest.approx(step["input_amax"][name] / 448, rel=1e-5)
    out = save_drafter(d, tmp_path / "q")
    back = load_drafter(out, target)
    for name, m in quantized_modules(back).items():
        assert m.act_mode == "static" and torch.equal(m.input_scale, mods[name].input_scale)
    policy, prompt = parse_policy("chain:3"), [5, 9, 13, 2, 44]
    plain = decode_plain(TorchTarget(target), prompt, 12)
    assert speculative_generate(TorchTarget(target), drafter_runner(back), prompt, 12, policy).tokens == plain.tokens


def test_static_without_data_is_refused_unless_fixed():
    lin = nn.Sequential(nn.Linear(32, 8))
    with pytest.raises(RequestError, match="--activations static calibrates"):
        quantize(lin, config_for("fp8", activations="static"))
    quantize(lin, config_for("fp8", activations="static", act_calibration="weights"))
    m = lin[0]
    assert float(m.input_scale) == pytest.approx(float(m.dequantize().abs().max()) / 448)


def test_rounds_see_more_than_the_first_step():
    """Real rounds feed the drafter its own hidden states at chained steps; the teacher-forced first step
    never does: the rounds' inputs to the EAGLE-3 midlayer hold rows the first step's do not."""
    target = random_eos_target()
    d = make("eagle3", target)
    sampler = WindowSampler(STREAM, 24, 2, 0)
    first = collect_inputs(d, ["midlayer.self_attn.q_proj"], calibration_loop("first-step", target, d, sampler, 2))
    rounds = calibration_loop("rounds:chain:3", target, d, sampler, 2)
    assert isinstance(rounds, RoundsCalibration) and rounds.windows == 4
    seen = collect_inputs(d, ["midlayer.self_attn.q_proj"], rounds)["midlayer.self_attn.q_proj"]
    assert seen.rows > 0 and seen.amax != first["midlayer.self_attn.q_proj"].amax
    with pytest.raises(ConfigError, match="--calib-inputs"):
        calibration_loop("everything", target, d, sampler, 2)


def _outlier_model() -> tuple[nn.Sequential, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32, bias=False))
    x = torch.randn(512, 64)
    x[:, :4] *= 30.0  # four outlier channels, as LLM activations have
    return model, x


def _loop(x: torch.Tensor):
    def run(model: nn.Module) -> None:
        model(x)
    return run


def _errors(word: str, methods: tuple[str, ...], **kw) -> tuple[dict[str, float], nn.Module]:
    """Output MSE of the outlier model quantized by each method (calibrated on its inputs); the last model."""
    model, x = _outlier_model()
    ref = model(x).detach()
    errs = {}
    for method in methods:
        q = nn.Sequential(nn.Linear(64, 32, bias=False))
        q.load_state_dict(model.state_dict())
        quantize(q, config_for(word, method, **kw), _loop(x))
        errs[method] = float((q(x) - ref).pow(2).mean())
    return errs, q


def test_smoothquant_migrates_outliers_into_the_weights():
    errs, q = _errors("int8", ("rtn", "smoothquant"), activations="static")
    sq = q[0]
    assert sq.pre_quant_scale is not None and sq.pre_quant_scale[:4].max() < sq.pre_quant_scale[4:].min()
    assert errs["smoothquant"] < 0.5 * errs["rtn"]


def test_awq_beats_round_to_nearest_on_outlier_channels():
    errs, q = _errors("int4", ("rtn", "awq"), group_size=32)
    assert quantized_modules(q)["0"].pre_quant_scale is not None
    assert errs["awq"] < errs["rtn"]


def test_awq_clip_search_lowers_the_output_error_and_keeps_the_stored_form():
    """auto_clip (the default) shrinks weight ranges where that lowers the output error: never worse than
    the scaled round-to-nearest it starts from (ratio 1 is on its grid), and stored the same way."""
    from dataclasses import replace as dc_replace

    model, x = _outlier_model()
    ref = model(x).detach()
    out = {}
    for clip in (False, True):
        q = nn.Sequential(nn.Linear(64, 32, bias=False))
        q.load_state_dict(model.state_dict())
        quantize(q, dc_replace(config_for("int4", "awq", group_size=32), clip=clip), _loop(x))
        out[clip] = (float((q(x) - ref).pow(2).mean()), quantized_modules(q)["0"])
    assert out[True][0] < out[False][0]
    a, b = out[False][1], out[True][1]
    assert a.scales.shape == b.scales.shape and not torch.equal(a.scales, b.scales)
    assert (b.scales.abs() <= a.scales.abs() * (1 + 1e-6)).all()  # a clipped range never widens a scale
    assert torch.equal(a.pre_quant_scale, b.pre_quant_scale)
    assert dc_replace(config_for("int4", "awq", group_size=32), clip=False).label() == "int4-g32-awq-noclip"


@pytest.mark.parametrize("family", ["eagle", "eagle3", "mtp", "dflash", "lm"])
def test_fp8_kv_cache_rounds_what_is_cached_stays_lossless_and_exports(family, tmp_path):
    """--kv-cache fp8: every K/V vector the drafter caches is e4m3 with its own scale; the loop stays lossless
    and the ONNX export (the same rounding before attention) validates against torch on real rounds."""
    pytest.importorskip("onnxruntime")
    from drafters_common import make as make_drafter

    from specpress.export.onnx import ExportOptions, export_onnx
    from specpress.models.kv import Fp8KVCache, fp8_rows

    target = random_eos_target()
    d = quantize(make_drafter(family, target) if family != "lm" else _lm(target),
                 config_for("fp8", activations="none", kv_cache="fp8"))
    cache = d.new_cache(16)
    assert isinstance(cache, Fp8KVCache) and d.provenance[-1]["kv_cache"] == "fp8"
    k = torch.randn(1, cache.k.shape[2], 3, cache.k.shape[4])
    stored, _ = cache.write(0, k, k)
    assert torch.equal(stored, fp8_rows(k)) and not torch.equal(stored, k)
    back = load_drafter(save_drafter(d, tmp_path / "q"), target)
    assert back.kv_cache_format == "fp8"
    prompt = [5, 9, 13, 2, 44, 7]
    plain = decode_plain(TorchTarget(target), prompt, 10)
    assert speculative_generate(TorchTarget(target), drafter_runner(back), prompt, 10,
                                parse_policy(POLICY[family])).tokens == plain.tokens
    rep = export_onnx(back, tmp_path / "onnx", ExportOptions(), target=target)
    assert max(e["max_rel"] for g in rep.errors.values() for e in g.values()) <= rep.tolerance


def _lm(target):
    from specpress.models.lm import LMConfig, LMDrafter

    return LMDrafter(LMConfig.from_target_config(target.config)).eval().attach_target(target)
