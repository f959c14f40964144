"""Recovery after quantization (quantize --recover-steps): the fake quantization of every registry cell is the
scheme's own numerics with gradients reaching the master weights, freezing stores valid codes of the scheme,
recovery lowers the distillation loss, resumes like distill, and records itself in the provenance."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from drafters_common import V, make, randomize, saved_target_and_drafter, tiny_target
from export.test_hf_encodings import (  # every registry cell, on a drafter all of them fit
    CFG,
    CONFIGS,
    IDS,
)

from specpress.compress.agreement import batch_loss
from specpress.compress.data import WindowSampler
from specpress.compress.quantize.api import quantize
from specpress.compress.quantize.fakequant import FakeQuantLinear, freeze, wrap
from specpress.compress.quantize.recover import RecoverConfig, recover, source_weights
from specpress.errors import CheckpointError, ConfigError, Interrupted, RequestError
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.quantized import primitives as P
from specpress.models.quantized.fusion import fused_groups
from specpress.models.quantized.modules import quantized_modules
from specpress.models.quantized.scheme import (
    config_for,
    facet,
    scheme_of,
    scheme_of_module,
)
from specpress.models.target import load_target

PATTERN = np.random.default_rng(0).integers(1, V, size=23)
STREAM = np.tile(PATTERN, 100).astype(np.int32)


def _quantized(cell: str):
    d = randomize(build_drafter(CFG), 1)
    originals = source_weights(d, [n for n, m in d.named_modules() if isinstance(m, torch.nn.Linear)])
    quantize(d, CONFIGS[cell], calibration=lambda m: m(IDS))
    return d, originals


def _codes_valid(mod) -> None:
    """The module's stored codes lie in its scheme's code range (integer and low-bit codes)."""
    if hasattr(mod, "container_codes"):
        from specpress.models.quantized.lowbit import code_range

        lo, hi = code_range(mod.format, mod.symmetric)
    elif hasattr(mod, "codes") and hasattr(mod, "bits"):
        lo, hi = P.code_range(mod.bits, mod.symmetric)
    else:
        return
    q = mod.codes()
    assert int(q.min()) >= lo and int(q.max()) <= hi


@pytest.mark.parametrize("scales", ["learned", "rederived"])
@pytest.mark.parametrize("cell", sorted(CONFIGS))
def test_fake_quantization_is_the_schemes_numerics_and_passes_gradients(cell, scales, tmp_path):
    d, originals = _quantized(cell)
    cfg = CONFIGS[cell]
    mods = quantized_modules(d)
    stored = {n: m.dequantize(torch.float32).clone() for n, m in mods.items()}
    fakes = wrap(d, {n: cfg for n in mods}, {n: originals[n] for n in mods}, scales)
    learned = scales == "learned" and facet("qat", scheme_of(cfg)) is not None
    for name, f in fakes.items():
        assert f.scales_mode == ("learned" if learned else "rederived")
        if learned or not cfg.needs_calibration:  # rederived re-rounds GPTQ / AWQ weights to nearest
            assert torch.equal(f.fake_weight().detach(), stored[name]), name  # the stored codes, reproduced
    d.train()
    d(IDS).logits.float().pow(2).mean().backward()
    for name, f in fakes.items():
        assert f.weight.grad is not None and f.weight.grad.abs().sum() > 0, name  # straight through
        if learned:
            assert f.log_scale.grad is not None and f.log_scale.grad.abs().sum() > 0, name
    with torch.no_grad():  # move the masters and scales as training would, so freezing has something to store
        for f in fakes.values():
            f.weight.add_(torch.randn_like(f.weight) * f.weight.std() * 0.3)
            if learned:
                f.log_scale.add_(0.05)
    want = {n: f.fake_weight().detach().clone() for n, f in fakes.items()}
    with torch.no_grad():
        y = d(IDS).logits
    assert sorted(freeze(d)) == sorted(fakes)
    frozen = quantized_modules(d)
    for group in fused_groups(list(frozen)):  # nvfp4: q/k/v and gate/up keep one global scale (engines fuse them)
        held = [frozen[n].global_scale for n in group if hasattr(frozen[n], "global_scale")]
        assert all(torch.equal(g, held[0]) for g in held), group
    for name, mod in frozen.items():
        assert isinstance(mod, scheme_of(cfg).modules) and mod.act_mode == cfg.act_mode
        assert torch.equal(mod.dequantize(torch.float32), want[name]), name  # stores what the forward computed
        _codes_valid(mod)
    loaded = load_drafter(save_drafter(d, tmp_path / "d"))  # the scheme's own layout: restore checks it
    for name, mod in quantized_modules(loaded).items():
        assert torch.equal(mod.dequantize(torch.float32), want[name]), name
    if cfg.act_mode == "none" and scheme_of(cfg).name in ("integer", "lowbit"):
        torch.testing.assert_close(loaded.float()(IDS).logits, y, rtol=1e-2, atol=1e-2)  # int kernels: bf16


def test_the_master_weight_starts_in_its_codes_cell():
    """GPTQ's codes are not round-to-nearest of the float weight: the master starts at the float weight moved
    into each stored code's rounding cell, so the first forward reproduces GPTQ's codes."""
    d, originals = _quantized("int4/gptq/none")
    mods = quantized_modules(d)
    codes = {n: m.codes().clone() for n, m in mods.items()}
    fakes = wrap(d, {n: CONFIGS["int4/gptq/none"] for n in mods}, originals, "learned")
    moved = 0
    for name, f in fakes.items():
        assert torch.equal(f.codes(), codes[name])
        moved += int((f.weight.detach() != originals[name]).sum())
        assert (f.weight.detach() == originals[name]).float().mean() > 0.5  # most weights kept as they were
    assert moved > 0  # ... and GPTQ's moved ones projected


# ------------------------------------------------------------------------------------ training


@pytest.fixture(scope="module")
def target():
    t = tiny_target()
    with torch.no_grad():
        t.lm_head.weight.mul_(4)
    return t


def _int2_eagle3(target):
    d = make("eagle3", target)
    sources = source_weights(d, [n for n, m in d.named_modules() if isinstance(m, torch.nn.Linear)])
    quantize(d, config_for("int2", group_size=8, include=("lm_head",)))
    return d, {n: sources[n] for n in quantized_modules(d)}


def _loss(target, d, rc: RecoverConfig) -> float:
    s = WindowSampler(STREAM, rc.seq_len, rc.batch, rc.seed + 1)
    with torch.no_grad():
        return float(sum(batch_loss(target, d, s.batch_at(i), rc.distill_config("eagle3")).loss for i in range(3)))


def test_recovery_lowers_the_distill_loss_and_records_itself(target):
    d, sources = _int2_eagle3(target)
    rc = RecoverConfig(steps=30, lr=3e-3, batch=4, seq_len=24)
    rec = recover(d, target, WindowSampler(STREAM, 24, 4, 0), rc, sources=sources)
    assert _loss(target, rec, rc) < 0.9 * _loss(target, d, rc)  # at equal seed and windows
    step = rec.provenance[-1]
    assert step["step"] == "quantize" and step["recovery"]["steps"] == 30
    assert step["recovery"]["config"] == rc.to_dict() and step["recovery"]["scales"] == ["learned"]
    assert [s["step"] for s in rec.provenance] == [s["step"] for s in d.provenance]  # no distill step of its own
    assert step["config"] == d.provenance[-1]["config"]  # the same scheme, stored the same way
    for mod in quantized_modules(rec).values():
        assert type(mod).__name__ == "LowBitLinear" and mod.scales.dtype == torch.float16
        _codes_valid(mod)
    assert quantized_modules(d) and not any(isinstance(m, FakeQuantLinear) for m in d.modules())  # input untouched


def test_resume_reproduces_the_uninterrupted_run(target, tmp_path):
    d, sources = _int2_eagle3(target)
    rc = RecoverConfig(steps=8, lr=3e-3, batch=4, seq_len=24)

    def run(**kw):
        return recover(d, target, WindowSampler(STREAM, 24, 4, 0), rc, sources=sources, **kw)

    full = run()

    def stop_at_4(step, loss, acc):
        if step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(checkpoint_dir=tmp_path / "p", on_step=stop_at_4)
    assert (tmp_path / "p" / "state.pt").is_file()
    with pytest.raises(CheckpointError, match="different run"):
        recover(d, target, WindowSampler(STREAM, 24, 4, 0), RecoverConfig(steps=8, lr=1e-3, batch=4, seq_len=24),
                sources=sources, checkpoint_dir=tmp_path / "p", resume=True)
    resumed = run(checkpoint_dir=tmp_path / "p", resume=True)
    assert resumed.provenance[-1]["recovery"]["resumed_from"] == 4
    a, b = full.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_recovery_config_and_misuse_are_clear(target):
    with pytest.raises(ConfigError, match="--recover-steps must be an integer >= 0"):
        RecoverConfig(steps=-1)
    with pytest.raises(ConfigError, match="--recover-scales 'fixed'"):
        RecoverConfig(scales="fixed")
    with pytest.raises(ConfigError, match="unknown key"):
        RecoverConfig.from_dict({"steps": 3, "stepz": 1})
    assert RecoverConfig.from_dict(RecoverConfig(steps=3).to_dict()) == RecoverConfig(steps=3)
    with pytest.raises(RequestError, match="quantize it first"):
        recover(make("eagle3", target), target, WindowSampler(STREAM, 24, 4, 0), RecoverConfig(steps=2))


# ------------------------------------------------------------------------------------ the command


def test_quantize_recover_steps_end_to_end(tmp_path):
    from click.testing import CliRunner

    from specpress.cli import cli

    tdir, data, ddir = saved_target_and_drafter(tmp_path)
    target = load_target(tdir)
    out = tmp_path / "q"
    args = ["quantize", "--drafter", str(ddir), "--out", str(out), "--scheme", "ternary", "--group-size", "8",
            "--include", "lm_head", "--target", str(tdir), "--data", str(data), "--seq-len", "16", "--batch", "2",
            "--eval-batches", "1", "--recover-steps", "3", "--recover-batch", "2"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "recovered  3 steps" in res.output and not (tmp_path / "q.partial").exists()
    d = load_drafter(out, target)
    step = d.provenance[-1]
    assert step["recovery"]["steps"] == 3 and step["recovery"]["config"]["steps"] == 3
    assert step["scheme"] == "ternary" and json.loads((out / "config.json").read_text())
    for mod in quantized_modules(d).values():
        assert scheme_of_module(mod).name == "lowbit"
        _codes_valid(mod)
    shown = CliRunner().invoke(cli, ["inspect", str(out)])
    assert "recovered 3 steps (learned scales" in shown.output.replace("\n     ", " ")
    onnx_dir = tmp_path / "onnx"  # stored as any ternary drafter: exported and validated against torch the same way
    res = CliRunner().invoke(cli, ["export", "onnx", "--drafter", str(out), "--target", str(tdir), "--out",
                                   str(onnx_dir)])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert json.loads((onnx_dir / "manifest.json").read_text())["quantization"]["schemes"] == ["ternary"]
    bad = CliRunner().invoke(cli, ["quantize", "--drafter", str(ddir), "--out", str(tmp_path / "x"), "--scheme",
                                   "int2", "--group-size", "8", "--recover-steps", "3"])
    assert bad.exit_code != 0 and "--target DIR and --data PATH" in str(bad.exception)
    assert not (tmp_path / "x").exists()
    # recovery trains one scheme's codes: with --budget (a scheme per Linear) it is refused, here, by the API and
    # in a sweep recipe, before anything is written
    bad = CliRunner().invoke(cli, ["quantize", "--drafter", str(ddir), "--out", str(tmp_path / "x"), "--budget",
                                   "4.5bpp", "--candidates", "int4:g8,int2:g8", "--target", str(tdir), "--data",
                                   str(data), "--recover-steps", "3"])
    assert bad.exit_code != 0 and "--budget" in str(bad.exception) and "--recover-steps" in str(bad.exception)
    from specpress.compress.quantize.budget import parse_budget, parse_candidates
    from specpress.compress.quantize.pipeline import quantize_from_dirs
    from specpress.errors import UsageError
    from specpress.sweep.grid import _stage_options

    with pytest.raises(UsageError, match="--budget"):
        quantize_from_dirs(ddir, config_for("int8"), tmp_path / "x", target_dir=tdir, data_path=data,
                           recovery=RecoverConfig(steps=3), budget=parse_budget("4.5bpp"),
                           candidates=parse_candidates("int4:g8,int2:g8"))
    with pytest.raises(ConfigError, match="recover"):
        _stage_options("quantize", {"budget": "4.5bpp", "recover_steps": 3}, "grid[0]")
    assert not (tmp_path / "x").exists()


def test_quantize_resume_continues_an_interrupted_recovery(tmp_path, monkeypatch):
    """Ctrl-C during `quantize --recover-steps` leaves <out>.partial (the quantized drafter and the training
    state); a rerun needs --resume (or --force), continues from the last step without quantizing again, and
    writes what the uninterrupted run writes."""
    import safetensors.torch as st
    from click.testing import CliRunner

    import specpress.compress.quantize.pipeline as pipeline
    from specpress.cli import cli
    from specpress.compress.progress import TrainProgress

    tdir, data, ddir = saved_target_and_drafter(tmp_path)

    def args(out):
        return ["quantize", "--drafter", str(ddir), "--out", str(out), "--scheme", "int2", "--group-size", "8",
                "--method", "rtn", "--target", str(tdir), "--data", str(data), "--seq-len", "16", "--batch", "2",
                "--eval-batches", "1", "--recover-steps", "4", "--recover-batch", "2"]

    full = CliRunner().invoke(cli, args(tmp_path / "full"))
    assert full.exit_code == 0, full.output + repr(full.exception)
    real = TrainProgress.update

    def ctrl_c(self, step, *a, **k):
        if step == 2:
            raise KeyboardInterrupt
        return real(self, step, *a, **k)

    monkeypatch.setattr(TrainProgress, "update", ctrl_c)
    res = CliRunner().invoke(cli, args(tmp_path / "q"))
    assert isinstance(res.exception, Interrupted) and res.exception.exit_code == 130  # main() exits with it
    assert not (tmp_path / "q").exists()
    assert "the recovery at step 2 of 4 saved" in str(res.exception) and "--resume" in str(res.exception)
    part = tmp_path / "q.partial"
    assert (part / "state.pt").is_file() and (part / "quantized" / "config.json").is_file()
    monkeypatch.setattr(TrainProgress, "update", real)
    again = CliRunner().invoke(cli, args(tmp_path / "q"))
    assert again.exit_code != 0 and "--resume" in str(again.exception)
    monkeypatch.setattr(pipeline, "quantize", lambda *a, **k: pytest.fail("--resume quantized again"))
    res = CliRunner().invoke(cli, args(tmp_path / "q") + ["--resume"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert load_drafter(tmp_path / "q").provenance[-1]["recovery"]["resumed_from"] == 2 and not part.exists()
    a = st.load_file(str(tmp_path / "full" / "model.safetensors"))
    b = st.load_file(str(tmp_path / "q" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
