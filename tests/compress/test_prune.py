"""Structured pruning: smaller dense drafters that reload, exact slicing, GQA, vocab, importance, CLI."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from cli_common import run_main
from drafters_common import FAMILIES, SHAPE, L, V, make, run, save_with_tokenizer, tiny_target

from specpress.compress.data import WindowSampler
from specpress.compress.importance import (calibration_signals, ffn_scores, fit, head_scores, layer_scores,
                                           make_probes, mlps)
from specpress.compress.prune import PruneConfig, prune, shrink_vocab, slice_ffn
from specpress.errors import ConfigError, RequestError
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.eagle3 import Eagle3Config
from specpress.models.inspect import inspect_artifact
from specpress.models.lm import LMConfig, LMDrafter
from specpress.models.target import TargetConfig, TargetModel
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.loop import speculative_generate
from specpress.runtime.plain import decode_plain
from specpress.runtime.policy import parse_policy

STREAM = torch.randint(1, V, (600,), generator=torch.Generator().manual_seed(7))
SMALL = dict(batch=2, seq_len=16)  # calibration windows
# What each family can prune (lm: the 2-KV-head oracle below; the shared lm config has one KV head).
REQUESTS = {  # what stays: 20 of the 40 FFN channels, 1 of the 2 KV groups
    "eagle": dict(ffn=20, kv_heads=1),
    "eagle3": dict(ffn=20, kv_heads=1, vocab=12, vocab_tokens=512),  # the default 262k: ~45 s on a tiny target
    "mtp": dict(ffn=20, kv_heads=1),
    "dflash": dict(ffn=20, kv_heads=1, layers=1),
    "lm": dict(ffn=20, kv_heads=1, layers=5),
}


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return tiny_target()


def oracle_lm(target: TargetModel) -> LMDrafter:
    """An lm drafter holding the target's own weights: KL(target || drafter) = 0 before pruning."""
    d = LMDrafter(LMConfig.from_target_config(target.config))
    d.load_state_dict(target.state_dict())
    return d.eval().attach_target(target)


def drafter(family: str, target: TargetModel):
    return oracle_lm(target) if family == "lm" else make(family, target)


def rows_in(small: torch.Tensor, big: torch.Tensor) -> list[int]:
    """Index in `big` of each row of `small` (exact copies)."""
    return [int((big == r).all(1).nonzero()[0]) for r in small]


# ------------------------------------------------------------------------------------ shapes, files


@pytest.mark.parametrize("family", FAMILIES)
def test_smaller_dense_model_saves_and_reloads(family, target, tmp_path):
    d = drafter(family, target)
    before = save_drafter(d, tmp_path / "before")
    p = prune(d, PruneConfig(**REQUESTS[family], **SMALL), target=target, calib=STREAM)
    c0, c1 = d.config, p.config
    assert c1.intermediate_size == c0.intermediate_size // 2
    assert (c1.num_key_value_heads, c1.num_attention_heads) == (1, c0.num_attention_heads // 2)
    assert c1.head_dim == c0.head_dim
    if "layers" in REQUESTS[family]:
        assert c1.num_hidden_layers == REQUESTS[family]["layers"]
    if family == "eagle3":
        assert c1.draft_vocab_size == 12
    fresh = build_drafter(c1).state_dict()  # the new config's own shapes
    assert {k: v.shape for k, v in p.state_dict().items()} == {k: v.shape for k, v in fresh.items()}
    step = p.provenance[-1]
    assert step["step"] == "prune" and step["params_after"] < step["params_before"]
    assert step["bytes_after"] < step["bytes_before"] and step["config"]["ffn"] == 20
    out = save_drafter(p, tmp_path / "after")
    assert (out / "model.safetensors").stat().st_size < (before / "model.safetensors").stat().st_size
    info = inspect_artifact(out)
    assert info["bytes"] == step["bytes_after"] and info["params"] == step["params_after"]
    back = load_drafter(out, target)
    assert back.config == p.config and back.provenance == p.provenance
    assert torch.equal(run(back, target), run(p, target))
    assert torch.equal(run(d, target), run(drafter(family, target), target))  # the input was left unchanged


def test_head_dim_stays_explicit_when_hidden_no_longer_divides(target, tmp_path):
    cfg = Eagle3Config(**{**SHAPE, "num_attention_heads": 8, "num_key_value_heads": 4}, draft_vocab_size=24)
    d = build_drafter(cfg, target)
    p = prune(d, PruneConfig(heads=0.5))
    assert (p.config.num_attention_heads, p.config.num_key_value_heads, p.config.head_dim) == (4, 2, 4)
    assert p.config.hidden_size % p.config.num_attention_heads == 0 and p.config.hidden_size // 4 != 4
    out = save_drafter(p, tmp_path / "e3")
    assert json.loads((out / "config.json").read_text())["head_dim"] == 4
    assert load_drafter(out, target).config.head_dim == 4


# ------------------------------------------------------------------------------------ exact slicing


def zeroed_ffn(d, p):
    """`d` with the FFN channels `p` dropped zeroed (found by matching p's gate rows to d's)."""
    z = copy.deepcopy(d)
    for (name, m), (_, pm) in zip(z.named_modules(), p.named_modules()):
        if name.endswith("mlp") and hasattr(m, "down_proj"):
            keep = rows_in(pm.gate_proj.weight, m.gate_proj.weight)
            gone = [i for i in range(m.gate_proj.weight.shape[0]) if i not in keep]
            assert len(gone) == m.gate_proj.weight.shape[0] - pm.gate_proj.weight.shape[0]
            with torch.no_grad():
                m.gate_proj.weight[gone] = 0
                m.up_proj.weight[gone] = 0
                m.down_proj.weight[:, gone] = 0
    return z


def zeroed_heads(d, p):
    """`d` with the KV groups `p` dropped zeroed; checks the kept query heads are exactly their groups'."""
    z = copy.deepcopy(d)
    mods = dict(p.named_modules())
    for name, a in z.named_modules():
        if not name.endswith("self_attn"):
            continue
        pa, rep, hd = mods[name], a.nq // a.nkv, a.d
        assert pa.nq // pa.nkv == rep  # GQA group size unchanged
        keep = [r // hd for r in rows_in(pa.k_proj.weight[::hd], a.k_proj.weight)]
        assert rows_in(pa.v_proj.weight[::hd], a.v_proj.weight) == [g * hd for g in keep]
        q_rows = [(g * rep + j) * hd + i for g in keep for j in range(rep) for i in range(hd)]
        assert torch.equal(pa.q_proj.weight, a.q_proj.weight[q_rows])  # each kept KV head keeps its own query heads
        gone = [g for g in range(a.nkv) if g not in keep]
        with torch.no_grad():
            for g in gone:
                a.k_proj.weight[g * hd:(g + 1) * hd] = 0
                a.v_proj.weight[g * hd:(g + 1) * hd] = 0
                a.q_proj.weight[g * rep * hd:(g + 1) * rep * hd] = 0
                a.o_proj.weight[:, g * rep * hd:(g + 1) * rep * hd] = 0
    return z


def zeroed_layers(d, p, stack: str):
    """`d` with the layers `p` dropped made identities (o_proj and down_proj zeroed)."""
    z = copy.deepcopy(d)
    layers, kept = z.get_submodule(stack), p.get_submodule(stack)
    keep = [rows_in(k.post_attention_layernorm.weight[None], torch.stack([l.post_attention_layernorm.weight
                                                                          for l in layers]))[0] for k in kept]
    with torch.no_grad():
        for i, l in enumerate(layers):
            if i not in keep:
                l.self_attn.o_proj.weight.zero_()
                l.mlp.down_proj.weight.zero_()
    return z


CASES = [(f, "ffn") for f in FAMILIES] + [(f, "heads") for f in FAMILIES] + [("dflash", "layers"), ("lm", "layers")]


@pytest.mark.parametrize("family,kind", CASES)
@pytest.mark.parametrize("importance", ["magnitude", "kl"])
def test_pruned_equals_original_with_removed_units_zeroed(family, kind, importance, target):
    d = drafter(family, target)
    req = {"ffn": {"ffn": 0.4}, "heads": {"heads": 0.5}, "layers": {"layers": 1 if family == "dflash" else 5}}[kind]
    p = prune(d, PruneConfig(**req, importance=importance, kl_group=4, **SMALL), target=target, calib=STREAM)
    if kind == "ffn":
        z = zeroed_ffn(d, p)
    elif kind == "heads":
        z = zeroed_heads(d, p)
    else:
        z = zeroed_layers(d, p, "layers" if family == "dflash" else "model.layers")
    a, b = run(p, target), run(z, target)
    assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).abs().max()
    assert not torch.allclose(run(d, target), b, atol=1e-3)  # the zeroing mattered: the check can fail


# ------------------------------------------------------------------------------------ vocabulary


def test_vocab_keeps_the_most_frequent_tokens_and_d2t_t2d_agree(target):
    d = make("eagle3", target)
    old = d.to_target_ids(torch.arange(24)).tolist()
    g = torch.Generator().manual_seed(1)
    counts = {t: int(c) for t, c in zip(range(V), torch.randperm(V, generator=g) + 1)}  # distinct counts
    stream = np.repeat(np.arange(V), [counts[t] for t in range(V)])
    np.random.default_rng(0).shuffle(stream)
    p = prune(d, PruneConfig(vocab=10, vocab_source="data", batch=len(stream) // 40, seq_len=39, calib_batches=1),
              calib=torch.from_numpy(stream[: 40 * (len(stream) // 40)].reshape(-1, 40)))
    window_counts = np.bincount(stream[: 40 * (len(stream) // 40)], minlength=V)
    want = sorted(sorted(old, key=lambda t: (-window_counts[t], t))[:10])
    kept = p.to_target_ids(torch.arange(10)).tolist()
    assert kept == want  # the 10 most frequent of the old draft vocab, ascending
    assert p.d2t.tolist() == [t - i for i, t in enumerate(kept)]  # target id = draft id + d2t[draft id]
    assert p.t2d.nonzero().flatten().tolist() == kept and int(p.t2d.sum()) == 10
    # the reduced head is the old head's rows of the kept tokens: the weights exactly; the logits to
    # float rounding, since a matmul with 10 output columns may sum in another order than one with 24
    rows = [old.index(t) for t in kept]
    assert torch.equal(p.lm_head.weight, d.lm_head.weight[rows])
    torch.testing.assert_close(run(p, target)[..., :10], run(d, target)[..., rows], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("n_batches", [3, 11])
def test_vocab_from_target_predictions_over_vocab_tokens(target, n_batches):
    """The vocabulary is ranked on ~vocab_tokens target predictions, not on the (fewer) calibration windows."""
    d = make("eagle3", target)
    n_tok = n_batches * SMALL["batch"] * SMALL["seq_len"] - 5  # rounds up to whole window batches
    p = prune(d, PruneConfig(vocab=8, **SMALL, calib_batches=2, vocab_tokens=n_tok), target=target, calib=STREAM)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # how prune runs an fp32 target on CPU
        probes_ids = torch.cat([s.logits.argmax(-1).flatten() for s in calibration_signals(
            target, [w for w in _windows(n_batches)], d.taps)])
    c = torch.bincount(probes_ids, minlength=V)
    old = d.to_target_ids(torch.arange(24)).tolist()
    want = sorted(sorted(old, key=lambda t: (-int(c[t]), t))[:8])
    assert p.to_target_ids(torch.arange(8)).tolist() == want
    rec = p.provenance[-1]["importance"]["vocab"]
    assert rec["source"] == "target" and rec["coverage_after"] <= rec["coverage_before"]
    assert rec["counted_tokens"] == n_batches * SMALL["batch"] * SMALL["seq_len"]


def _windows(n: int) -> list[torch.Tensor]:
    """The calibration windows prune draws from STREAM with SMALL (WindowSampler steps 0..n-1, seed 0)."""
    s = WindowSampler(STREAM.numpy().astype(np.int64), SMALL["seq_len"], SMALL["batch"], 0)
    return [s.batch_at(i) for i in range(n)]


def test_shrink_vocab_refuses_tokens_outside_the_draft_vocab(target):
    d = make("eagle3", target)
    outside = int((~d.t2d).nonzero()[0])
    with pytest.raises(RequestError, match="already in the drafter's draft vocabulary"):
        shrink_vocab(d, torch.tensor([outside]))


# ------------------------------------------------------------------------------------ importance


def harmless_heavy(target: TargetModel, chosen: list[int]) -> tuple[TargetModel, LMDrafter]:
    """A target whose FFN channels `chosen` have large gate/down weights but a zero up row (no effect), and
    its oracle lm drafter."""
    t = copy.deepcopy(target)
    with torch.no_grad():
        for layer in t.model.layers:
            m = layer.mlp
            m.up_proj.weight[chosen] = 0
            m.gate_proj.weight[chosen] *= 8
            m.down_proj.weight[:, chosen] *= 8
    return t, oracle_lm(t)


def probes_of(d, target, n=2):
    return make_probes(d, calibration_signals(target, _windows(n), d.taps))


def test_kl_and_activation_find_harmless_heavy_channels_magnitude_does_not(target):
    chosen = [1, 5, 6, 11, 17, 20, 23, 30, 33, 38]
    t, d = harmless_heavy(target, chosen)
    for importance in ("kl", "activation"):
        p = prune(d, PruneConfig(ffn=0.25, importance=importance, kl_group=1, **SMALL), target=t, calib=STREAM)
        for a, b in zip(d.model.layers, p.model.layers):
            assert sorted(set(range(40)) - set(rows_in(b.mlp.gate_proj.weight, a.mlp.gate_proj.weight))) == chosen
        assert p.provenance[-1]["calibration"]["kl_after"] < 1e-6  # nothing that mattered was removed
    mag = ffn_scores(d, "magnitude")["model.layers.0.mlp"]
    assert set(mag.argsort()[:10].tolist()) != set(chosen)  # the case is one magnitude gets wrong


def test_kl_groups_pick_zeroed_channels_and_beat_random(target):
    d = oracle_lm(target)
    zero = [0, 3, 4, 9, 15, 22, 31, 39]
    with torch.no_grad():
        for layer in d.model.layers:
            for w in (layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight):
                w[zero] = 0
            layer.mlp.down_proj.weight[:, zero] = 0
    probes = probes_of(d, target)
    s = ffn_scores(d, "kl", probes, kl_group=8)["model.layers.0.mlp"]  # one group of 8 = the zeroed channels
    assert s[zero].abs().max() < 1e-7 and s[[i for i in range(40) if i not in zero]].min() > 0
    # On the oracle itself: kl's choice of 25 % of channels costs less KL than random choices do.
    d = oracle_lm(target)
    cfg = PruneConfig(ffn=0.25, importance="kl", kl_group=1, **SMALL)
    kl_cost = prune(d, cfg, target=target, calib=STREAM).provenance[-1]["calibration"]["kl_after"]
    g = torch.Generator().manual_seed(0)
    random_costs = [fit(slice_ffn(d, {n: torch.randperm(40, generator=g)[:30].sort().values for n in mlps(d)}),
                        probes_of(d, target))["kl"] for _ in range(4)]
    assert kl_cost < min(random_costs), (kl_cost, random_costs)


def test_head_and_layer_importance_on_constructed_cases(target):
    t = copy.deepcopy(target)
    with torch.no_grad():  # KV group 0 of every layer: large q/k/o but zero values -> no effect
        for layer in t.model.layers:
            a = layer.self_attn
            a.v_proj.weight[:a.d] = 0
            a.q_proj.weight[:2 * a.d] *= 6
            a.o_proj.weight[:, :2 * a.d] *= 6
        l3 = t.model.layers[3]  # layer 3: heavy o_proj / down_proj, but zero values and up rows -> identity
        l3.self_attn.v_proj.weight.zero_()
        l3.mlp.up_proj.weight.zero_()
        l3.self_attn.o_proj.weight.mul_(6)
        l3.mlp.down_proj.weight.mul_(6)
    d = oracle_lm(t)
    probes = probes_of(d, t)
    for method in ("kl", "activation"):
        assert head_scores(d, method, probes)["model.layers.0.self_attn"].argmin() == 0
        assert layer_scores(d, method, probes).argmin() == 3
    assert head_scores(d, "magnitude")["model.layers.0.self_attn"].argmin() != 0
    assert layer_scores(d, "magnitude").argmin() != 3
    p = prune(d, PruneConfig(heads=0.5, layers=7, importance="kl", **SMALL), target=t, calib=STREAM)
    rec = p.provenance[-1]["importance"]
    assert rec["layers"]["removed"] == [3]
    assert list(rec["heads"]["removed_kv_groups"].values()) == [[0]] * 7
    assert p.provenance[-1]["calibration"]["kl_after"] < 1e-6
    assert d.model.layers[0].self_attn.nkv == 2  # the input drafter kept its shape


# ------------------------------------------------------------------------------------ runtime, composition


LOOP = {"eagle": "chain:3", "eagle3": "chain:3", "mtp": "mtp:3", "dflash": "block:4", "lm": "chain:4"}


@pytest.mark.parametrize("family", FAMILIES)
def test_speculative_loop_stays_lossless_with_pruned_drafter(family, target):
    d = drafter(family, target)
    p = prune(d, PruneConfig(**REQUESTS[family], importance="kl", **SMALL), target=target, calib=STREAM)
    accepted = 0
    for prompt in ([5, 9, 13, 2, 44, 7], [30, 31, 32, 33]):
        ref = decode_plain(TorchTarget(target), prompt, 20, eos_ids=()).tokens
        got = speculative_generate(TorchTarget(target), drafter_runner(p), prompt, 20, parse_policy(LOOP[family]),
                                   eos_ids=())
        assert got.tokens == ref
        accepted += sum(r.accepted for r in got.rounds)
    if family == "lm":
        assert accepted > 0  # a pruned oracle still drafts acceptable tokens


def test_steps_compose_and_inspect_shows_the_chain(target, tmp_path):
    d = make("eagle3", target)
    a = prune(d, PruneConfig(ffn=0.5))
    b = prune(a, PruneConfig(heads=0.5, vocab=16, vocab_source="data"), calib=STREAM)
    assert [s["step"] for s in b.provenance] == ["prune", "prune"]
    assert b.provenance[0]["bytes_after"] == b.provenance[1]["bytes_before"]
    assert b.provenance[1]["shape_before"]["intermediate_size"] == 20
    info = inspect_artifact(save_drafter(b, tmp_path / "b"))
    assert [s["config"] for s in info["provenance"]] == [s["config"] for s in b.provenance]
    assert info["bytes"] == b.provenance[-1]["bytes_after"]


# ------------------------------------------------------------------------------------ bad input


def test_bad_inputs_are_clear(target):
    for bad in (0, 0.0, 1.5, True):
        with pytest.raises(ConfigError, match=r"--ffn must be the FFN channels each layer keeps, an integer >= 1"):
            PruneConfig(ffn=bad)
    with pytest.raises(ConfigError, match=r"--heads .*\(0, 1\).*--kv-heads N"):
        PruneConfig(heads=1.0)
    with pytest.raises(ConfigError, match="--kv-heads must be an integer >= 1"):
        PruneConfig(kv_heads=0)
    with pytest.raises(ConfigError, match="give --kv-heads only"):
        PruneConfig(kv_heads=1, heads=0.5)
    with pytest.raises(ConfigError, match="nothing to prune"):
        PruneConfig()
    with pytest.raises(ConfigError, match="--importance.*magnitude, activation, kl"):
        PruneConfig(ffn=0.5, importance="taylor")
    with pytest.raises(ConfigError, match="unknown key.*'fnn'"):
        PruneConfig.from_dict({"fnn": 0.5})
    with pytest.raises(ConfigError, match="--layers must be an integer >= 1"):
        PruneConfig(layers=0)
    e3, eagle, mtp = make("eagle3", target), make("eagle", target), make("mtp", target)
    with pytest.raises(RequestError, match=r"--kv-heads 2 must be less than the drafter's 2 KV groups \(valid range"):
        prune(e3, PruneConfig(kv_heads=2))
    with pytest.raises(RequestError, match=r"--ffn 40 must be less than the drafter's 40 FFN channels \(valid "
                                           r"range 1..39"):
        prune(e3, PruneConfig(ffn=40))
    with pytest.raises(RequestError, match="--kv-heads: the drafter has a single KV group"):
        prune(prune(e3, PruneConfig(kv_heads=1)), PruneConfig(kv_heads=1))
    with pytest.raises(RequestError, match="--heads 0.9 would remove all 2 KV groups.*below one"):
        prune(e3, PruneConfig(heads=0.9))
    with pytest.raises(RequestError, match="--heads: the drafter has a single KV group"):
        prune(prune(e3, PruneConfig(heads=0.5)), PruneConfig(heads=0.5))
    with pytest.raises(RequestError, match=r"--ffn 0.001 removes no FFN channel of 40.*valid range"):
        prune(e3, PruneConfig(ffn=0.001))
    for d in (e3, mtp, eagle):
        with pytest.raises(RequestError, match="--layers: .*single layer.*multi-layer drafters"):
            prune(d, PruneConfig(layers=1))
    with pytest.raises(RequestError, match=r"--layers 2 must be less than the drafter's 2 layers \(valid range 1..1"):
        prune(make("dflash", target), PruneConfig(layers=2))
    with pytest.raises(RequestError, match=r"--vocab 30 is larger than the drafter's draft vocabulary \(24.*1..24"):
        prune(e3, PruneConfig(vocab=30), target=target, calib=STREAM)
    with pytest.raises(RequestError, match="--vocab: eagle drafters.*supported for eagle3"):
        prune(eagle, PruneConfig(vocab=10), target=target, calib=STREAM)
    with pytest.raises(RequestError, match="--importance kl needs calibration by the target: give --target DIR"):
        prune(e3, PruneConfig(ffn=0.5, importance="kl"))
    with pytest.raises(RequestError, match="--importance activation needs calibration data"):
        prune(e3, PruneConfig(ffn=0.5, importance="activation"), target=target)
    with pytest.raises(RequestError, match="--vocab.*needs calibration data"):
        prune(e3, PruneConfig(vocab=10, vocab_source="data"))


# ------------------------------------------------------------------------------------ CLI


def _target_dir(tmp_path):
    t = TargetModel(TargetConfig(**SHAPE, num_hidden_layers=L, eos_token_id=0))  # tiny_target() + an EOS id
    t.load_state_dict(tiny_target().state_dict())
    tdir, data = save_with_tokenizer(t, tmp_path)
    return tdir, data, t


def test_cli_end_to_end_compose_recover_and_errors(tmp_path):
    from click.testing import CliRunner

    from specpress.cli import cli

    tdir, data, t = _target_dir(tmp_path)
    src = save_drafter(make("eagle3", t), tmp_path / "e3")
    out = tmp_path / "p1"
    args = ["prune", "--drafter", str(src), "--out", str(out), "--ffn", "20", "--kv-heads", "1", "--vocab", "12",
            "--vocab-tokens", "512", "--importance", "kl", "--target", str(tdir), "--data", str(data), "--batch", "2", "--seq-len", "16"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "intermediate_size 40 -> 20" in res.output and "draft_vocab_size 24 -> 12" in res.output
    d = load_drafter(out, t)
    assert d.config.draft_vocab_size == 12 and d.provenance[-1]["calibration"]["source"] == str(data)
    res = CliRunner().invoke(cli, args)
    assert isinstance(res.exception, RequestError) and "--force" in str(res.exception)
    out2 = tmp_path / "p2"
    res = CliRunner().invoke(cli, ["prune", "--drafter", str(out), "--out", str(out2), "--ffn", "15",
                                   "--target", str(tdir), "--data", str(data), "--batch", "2", "--seq-len", "16",
                                   "--recover-steps", "2"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    res = CliRunner().invoke(cli, ["inspect", str(out2), "--json"])
    steps = json.loads(res.output)["provenance"]
    assert [s["step"] for s in steps] == ["prune", "prune", "distill"] and steps[-1]["steps"] == 2
    assert steps[1]["config"]["recover_steps"] == 2 and steps[1]["shape_after"]["intermediate_size"] == 15
    assert load_drafter(out2, t).config.intermediate_size == 15
    bad = [("--ffn", "1.5", 2, r"'1.5' is not a count to keep"), ("--kv-heads", "0", 2, r"0 is not in the range x>=1"),
           ("--recover-steps", "-1", 2, r"-1 is not in the range x>=0"), ("--layers", "1", 1, "single layer"),
           ("--vocab", "99", 1, "larger than the drafter's draft vocabulary"),
           ("--ffn", "40", 1, "--ffn 40 must be less than the drafter's 40 FFN channels")]
    for flag, value, code, msg in bad:
        res = run_main("prune", "--drafter", src, "--out", tmp_path / "x", flag, value)
        assert res.exit_code == code and __import__("re").search(msg, res.stderr), (flag, res.stderr)
    res = run_main("prune", "--drafter", src, "--out", tmp_path / "y", "--ffn", "20", "--importance", "kl")
    assert res.exit_code == 2 and "--target DIR and --data PATH" in res.stderr  # the command line alone is wrong


def test_the_deprecated_shares_still_prune_the_same_and_say_the_count(tmp_path):
    """--ffn R / --heads R (shares to remove) work for one release: the same weights as the counts they stand
    for, and a warning that names those counts."""
    t = tiny_target()
    src = save_drafter(make("eagle3", t), tmp_path / "e3")
    new = run_main("prune", "--drafter", src, "--out", tmp_path / "new", "--ffn", "30", "--kv-heads", "1")
    old = run_main("prune", "--drafter", src, "--out", tmp_path / "old", "--ffn", "0.25", "--heads", "0.5")
    assert new.exit_code == old.exit_code == 0, (new.stderr, old.stderr)
    assert "warning: --ffn 0.25 (the share of FFN channels to remove) is deprecated" in old.stderr
    assert "--ffn 30 (of 40)" in old.stderr and "--kv-heads 1 (of 2)" in old.stderr and "warning" not in new.stderr
    a, b = load_drafter(tmp_path / "new", t), load_drafter(tmp_path / "old", t)
    assert a.config == b.config and all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                                        b.state_dict().values(), strict=True))


def test_a_quantized_drafter_is_refused(target):
    d = make("eagle3", target)
    d.provenance = ({"step": "quantize", "scheme": "int8"},)
    with pytest.raises(RequestError, match="quantized.*prune the unquantized drafter, then quantize"):
        prune(d, PruneConfig(ffn=0.5))
    d.provenance = ({"step": "quantize", "scheme": "int8", "dequantized": True},)
    assert prune(d, PruneConfig(ffn=0.5)).config.intermediate_size == 20


def test_cli_help_states_the_vocab_tokens_default():
    from click.testing import CliRunner

    from specpress.cli import cli
    from specpress.compress.prune import VOCAB_TOKENS

    res = CliRunner().invoke(cli, ["prune", "--help"])
    assert res.exit_code == 0 and f"[default: {VOCAB_TOKENS}]" in " ".join(res.output.split())
