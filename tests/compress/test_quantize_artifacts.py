"""quantize on real drafters: every family quantizes (RTN and GPTQ) and the speculative loop stays
lossless; artifacts round-trip bit-exactly through save/load; inspect's bytes arithmetic; the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from drafters_common import (
    FAMILIES,
    V,
    make,
    random_eos_target,
    run,
    save_with_tokenizer,
    tiny_target,
)

from specpress.cli import cli
from specpress.compress.data import WindowSampler
from specpress.compress.quantize.api import quantize
from specpress.compress.quantize.calibrate import DrafterCalibration
from specpress.errors import CheckpointError, RequestError
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.eagle3 import Eagle3Config
from specpress.models.inspect import inspect_artifact
from specpress.models.io import tensor_index
from specpress.models.lm import LMConfig, LMDrafter
from specpress.models.quantized.integer import IntLinear
from specpress.models.quantized.modules import quantized_modules
from specpress.models.quantized.scheme import config_for
from specpress.models.target import TargetModel
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.loop import speculative_generate
from specpress.runtime.plain import decode_plain
from specpress.runtime.policy import parse_policy

STREAM = np.random.default_rng(0).integers(1, V, size=600).astype(np.int32)
POLICY = {"eagle": "chain:3", "eagle3": "chain:3", "mtp": "mtp:3", "dflash": "block:4", "lm": "chain:4"}
PROMPTS = [[5, 9, 13, 2, 44, 7], [30, 31, 32, 33, 34, 35, 36, 37, 38]]


@pytest.fixture(scope="module")
def target() -> TargetModel:
    """A target that nearly always predicts token 1, so random drafters sharing its head get drafts accepted."""
    t = tiny_target()
    with torch.no_grad():
        t.lm_head.weight[1] *= 25.0
    return t


def drafter(family: str, target: TargetModel):
    if family != "lm":
        d = make(family, target)
        if family == "eagle3":
            d.set_draft_vocab(torch.arange(24))  # holds token 1, the easy target's favourite
            with torch.no_grad():
                d.lm_head.weight[1] *= 25.0  # and its own head favours it too
        return d
    d = LMDrafter(LMConfig.from_target_config(target.config))  # a noisy copy of the target: agrees often
    d.load_state_dict(target.state_dict())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3 * p.std())
    return d.eval().attach_target(target)


def calibration(target, d, batches: int = 2, windows: int = 2):
    return DrafterCalibration(target, d, WindowSampler(STREAM, 24, windows, 0), batches=batches)


# ------------------------------------------------------------------------------------ families + the loop


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_every_family_quantizes_and_stays_lossless(family, method, target):
    d = drafter(family, target)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in d.modules())
    quantize(d, config_for("int4", method, group_size=8), calibration(target, d) if method == "gptq" else None)
    step = d.provenance[-1]
    assert len(quantized_modules(d)) == len(step["quantized"]) == n_linear - (family in ("eagle3", "lm"))
    assert step["bytes_after"] < step["bytes_before"]
    calls = []
    for m in quantized_modules(d).values():
        m.register_forward_hook(lambda mod, args, out: calls.append(out.dtype))
    accepted = 0
    for prompt in PROMPTS:
        ref = decode_plain(TorchTarget(target), prompt, 24, eos_ids=()).tokens
        got = speculative_generate(TorchTarget(target), drafter_runner(d), prompt, 24, parse_policy(POLICY[family]),
                                   eos_ids=())
        assert got.tokens == ref, (family, prompt)
        accepted += sum(r.accepted for r in got.rounds)
    assert calls and set(calls) == {torch.float32}, "the quantized modules never ran"
    if family in ("eagle3", "lm"):  # drafters engineered to agree with the target (random ones rarely do)
        assert accepted > 0, "no draft was accepted: the accept path went untested"


@pytest.mark.parametrize("family", FAMILIES)
def test_gptq_has_lower_output_error_than_rtn(family, target):
    base = drafter(family, target)
    cal = calibration(target, base, 8, 4)  # 768 tokens: with far fewer than ~2x in_features, GPTQ overfits
    ids = torch.from_numpy(STREAM[None, 100:130].astype(np.int64))  # scored on other windows
    ref = run(base, target, ids)
    err = {}
    for method in ("rtn", "gptq"):
        d = drafter(family, target)
        quantize(d, config_for("int4", method, group_size=8), cal if method == "gptq" else None)
        err[method] = (run(d, target, ids) - ref).pow(2).mean().item()
    assert err["gptq"] < 0.8 * err["rtn"], err


@pytest.mark.parametrize("scheme,method,group_size,exclude", [
    ("fp8", None, None, ()), ("int8", "bnb", None, ()), ("nf4", "bnb", 32, ("down_proj",)),
    ("int8", "rtn", None, ()), ("int4", "rtn", 8, ())])
def test_eagle3_schemes_round_trip_bit_exact(scheme, method, group_size, exclude, target, tmp_path):
    d = make("eagle3", target)
    quantize(d, config_for(scheme, method, group_size=group_size, symmetric=False if scheme == "int4" else None,
                           include=("lm_head",), exclude=exclude))
    out = save_drafter(d, tmp_path / scheme)
    back = load_drafter(out, target)
    assert back.provenance == d.provenance
    mine, theirs = quantized_modules(d), quantized_modules(back)
    assert mine.keys() == theirs.keys() and "lm_head" in mine
    for name in mine:
        a, b = mine[name].state_dict(), theirs[name].state_dict()
        assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a), name
    assert torch.equal(run(back, target), run(d, target))
    stored = {k: v.dtype for k, v in tensor_index(out).items()}
    expect = {"fp8": ("fc.weight_fp8", "F8_E4M3"), "int8": ("fc.qweight" if method == "rtn" else "fc.weight", "I8"),
              "nf4": ("fc.weight", "U8"), "int4": ("fc.qweight", "U8")}[scheme]
    assert stored[expect[0]] == expect[1] and stored.get("fc.scales", "F32") == "F32"
    assert stored["midlayer.input_layernorm.weight"] == "F32" and stored["d2t"] == "I64"


def test_kept_floats_are_rounded_to_the_stored_dtype(target, tmp_path):
    """With float_dtype=bf16 the in-memory drafter computes exactly what its bf16 artifact reloads to;
    without the rounding the reload differs (so the acceptance measured in memory would not be the stored one)."""
    outs = {}
    for rounded in (True, False):
        d = make("eagle3", target)  # randomized: fp32 norms and Linears that bf16 cannot represent
        quantize(d, config_for("int4", group_size=8), float_dtype=torch.bfloat16 if rounded else None)
        norm = d.midlayer.input_layernorm.weight
        assert torch.equal(norm, norm.to(torch.bfloat16).float()) == rounded
        back = load_drafter(save_drafter(d, tmp_path / str(rounded), dtype=torch.bfloat16), target)
        outs[rounded] = (run(d, target), run(back, target))
    assert torch.equal(*outs[True]) and not torch.equal(*outs[False])
    stored = {k: v.dtype for k, v in tensor_index(tmp_path / "True").items()}
    assert stored["midlayer.input_layernorm.weight"] == "BF16" and stored["fc.scales"] == "F32"


def test_inspect_names_the_stored_float_dtype_of_a_quantized_drafter(target, tmp_path):
    """A quantized drafter keeps its floats in bf16 beside fp32 scales (more tensors): inspect says bfloat16,
    the quantize step's float_dtype (it said float32, counting tensors)."""
    from specpress.compress.quantize.pipeline import quantize_from_dirs

    src = save_drafter(make("eagle3", target), tmp_path / "fp32")
    quantize_from_dirs(src, config_for("int4", group_size=8), tmp_path / "q")
    stored = {k: v.dtype for k, v in tensor_index(tmp_path / "q").items()}
    floats = [v for v in stored.values() if v in ("F32", "BF16")]
    assert floats.count("F32") > floats.count("BF16")  # the case the old count got wrong
    assert inspect_artifact(tmp_path / "q")["dtype"] == "bfloat16"


def test_gptq_calibrates_on_twice_the_widest_linears_inputs():
    from specpress.compress.quantize.calibrate import CALIB_BATCHES, default_calib_batches

    d = build_drafter(Eagle3Config(vocab_size=V, hidden_size=64, intermediate_size=2048, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64, draft_vocab_size=24))
    n = default_calib_batches(d, config_for("int4", "gptq", group_size=64), 4, 128)
    assert n * 4 * 128 >= 2 * 2048 and (n - 1) * 4 * 128 < 1.1 * 2 * 2048 + 4 * 128  # down_proj's 2048 inputs
    assert default_calib_batches(d, config_for("int4", "rtn", group_size=64), 4, 128) == CALIB_BATCHES


@pytest.mark.parametrize("word", ["int3", "int2", "ternary"])
def test_lowbit_gptq_calibrates_on_as_many_batches_as_integer_gptq(word):
    """Low-bit GPTQ (LowBitGPTQConfig) fits the same Hessians as integer GPTQ, so it gets the same default
    calibration batches, not round-to-nearest's CALIB_BATCHES."""
    from specpress.compress.quantize.calibrate import (
        CALIB_BATCHES,
        default_calib_batches,
    )

    d = build_drafter(Eagle3Config(vocab_size=V, hidden_size=64, intermediate_size=2048, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64, draft_vocab_size=24))
    n = default_calib_batches(d, config_for(word, "gptq", group_size=64), 4, 128)
    assert n == default_calib_batches(d, config_for("int4", "gptq", group_size=64), 4, 128) > CALIB_BATCHES
    assert default_calib_batches(d, config_for(word, "rtn", group_size=64), 4, 128) == CALIB_BATCHES


def test_tampered_quantized_tensor_is_named(target, tmp_path):
    from safetensors.torch import load_file, save_file

    d = make("eagle3", target)
    out = save_drafter(quantize(d, config_for("int4", group_size=8)), tmp_path / "q")
    sd = load_file(str(out / "model.safetensors"))
    sd["fc.qweight"] = sd["fc.qweight"][:, :-1].contiguous()
    save_file(sd, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"fc\.qweight.*implies torch.uint8 \(32, 48\)"):
        load_drafter(out, target)


# ------------------------------------------------------------------------------------ bytes arithmetic


@pytest.mark.parametrize("symmetric,fc_bytes", [(True, 6144 + 768), (False, 6144 + 768 + 192)])
def test_int4_g64_bytes_are_exact(symmetric, fc_bytes, tmp_path):
    """fc [64, 192]: 12288 weights -> 6144 B of nibbles + 64·3 fp32 scales (768 B) [+ 64·3 uint8 zeros]."""
    cfg = Eagle3Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=64, draft_vocab_size=24)
    d = build_drafter(cfg)
    full = inspect_artifact(save_drafter(d, tmp_path / "fp32"))
    quantize(d, config_for("int4", group_size=64, symmetric=symmetric))
    info = inspect_artifact(save_drafter(d, tmp_path / "int4"))
    step = d.provenance[-1]
    assert step["bytes_before"] == full["bytes"] and step["bytes_after"] == info["bytes"]
    q = info["quantization"]
    assert q["modules"]["fc"] == {"params": 12288, "bytes": fc_bytes, "bits_per_param": round(8 * fc_bytes / 12288, 3)}
    assert q["modules"]["fc"]["bits_per_param"] == (4.5 if symmetric else 4.625)
    per_group = 32 + 4 + (0 if symmetric else 1)  # bytes per 64 weights
    assert q["quantized_bytes"] == q["quantized_params"] // 64 * per_group == step["quantized_bytes"]
    assert q["quantized_bytes"] + q["other_bytes"] == info["bytes"]
    assert "lm_head" not in q["modules"] and info["params"] == full["params"]


# ------------------------------------------------------------------------------------ CLI


def _target_dir(tmp_path):
    t = random_eos_target()
    tdir, data = save_with_tokenizer(t, tmp_path)
    return t, tdir, data


def test_cli_end_to_end(tmp_path):
    t, tdir, data = _target_dir(tmp_path)
    src = save_drafter(make("eagle3", t), tmp_path / "e3")
    small = ["--target", str(tdir), "--data", str(data), "--seq-len", "16", "--batch", "2", "--calib-batches", "2",
             "--eval-batches", "2"]
    out = tmp_path / "e3-int4"
    args = ["quantize", "--drafter", str(src), "--out", str(out), "--scheme", "int4", "--group-size", "8"]
    res = CliRunner().invoke(cli, [*args, *small])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "bytes" in res.output and "acc@k before" in res.output and "acc@k after" in res.output
    assert "lm_head: draft head" in res.output and "% of the source in bfloat16" in res.output
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"  # auto: fp32 source -> bf16
    d = load_drafter(out, t)
    assert isinstance(d.fc, IntLinear) and not isinstance(d.lm_head, IntLinear)
    step = d.provenance[-1]
    assert step["scheme"] == "int4" and len(step["agreement"]["after"]) == 3 and step["source"] == str(src)
    res = CliRunner().invoke(cli, ["inspect", str(out)])
    assert res.exit_code == 0 and "quantized" in res.output and "fc  " in res.output and "bits/param" in res.output
    res = CliRunner().invoke(cli, [*args, *small])
    assert isinstance(res.exception, RequestError) and "--force" in str(res.exception)

    gptq = tmp_path / "e3-gptq"
    res = CliRunner().invoke(cli, [*args[:4], str(gptq), *args[5:], "--method", "gptq", "--asymmetric", *small])
    assert res.exit_code == 0, res.output + repr(res.exception)
    step = load_drafter(gptq, t).provenance[-1]
    assert step["method"] == "gptq" and step["calibration"]["windows"] == 4

    deq = tmp_path / "e3-deq"
    res = CliRunner().invoke(cli, [*args[:4], str(deq), *args[5:], "--dequantize", "--include", "lm_head",
                                   "--dtype", "fp32"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "acceptance cost not measured" in res.output
    keys = set(tensor_index(deq))
    assert "fc.weight" in keys and "lm_head.weight" in keys
    assert not any(k.endswith((".qweight", ".scales")) for k in keys)
    plain, quant = load_drafter(deq, t), load_drafter(src, t)
    assert plain.provenance[-1]["dequantized"] is True and not quantized_modules(plain)
    quantize(quant, config_for("int4", group_size=8, include=("lm_head",)))
    assert (run(plain, t) - run(quant, t)).abs().max() <= 1e-5
    assert json.loads((deq / "config.json").read_text())["torch_dtype"] == "float32"


def test_cli_bad_input(tmp_path):
    t, tdir, data = _target_dir(tmp_path)
    src = save_drafter(make("eagle3", t), tmp_path / "e3")
    base = ["quantize", "--drafter", str(src), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(cli, [*base, "--scheme", "int4", "--method", "gptq", "--group-size", "8"])
    assert isinstance(res.exception, RequestError) and "--target DIR and --data PATH" in str(res.exception)
    res = CliRunner().invoke(cli, [*base, "--scheme", "int4", "--target", str(tdir)])
    assert isinstance(res.exception, RequestError) and "go together" in str(res.exception)
    res = CliRunner().invoke(cli, [*base, "--scheme", "int4"])  # group size 64 vs in_features 96, 64, 32, 40
    assert "does not divide fc's in_features 96; use --group-size 8" in str(res.exception)
    res = CliRunner().invoke(cli, [*base, "--scheme", "nf4", "--method", "gptq"])
    assert "use --method bnb" in str(res.exception)
    res = CliRunner().invoke(cli, [*base, "--scheme", "int8", "--include", "embed_tokens"])
    assert "matches no Linear" in str(res.exception)
    q = tmp_path / "q"
    assert CliRunner().invoke(cli, [*base[:4], str(q), "--scheme", "int8"]).exit_code == 0
    res = CliRunner().invoke(cli, ["quantize", "--drafter", str(q), "--out", str(tmp_path / "qq"), "--scheme", "int8"])
    assert isinstance(res.exception, RequestError) and "already quantized" in str(res.exception)
