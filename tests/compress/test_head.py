"""The draft head: low-rank factorisation (SVD, activation-aware), the shared head, prune's head stages,
their bytes and provenance, save -> load, recovery, and lossless decoding with every policy."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from drafters_common import CONFIGS, V, make, run, tiny_target

from specpress.compress.prune import PruneConfig, prune
from specpress.errors import ConfigError, RequestError, UsageError
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.heads import LowRankHead, factorise
from specpress.models.inspect import inspect_artifact
from specpress.models.io import tensor_index
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.loop import speculative_generate
from specpress.runtime.plain import decode_plain
from specpress.runtime.policy import parse_policy

STREAM = torch.randint(1, V, (800,), generator=torch.Generator().manual_seed(7))
SMALL = dict(batch=2, seq_len=16)
POLICIES = ["chain:3", "tree:[[0],[1],[0,0],[1,0],[0,1],[0,0,0]]", "dynamic:depth=3,topk=3,budget=8"]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def untied_lm(target, seed: int = 1):
    """The shared tiny lm drafter config with an untied head (the one a low-rank head may replace)."""
    from drafters_common import randomize

    return randomize(build_drafter(CONFIGS["lm"]), seed).attach_target(target)


# ----------------------------------------------------------------------------------------------
# The factorisation
# ----------------------------------------------------------------------------------------------


def test_factorise_is_exact_at_full_rank_and_eckart_young_below():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 12, generator=g)
    down, up = factorise(w, 12)
    assert down.shape == (12, 12) and up.shape == (40, 12)
    assert torch.allclose(up @ down, w, atol=1e-5)
    s = torch.linalg.svdvals(w.double())
    for r in (1, 5, 9):
        down, up = factorise(w, r)
        err = (w.double() - (up @ down).double()).norm()
        assert abs(float(err) - float(s[r:].pow(2).sum().sqrt())) < 1e-4  # the best rank-r approximation
        assert torch.allclose(up.norm(dim=0), down.norm(dim=1), rtol=1e-4)  # singular values split evenly


def test_activation_aware_factors_reproduce_the_outputs_better():
    """On inputs with a few dominant directions, whitened SVD has the lower OUTPUT error and plain SVD the
    lower WEIGHT error: each optimises what it says."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(48, 16, generator=g)
    x = torch.randn(2000, 16, generator=g) * torch.linspace(3.0, 0.05, 16)  # anisotropic inputs
    cov = x.T @ x / x.shape[0]
    plain, aware = factorise(w, 4), factorise(w, 4, cov)

    def out_err(f):
        return float(((w - f[1] @ f[0]) @ x.T).norm())

    def w_err(f):
        return float((w - f[1] @ f[0]).norm())

    assert out_err(aware) < 0.8 * out_err(plain)
    assert w_err(plain) < w_err(aware)


# ----------------------------------------------------------------------------------------------
# prune --head-rank / --share-head
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["eagle3", "lm"])
def test_low_rank_head_saves_loads_and_is_counted(family, target, tmp_path):
    d = untied_lm(target) if family == "lm" else make(family, target)
    vocab = d.config.draft_vocab_size if family == "eagle3" else V
    h = d.config.hidden_size
    p = prune(d, PruneConfig(head_rank=4))
    assert isinstance(p.lm_head, LowRankHead) and p.config.head_rank == 4
    assert (p.lm_head.down.weight.shape, p.lm_head.up.weight.shape) == ((4, h), (vocab, 4))
    head_w = d.lm_head.weight.detach()
    assert torch.allclose(p.lm_head.up.weight @ p.lm_head.down.weight,
                          torch.stack([up @ down for down, up in [factorise(head_w, 4)]])[0], atol=1e-5)
    step = p.provenance[-1]
    assert step["importance"]["head"]["params_before"] == vocab * h
    assert step["importance"]["head"]["params_after"] == 4 * (vocab + h)
    assert step["params_before"] - step["params_after"] == vocab * h - 4 * (vocab + h)
    assert step["shape_after"]["head_rank"] == 4 and "head_rank" not in step["shape_before"]
    out = save_drafter(p, tmp_path / "lr")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["head_rank"] == 4
    names = set(tensor_index(out))
    assert {"lm_head.down.weight", "lm_head.up.weight"} <= names and "lm_head.weight" not in names
    q = load_drafter(out, target)
    assert torch.equal(run(q, target), run(p, target))
    info = inspect_artifact(out)
    assert info["params"] == sum(t.numel() for t in p.parameters())
    assert info["bytes"] == sum(t.nbytes for t in tensor_index(out).values()) and info["shared_bytes"] == 0
    meta = inspect_artifact(out / "config.json")  # no weights: counted on the meta device from the config alone
    assert meta["params"] == info["params"] and meta["bytes"] == info["bytes"]


def test_shared_head_reads_the_targets_rows_and_counts_them_apart(target, tmp_path):
    d = make("eagle3", target)
    p = prune(d, PruneConfig(share_head=True))
    assert p.lm_head is None and p.config.shared_head
    assert not any(k.startswith("lm_head") for k in p.public_state_dict())
    out = save_drafter(p, tmp_path / "shared")
    assert json.loads((out / "config.json").read_text())["shared_head"] is True
    q = load_drafter(out, target)
    ids = torch.randint(1, V, (1, 9), generator=torch.Generator().manual_seed(2))
    t_out = target(ids, taps=q.taps)
    logits, g = q(q.fuse_taps(t_out.taps)[:, :-1], ids[:, 1:])
    rows = target.lm_head.weight[q.to_target_ids(torch.arange(q.config.draft_vocab_size))]
    assert torch.allclose(logits, F.linear(q.norm(g), rows), atol=1e-6)
    info = inspect_artifact(out)
    h, vd = d.config.hidden_size, d.config.draft_vocab_size
    assert info["shared_head_params"] == vd * h and info["shared_bytes"] == vd * h * 4  # fp32 artifact
    assert info["params"] == sum(t.numel() for t in d.parameters()) - vd * h
    with pytest.raises(RequestError, match="attach_target"):  # the head comes from the target at load
        load_drafter(out).head_logits(q.norm(g))


def test_vocab_then_head_in_one_call_and_vocab_after_a_head(target):
    d = make("eagle3", target)
    p = prune(d, PruneConfig(vocab=12, head_rank=3, vocab_source="data", vocab_tokens=512), calib=STREAM)
    assert p.config.draft_vocab_size == 12 and p.lm_head.up.weight.shape == (12, 3)
    assert list(p.provenance[-1]["importance"]) == ["method", "vocab", "head"]
    for first in (PruneConfig(head_rank=4), PruneConfig(share_head=True)):
        a = prune(d, first)
        b = prune(a, PruneConfig(vocab=10, vocab_source="data", vocab_tokens=512), calib=STREAM)
        kept = b.to_target_ids(torch.arange(10))
        if first.share_head:
            assert b.lm_head is None
        else:  # the up factor keeps the kept tokens' rows, the down factor is unchanged
            pos = [int((a.to_target_ids(torch.arange(24)) == i).nonzero()) for i in kept]
            assert torch.equal(b.lm_head.up.weight, a.lm_head.up.weight[pos])
            assert torch.equal(b.lm_head.down.weight, a.lm_head.down.weight)


def test_structural_pruning_keeps_a_low_rank_or_shared_head(target, tmp_path):
    d = make("eagle3", target)
    for first in (PruneConfig(head_rank=4), PruneConfig(share_head=True)):
        a = prune(d, first)
        c = a.config
        b = prune(a, PruneConfig(ffn=c.intermediate_size // 2, kv_heads=c.num_key_value_heads // 2))
        assert b.config.head_rank == a.config.head_rank and b.config.shared_head == a.config.shared_head
        if a.lm_head is not None:
            assert torch.equal(b.lm_head.up.weight, a.lm_head.up.weight)
        assert torch.equal(run(load_drafter(save_drafter(b, tmp_path / str(first.share_head)), target), target),
                           run(b, target))


def test_activation_init_whitens_with_the_heads_calibration_inputs(target):
    """prune --head-init activation factorises with the covariance of the head's inputs on the calibration
    windows (the same windows and chained steps as the other stages) and beats plain SVD on those outputs."""
    from specpress.compress.head import head_input_covariance
    from specpress.compress.importance import calibration_signals, calibration_windows, make_probes

    d = make("eagle3", target)
    act = prune(d, PruneConfig(head_rank=3, head_init="activation", **SMALL), target=target, calib=STREAM)
    windows, _ = calibration_windows(STREAM, 2, 16, 0, 2)
    cov = head_input_covariance(d, make_probes(d, calibration_signals(target, windows, d.taps)))
    down, up = factorise(d.lm_head.weight, 3, cov)
    assert torch.allclose(act.lm_head.down.weight, down, atol=1e-5) and torch.allclose(act.lm_head.up.weight, up,
                                                                                          atol=1e-5)
    rec = act.provenance[-1]["importance"]["head"]
    plain_down, plain_up = factorise(d.lm_head.weight, 3)
    w = d.lm_head.weight.detach()

    def out_err(a, b):
        diff = w - b @ a
        return float(((diff @ cov.float()) * diff).sum().sqrt() / ((w @ cov.float()) * w).sum().sqrt())

    assert rec["init"] == "activation" and abs(rec["output_rel_error"] - out_err(down, up)) < 1e-4
    assert out_err(down, up) < out_err(plain_down, plain_up)


def test_recovery_trains_the_drafter_against_the_frozen_shared_rows(target):
    d = make("eagle3", target)
    head_before = target.lm_head.weight.detach().clone()
    p = prune(d, PruneConfig(share_head=True, recover_steps=2, recover_lr=1e-2, **SMALL), target=target, calib=STREAM)
    assert [s["step"] for s in p.provenance] == ["prune", "distill"]
    assert torch.equal(target.lm_head.weight, head_before)
    assert not torch.equal(p.fc.weight, d.fc.weight)
    r = prune(d, PruneConfig(head_rank=4, recover_steps=2, recover_lr=1e-2, **SMALL), target=target, calib=STREAM)
    assert r.provenance[-1]["step"] == "distill" and isinstance(r.lm_head, LowRankHead)
    down0, _ = factorise(d.lm_head.weight, 4)
    assert not torch.allclose(r.lm_head.down.weight, down0.to(r.lm_head.down.weight.dtype))


@pytest.fixture(scope="module")
def easy_target():
    """A random target that nearly always predicts token 1, so random drafters get drafts accepted."""
    t = tiny_target()
    with torch.no_grad():
        t.lm_head.weight[1] *= 25.0
    return t


@pytest.mark.parametrize("variant", ["eagle3-rank", "eagle3-shared", "lm-rank"])
@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_speculative_equals_plain_with_every_policy(variant, policy, target, easy_target):
    accepted = 0
    for tgt in (target, easy_target):
        family, kind = variant.split("-")
        d = untied_lm(tgt) if family == "lm" else make(family, tgt)
        if family == "eagle3":
            d.set_draft_vocab(torch.arange(24))
        d = prune(d, PruneConfig(head_rank=3) if kind == "rank" else PruneConfig(share_head=True))
        for prompt in ([5, 9, 13, 2, 44, 7], [30, 31, 32, 33, 34]):
            ref = decode_plain(TorchTarget(tgt), prompt, 24, eos_ids=()).tokens
            got = speculative_generate(TorchTarget(tgt), drafter_runner(d), prompt, 24, parse_policy(policy),
                                       eos_ids=())
            assert got.tokens == ref, f"{variant} {policy} {prompt}"
            accepted += sum(r.accepted for r in got.rounds)
    assert accepted > 0


# ----------------------------------------------------------------------------------------------
# Refusals
# ----------------------------------------------------------------------------------------------


def test_impossible_head_requests_are_refused_by_name(target):
    with pytest.raises(RequestError, match="--share-head: lm drafters own their vocabulary"):
        prune(untied_lm(target), PruneConfig(share_head=True))
    for fam in ("eagle", "mtp", "dflash"):
        with pytest.raises(RequestError, match=f"--head-rank: {fam} drafters draft through the target's head"):
            prune(make(fam, target), PruneConfig(head_rank=2))
        with pytest.raises(RequestError, match=f"--share-head: {fam} drafters draft through the target's head"):
            prune(make(fam, target), PruneConfig(share_head=True))
    d = make("eagle3", target)
    with pytest.raises(UsageError, match="exclude each other"):
        prune(d, PruneConfig(head_rank=2, share_head=True))
    with pytest.raises(RequestError, match=r"saves bytes for R in 1\.\.13"):  # 32 x 24 / (32 + 24) = 13.7
        prune(d, PruneConfig(head_rank=14))
    with pytest.raises(RequestError, match="already low rank"):
        prune(prune(d, PruneConfig(head_rank=4)), PruneConfig(head_rank=2))
    with pytest.raises(RequestError, match="already shares"):
        prune(prune(d, PruneConfig(share_head=True)), PruneConfig(head_rank=2))
    tied = build_drafter(dataclasses.replace(CONFIGS["lm"], tie_word_embeddings=True)).attach_target(target)
    with pytest.raises(RequestError, match="tied to its embeddings"):
        prune(tied, PruneConfig(head_rank=2))
    with pytest.raises(UsageError, match="--head-init activation needs calibration by the target"):
        prune(d, PruneConfig(head_rank=2, head_init="activation"))
    with pytest.raises(ConfigError, match="--head-init 'pca' is not known"):
        PruneConfig(head_rank=2, head_init="pca")
    with pytest.raises(ConfigError, match="exclude each other"):
        dataclasses.replace(CONFIGS["eagle3"], head_rank=2, shared_head=True)
    with pytest.raises(ConfigError, match="head_rank' must be an integer in 1..23"):
        dataclasses.replace(CONFIGS["eagle3"], head_rank=24)
