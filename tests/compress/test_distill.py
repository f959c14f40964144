"""distill: per-family losses on a tiny random target, training-vs-inference alignment, determinism,
checkpoint/resume, the teacher cache, --from shrinking, the CLI end to end, and bad input."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from drafters_common import SHAPE, L, V, make, random_eos_target, save_with_tokenizer, tiny_target
from specpress.compress.agreement import agreement, batch_loss
from specpress.compress.config import DistillConfig
from specpress.compress.data import WindowSampler
from specpress.compress.distill import distill
from specpress.compress.losses import dflash_gamma, top1
from specpress.models.forced import block_inputs, unroll, unrolled_mask
from specpress.compress.students import draft_vocab_by_frequency, init_student
from specpress.errors import CheckpointError, ConfigError, DataError, RequestError
from specpress.models.drafter_io import load_drafter
from specpress.models.target import TargetConfig, TargetModel

FAMILIES = ["eagle", "eagle3", "mtp", "dflash", "lm"]
PATTERN = np.random.default_rng(0).integers(1, V, size=23)
STREAM = np.tile(PATTERN, 100).astype(np.int32)  # repetitive, so a student can really learn the target on it


@pytest.fixture(scope="module")
def target() -> TargetModel:
    t = tiny_target()
    with torch.no_grad():
        t.lm_head.weight.mul_(4)  # a confident target: the loss is dominated by what the student can learn
    return t


def cfg(family: str, **kw) -> DistillConfig:
    base = dict(family=family, steps=30, batch=4, seq_len=24, lr=3e-3, block_size=4, eval_batches=1,
                draft_vocab=32 if family == "eagle3" else None)
    return DistillConfig(**{**base, **kw})


def sampler(c: DistillConfig, stream: np.ndarray = STREAM) -> WindowSampler:
    return WindowSampler(stream, c.seq_len, c.batch, c.seed)


def weights(d) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in d.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------ losses


@pytest.mark.parametrize("family", FAMILIES)
def test_distillation_lowers_the_loss(family, target):
    c = cfg(family)
    ids = sampler(c).batch_at(0)
    with torch.no_grad():
        before = float(batch_loss(target, init_student(c, target, STREAM), ids, c).loss)
    rep = distill(target, c, sampler(c), None)
    with torch.no_grad():
        after = float(batch_loss(target, rep.drafter, ids, c).loss)
    assert after < 0.75 * before, (before, after)
    k = {"eagle3": 3, "dflash": 3}.get(family, 1)
    assert len(rep.agreement) == k and all(0 <= a <= 1 for a in rep.agreement)
    assert rep.steps == 30 and rep.stopped_by == "steps"


@pytest.mark.parametrize("family", FAMILIES)
def test_agreement_in_slices_of_a_batch_counts_what_the_whole_batch_does(family, target, monkeypatch):
    """agreement scores a batch a few windows at a time (what a 32k draft vocabulary costs per window): one
    window at a time gives the same per-position agreement as the whole batch, random draws (DFlash anchors)
    included, on a drafter that agrees with the target often enough for a difference to show."""
    import specpress.compress.agreement as A

    c = cfg(family, steps=15)
    d = distill(target, c, sampler(c), None).drafter
    whole = agreement(target, d, sampler(c), 2)
    assert A.agreement_rows(d, c.seq_len) >= c.batch  # the tiny drafter's batch fits in one slice
    monkeypatch.setattr(A, "AGREEMENT_ROW_BYTES", 1)
    assert A.agreement_rows(d, c.seq_len) == 1
    assert agreement(target, d, sampler(c), 2) == whole and max(whole) > 0.05


def test_dflash_tv_weight_mixes_in_the_distance_between_distributions(target):
    c = cfg("dflash")
    d = init_student(c, target, STREAM)
    ids = sampler(c).batch_at(0)
    with torch.no_grad():
        ce = float(batch_loss(target, d, ids, c).loss)
        l1 = float(batch_loss(target, d, ids, cfg("dflash", tv_weight=1.0)).loss)
        mix = float(batch_loss(target, d, ids, cfg("dflash", tv_weight=0.9)).loss)
    assert 0 < l1 <= 2 and mix == pytest.approx(0.1 * ce + 0.9 * l1, rel=1e-5)
    rep = distill(target, cfg("dflash", tv_weight=0.9), sampler(c), None)
    with torch.no_grad():
        after = float(batch_loss(target, rep.drafter, ids, cfg("dflash", tv_weight=1.0)).loss)
    assert after < 0.9 * l1, (l1, after)  # L1 starts near its maximum, 2, where its gradient is small
    refused = [(dict(family="eagle3", tv_weight=0.5), "tv_weight"), (dict(family="dflash", tv_weight=1.5), "tv_weight"),
               (dict(family="mtp", gamma=2.0), "gamma")]
    for kw, field in refused:
        with pytest.raises(ConfigError, match=field):
            cfg(**kw)


def test_lr_and_optimizer_default_per_family():
    for family, expected in [("eagle3", (2e-3, "muon")), ("eagle", (1e-3, "adamw")), ("mtp", (1e-3, "adamw")),
                             ("dflash", (1e-3, "adamw")), ("lm", (1e-3, "adamw"))]:
        c = DistillConfig(family=family, steps=1)
        assert (c.lr, c.optimizer) == expected, family
        assert (c.to_dict()["lr"], c.to_dict()["optimizer"]) == expected  # provenance records the value used
        assert DistillConfig.from_dict(c.to_dict()) == c
    explicit = DistillConfig(family="eagle3", steps=1, lr=1e-3, optimizer="adamw")
    assert (explicit.lr, explicit.optimizer) == (1e-3, "adamw")


@pytest.mark.parametrize("family", ["eagle3", "dflash"])
def test_muon_trains_the_block_matrices(family, target):
    from specpress.optim import MuonWithAdamW, build_optimizer

    c = cfg(family, optimizer="muon")
    student = init_student(c, target, STREAM)
    opt = build_optimizer(student.named_parameters(), "muon", 1e-3, 0.0, (0.9, 0.95))
    assert isinstance(opt, MuonWithAdamW)
    on_muon = {id(p) for g in opt.parts[0].param_groups for p in g["params"]}
    names = {n for n, p in student.named_parameters() if id(p) in on_muon}
    block = "midlayer." if family == "eagle3" else "layers."
    assert names and all(n.startswith(block) and n.endswith("proj.weight") for n in names)
    assert not any(n.startswith("fc.") for n in names)  # projections outside the block stay on AdamW
    ids = sampler(c).batch_at(0)
    with torch.no_grad():
        before = float(batch_loss(target, student, ids, c).loss)
    rep = distill(target, c, sampler(c), None)
    with torch.no_grad():
        after = float(batch_loss(target, rep.drafter, ids, c).loss)
    assert after < 0.75 * before, (before, after)
    with pytest.raises(ConfigError, match="optimizer"):
        cfg(family, optimizer="sgd")


@pytest.mark.parametrize("family", ["eagle", "eagle3", "mtp"])
def test_unrolled_training_forward_equals_chained_inference(family, target):
    """Step i at index j of the batched training-time test = prefill pairs 0..j, then i single-token
    chain steps through a real KVCache (what the runtime does)."""
    d = make(family, target)
    x = torch.randint(1, V, (1, 14), generator=torch.Generator().manual_seed(3))
    out = target(x, taps=d.taps)
    feats = d.fuse_taps(out.taps) if family == "eagle3" else out.hidden
    k, n = 3, 14 - 3 - 1
    with torch.no_grad():
        outs = unroll(d, feats[:, :n], x, k, n)
        for j in (0, 4, n - 1):
            cache = d.new_cache(32)
            logits, g = d(feats[:, :j + 1], x[:, 1:j + 2], cache=cache)
            assert (logits[:, -1] - outs[0][0][:, j]).abs().max() < 1e-5
            g = g[:, -1:]
            for i in range(1, k):
                kw = {"step": i} if family == "mtp" else {}
                logits, g = d(g, x[:, j + 1 + i:j + 2 + i], cache=cache, positions=torch.tensor([j + i]), **kw)
                assert (logits[:, 0] - outs[i][0][:, j]).abs().max() < 1e-5, (j, i)


def test_dflash_batched_blocks_equal_one_block_at_a_time(target):
    d = make("dflash", target)
    x = torch.randint(1, V, (2, 16), generator=torch.Generator().manual_seed(4))
    fused = d.fuse_taps(target(x, taps=d.taps).taps)
    anchors = torch.tensor([[1, 5, 12], [3, 7, 9]])
    blocks, pos, mask = block_inputs(d, x, anchors, 4)
    with torch.no_grad():
        got = d(fused, blocks, positions=pos, mask=mask).view(2, 3, 4, V)
        for b in range(2):
            for n, a in enumerate(anchors[b].tolist()):
                ref = d(fused[b:b + 1, :a], d.make_block(x[b:b + 1, a], 4))  # context strictly before the anchor
                assert (got[b, n] - ref[0]).abs().max() < 1e-5


def test_dflash_loss_equals_a_block_by_block_reference(target):
    """The batched loss, hits and alignment (block position k >= 1 drafts x_{a+k} against softmax(z_{a+k-1}),
    the Markov head sees x_{a+k-1}, weight e^{-(k-1)/gamma}) against one anchor at a time through the
    inference forward."""
    import dataclasses
    import torch.nn.functional as F

    from drafters_common import CONFIGS, randomize
    from specpress.compress.losses import dflash_anchors
    from specpress.compress.training import step_generator
    from specpress.models.drafter import build_drafter

    d = randomize(build_drafter(dataclasses.replace(CONFIGS["dflash"], markov_rank=4)), 1).attach_target(target)
    c = cfg("dflash", anchors=3, gamma=1.5)
    ids = sampler(c).batch_at(2)
    with torch.no_grad():
        out = batch_loss(target, d, ids, c, step=7)
        t = target(ids, taps=d.taps)
        fused = d.fuse_taps(t.taps)
        anchors = dflash_anchors(c.batch, c.seq_len, 4, 3, step_generator(c.seed, 7))
        w = torch.exp(-torch.arange(3.0) / 1.5)
        total, hits = 0.0, torch.zeros(3)
        for b in range(c.batch):
            for a in anchors[b].tolist():
                q = d(fused[b:b + 1, :a], d.make_block(ids[b:b + 1, a], 4))[0, 1:]  # [3, V]
                q = d.with_markov(q, ids[b, a:a + 3])
                z = t.logits[b, a:a + 3].float()
                total += float(((-(F.softmax(z, -1) * F.log_softmax(q.float(), -1)).sum(-1)) * w).sum() / w.sum())
                hits += (q.argmax(-1) == z.argmax(-1)).float()
    n = c.batch * 3
    assert float(out.loss) == pytest.approx(total / n, rel=1e-4)
    assert out.hits.tolist() == hits.tolist() and out.counts.tolist() == [float(n)] * 3


def test_mask_gamma_and_vocab_helpers():
    m = unrolled_mask(3, 2, [0, 0, 0])
    assert m.shape == (3, 9) and m[:, :3].equal(torch.ones(3, 3).tril().bool()) and m[:, 6:].equal(torch.eye(3).bool())
    assert unrolled_mask(2, 1, [0, 1])[:, :2].sum() == 0  # another module's slots are never visible
    assert [dflash_gamma(b) for b in (16, 10, 8)] == [7.0, 5.0, 4.0] and 5.0 < dflash_gamma(12) < 7.0
    ids = draft_vocab_by_frequency(np.array([5, 5, 5, 2, 2, 9]), 12, 2)
    assert ids.tolist() == [2, 5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top1_is_argmax_including_ties(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (64, 3, 300), generator=g).to(dtype)  # few distinct values: most rows tie
    assert top1(x).equal(x.argmax(-1))
    assert (x == x.max(-1, keepdim=True).values).sum(-1).gt(1).all()  # every row has a tie to break


# ------------------------------------------------------------------------------------ runs


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_deterministic_and_resume_equals_uninterrupted(target, tmp_path, optimizer):
    c = cfg("eagle3", steps=10, checkpoint_minutes=0, optimizer=optimizer)
    full = distill(target, c, sampler(c), tmp_path / "a")
    again = distill(target, c, sampler(c), None)
    assert same(weights(full.drafter), weights(again.drafter))

    def stop_at_5(step, loss, acc):
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill(target, c, sampler(c), tmp_path / "b", on_step=stop_at_5)
    assert (tmp_path / "b.partial" / "state.pt").is_file() and not (tmp_path / "b").exists()
    other = cfg("eagle3", steps=10, lr=1e-2, optimizer=optimizer)
    with pytest.raises(CheckpointError, match=r"config\.lr.*0\.003.*0\.01"):
        distill(target, other, sampler(other), tmp_path / "b", resume=True)
    rep = distill(target, c, sampler(c), tmp_path / "b", resume=True)
    assert rep.resumed_from == 5 and rep.steps == 10
    assert same(weights(full.drafter), weights(rep.drafter))
    assert not (tmp_path / "b.partial").exists()
    loaded = load_drafter(tmp_path / "b", target)
    assert same(weights(loaded), weights(full.drafter))
    step = loaded.provenance[-1]
    assert step["step"] == "distill" and step["steps"] == 10 and step["config"]["family"] == "eagle3"
    assert len(step["agreement"]) == 3 and step["data"]["tokens"] == len(STREAM)
    with pytest.raises(RequestError, match="already exists"):
        distill(target, c, sampler(c), tmp_path / "b")


def test_teacher_cache_is_bit_identical(target, tmp_path):
    c = cfg("dflash", steps=4, bf16=True)
    plain = distill(target, c, sampler(c), None)
    first = distill(target, c, sampler(c), None, cache_dir=tmp_path / "cache")
    second = distill(target, c, sampler(c), None, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").rglob("step-*.npy"))) == 4
    ref = weights(plain.drafter)
    assert same(ref, weights(first.drafter)) and same(ref, weights(second.drafter))
    fp32 = cfg("dflash", steps=4, bf16=False)  # bf16 signals are not fp32 signals: a separate cache entry
    third = distill(target, fp32, sampler(fp32), None, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").rglob("step-*.npy"))) == 8
    assert same(weights(distill(target, fp32, sampler(fp32), None).drafter), weights(third.drafter))
    assert not same(ref, weights(third.drafter))


def test_compiled_teacher_gives_the_eager_signals(target, tmp_path):
    from specpress.compress.teacher import Teacher, needed_taps

    taps = needed_taps(make("dflash", target))
    ids = sampler(cfg("dflash")).batch_at(0)
    eager = Teacher(target, taps).signals(0, ids)
    compiled = Teacher(target, taps, compile=True).signals(0, ids)  # fp32 here: the same values up to fusion
    for a, b in [(eager.logits, compiled.logits), (eager.hidden, compiled.hidden)] + \
            [(eager.taps[t], compiled.taps[t]) for t in taps]:
        assert a.shape == b.shape and (a - b).abs().max() < 1e-4
    c = cfg("dflash", steps=3, compile=True)
    distill(target, c, sampler(c), tmp_path / "d")
    assert load_drafter(tmp_path / "d", target).provenance[-1]["config"]["compile"] is True
    with pytest.raises(ConfigError, match="compile"):
        cfg("dflash", compile="yes")


def test_from_a_larger_drafter_shrinks_it(target):
    big = distill(target, cfg("eagle3", steps=5, draft_vocab=40), sampler(cfg("eagle3")), None).drafter
    c = cfg("eagle3", steps=5, ffn=16, heads=2, kv_heads=1, draft_vocab=20)
    small = distill(target, c, sampler(c), None, teacher_drafter=big).drafter
    assert small.config.intermediate_size == 16 and small.config.num_attention_heads == 2
    assert bool(big.t2d[small.to_target_ids(torch.arange(20))].all())  # student vocab within the teacher's
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in big.parameters())
    assert len(agreement(target, small, sampler(c), 1)) == 3


def test_minutes_budget_sizes_the_schedule(target):
    c = cfg("mtp", steps=None, minutes=0.02)
    rep = distill(target, c, sampler(c), None)
    assert rep.planned_steps >= 2 and 1 <= rep.steps <= rep.planned_steps


def test_time_schedule_warms_up_then_decays_to_the_floor():
    from specpress.compress.training import lr_at_progress

    c = cfg("mtp", steps=None, minutes=1.0)
    lrs = [lr_at_progress(p / 100, c) for p in range(101)]
    peak = lrs.index(max(lrs))
    assert max(lrs) == pytest.approx(c.lr) and peak / 100 == pytest.approx(c.warmup_ratio)
    assert all(a <= b for a, b in zip(lrs[:peak], lrs[1:peak + 1]))  # warmup rises
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1:]))  # cosine falls
    assert lrs[-1] == pytest.approx(c.lr * c.min_lr_ratio) and lr_at_progress(1.5, c) == lrs[-1]


def test_minutes_alone_runs_to_the_end_of_the_budget(target, monkeypatch):
    import specpress.compress.distill as distill_mod

    progress = []
    real = distill_mod.lr_at_progress

    def spy(p, config):
        progress.append(p)
        return real(p, config)

    monkeypatch.setattr(distill_mod, "lr_at_progress", spy)
    c = cfg("mtp", steps=None, minutes=0.02)
    rep = distill(target, c, sampler(c), None)
    assert rep.stopped_by == "minutes" and rep.planned_steps == rep.steps == len(progress)
    # the warm-up passes (and a compile) are charged to the budget: the first step is already into it
    assert progress == sorted(progress) and 0.0 < progress[0] < progress[-1] < 1.0


# ------------------------------------------------------------------------------------ CLI


def _target_dir(tmp_path):
    return save_with_tokenizer(random_eos_target(), tmp_path)


def test_cli_end_to_end_and_bad_input(tmp_path):
    from click.testing import CliRunner

    from specpress.cli import cli

    tdir, data = _target_dir(tmp_path)
    out = tmp_path / "drafter"
    args = ["distill", "--target", str(tdir), "--family", "eagle3", "--data", str(data), "--out", str(out),
            "--steps", "3", "--batch", "2", "--seq-len", "16", "--draft-vocab", "40"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "written to" in res.output and "acc@k" in res.output
    from specpress.models.target import load_target

    d = load_drafter(out, load_target(tdir))
    assert d.family == "eagle3" and d.provenance[-1]["steps"] == 3
    assert d.provenance[-1]["data"]["source"] == str(data)
    tokens = d.provenance[-1]["data"]["tokens"]  # the training part of the data (held-out windows excluded)
    assert f"{3 * 2 * 16 / tokens:.1f} passes over {tokens:,} training tokens" in res.output
    res = CliRunner().invoke(cli, args)
    assert isinstance(res.exception, RequestError) and "--force" in str(res.exception)
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    res = CliRunner().invoke(cli, [*args[:5], "--data", str(empty), "--out", str(tmp_path / "x"), "--steps", "1"])
    assert isinstance(res.exception, DataError)
    res = CliRunner().invoke(cli, [*args[:3], "--family", "medusa", "--data", str(data), "--out", str(tmp_path / "y"),
                                   "--steps", "1"])
    assert isinstance(res.exception, ConfigError) and "eagle3" in str(res.exception)


def test_cli_dflash_loss_options_reach_the_run(tmp_path):
    from click.testing import CliRunner

    from specpress.cli import cli
    from specpress.models.target import load_target

    tdir, data = _target_dir(tmp_path)
    base = ["distill", "--target", str(tdir), "--data", str(data), "--steps", "2", "--batch", "2", "--seq-len", "16",
            "--block-size", "4"]
    res = CliRunner().invoke(cli, [*base, "--family", "dflash", "--out", str(tmp_path / "d"), "--gamma", "2",
                                   "--tv-weight", "0.5"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    cfg_used = load_drafter(tmp_path / "d", load_target(tdir)).provenance[-1]["config"]
    assert cfg_used["gamma"] == 2.0 and cfg_used["tv_weight"] == 0.5
    res = CliRunner().invoke(cli, [*base, "--family", "mtp", "--out", str(tmp_path / "m"), "--gamma", "2"])
    assert isinstance(res.exception, ConfigError) and "gamma" in str(res.exception)
    assert not (tmp_path / "m").exists()


def test_cli_init_fine_tunes_an_existing_drafter(tmp_path):
    from click.testing import CliRunner

    from specpress.cli import cli
    from specpress.models.target import load_target

    tdir, data = _target_dir(tmp_path)
    base = ["distill", "--target", str(tdir), "--family", "dflash", "--data", str(data), "--steps", "2", "--batch", "2",
            "--seq-len", "16", "--block-size", "4", "--anchors", "2"]
    res = CliRunner().invoke(cli, [*base, "--out", str(tmp_path / "a"), "--markov-rank", "4"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    res = CliRunner().invoke(cli, [*base, "--out", str(tmp_path / "b"), "--init", str(tmp_path / "a"), "--seed", "1"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    target = load_target(tdir)
    a, b = load_drafter(tmp_path / "a", target), load_drafter(tmp_path / "b", target)
    assert b.config == a.config and b.config.markov_rank == 4
    assert [p["step"] for p in b.provenance] == ["distill", "distill"]
    assert b.provenance[-1]["data"]["init"] == str(tmp_path / "a")
    assert not torch.equal(a.markov_head.markov_w1.weight, b.markov_head.markov_w1.weight)  # trained further
    res = CliRunner().invoke(cli, [*base, "--out", str(tmp_path / "c"), "--init", str(tmp_path / "a"), "--layers", "3"])
    assert isinstance(res.exception, RequestError) and "layers" in str(res.exception)
    assert not (tmp_path / "c").exists()


def test_bad_inputs_are_clear(target):
    with pytest.raises(ConfigError, match="budget"):
        DistillConfig(family="eagle")
    with pytest.raises(ConfigError, match="unknown key.*'stepz'"):
        DistillConfig.from_dict({"family": "eagle", "stepz": 3})
    with pytest.raises(RequestError, match="hidden size must be the target's"):
        distill(target, cfg("eagle", hidden=16), sampler(cfg("eagle")), None)
    with pytest.raises(RequestError, match="sampler"):
        distill(target, cfg("eagle"), WindowSampler(STREAM, 12, 4, 0), None)
    with pytest.raises(DataError, match="fewer than one window"):
        WindowSampler(STREAM[:10], 24, 4, 0)
    other = TargetModel(TargetConfig(**{**SHAPE, "vocab_size": 50}, num_hidden_layers=L))
    from specpress.models.drafter import build_drafter
    from specpress.models.eagle3 import Eagle3Config

    wrong = build_drafter(Eagle3Config(**{**SHAPE, "vocab_size": 50}, draft_vocab_size=24), other)
    with pytest.raises(CheckpointError, match="vocab_size"):
        distill(target, cfg("eagle3"), sampler(cfg("eagle3")), None, teacher_drafter=wrong)
    with pytest.raises(RequestError, match="between families"):
        distill(target, cfg("eagle"), sampler(cfg("eagle")), None, init=make("mtp", target))


DDP_WORKER = """
import sys, numpy as np, torch, torch.distributed as dist
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from test_distill import cfg, sampler, target as _t
from drafters_common import tiny_target
from specpress.compress.distill import distill
t = tiny_target()
with torch.no_grad():
    t.lm_head.weight.mul_(4)
c = cfg("dflash", steps=4, bf16=False)
rep = distill(t, c, sampler(c), None)
if dist.get_rank() == 0:
    torch.save(rep.drafter.state_dict(), {out!r})
dist.destroy_process_group()
"""


def test_torchrun_data_parallel_matches_one_process(target, tmp_path):
    """Two gloo ranks, each on half of every batch, end where one process on whole batches ends (fp32:
    bf16 matmuls round differently for half-size batches, which would hide the all-reduce arithmetic)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "worker.py"
    script.write_text(DDP_WORKER.format(tests=str(Path(__file__).parent), out=str(tmp_path / "w.pt")))
    here = Path(__file__).resolve()  # the ranks import this checkout's specpress (root first), not an installed one
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(here.parents[2]), str(here.parents[1])])}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(port), str(script)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "w.pt", weights_only=True)
    c = cfg("dflash", steps=4, bf16=False)
    ref = distill(target, c, sampler(c), None).drafter.state_dict()
    assert got.keys() == ref.keys()
    assert max(float((got[k] - ref[k]).abs().max()) for k in ref) < 1e-5


def test_init_drafter_keeps_its_shape_and_trains_every_mtp_module(target):
    from specpress.models.drafter import build_drafter
    from specpress.models.mtp import MTPConfig

    init = build_drafter(MTPConfig(**SHAPE, num_target_layers=L, num_nextn_predict_layers=2), target)
    before = weights(init)
    rep = distill(target, cfg("mtp", steps=3), sampler(cfg("mtp")), None, init=init)
    assert len(rep.agreement) == 2 and same(weights(init), before)  # the init drafter itself is untouched
    after = weights(rep.drafter)
    for k in (L, L + 1):  # both modules moved: the chain ran step 0 on module 0 and step 1 on module 1
        key = f"model.layers.{k}.eh_proj.weight"
        assert not torch.equal(after[key], before[key]), key
    with pytest.raises(RequestError, match="drop ffn"):
        distill(target, cfg("mtp", ffn=8), sampler(cfg("mtp")), None, init=init)


def test_eagle3_taps_choose_the_fused_target_layers(target):
    """--taps sets the student's target_layer_ids (L = the final normed hidden); the run trains on them, the
    saved config keeps them, a JSON list resumes as the same config; wrong uses are clear errors."""
    c = cfg("eagle3", steps=3, taps=[1, L])  # a JSON list, as from a provenance record
    assert c.taps == (1, L) and DistillConfig.from_dict(c.to_dict()) == c
    rep = distill(target, c, sampler(c), None)
    assert rep.drafter.taps == (1, L) and rep.drafter.fc.in_features == 2 * SHAPE["hidden_size"]
    assert rep.drafter.config.target_layer_ids == (1, L)
    with pytest.raises(ConfigError, match="applies to eagle3 and dflash"):
        cfg("mtp", taps=(1, 2))
    # dflash reads the output of layer i-1 for tap i (its target_layer_ids), the final normed hidden included
    c = cfg("dflash", steps=2, taps=[2, L])
    rep = distill(target, c, sampler(c), None)
    assert rep.drafter.config.target_layer_ids == (1, L - 1) and rep.drafter.taps == (2, L)
    with pytest.raises(RequestError, match=r"--taps \[0\] out of range for dflash"):
        distill(target, cfg("dflash", steps=1, taps=[0, 2]), sampler(c), None)
    with pytest.raises(ConfigError, match="non-empty list of layer indices"):
        cfg("eagle3", taps=())
    from click.testing import CliRunner

    from specpress.cli import cli

    res = CliRunner().invoke(cli, ["distill", "--target", "x", "--family", "eagle3", "--data", "y", "--out", "z",
                                   "--steps", "1", "--taps", "2,a"])
    assert res.exit_code == 2 and "comma-separated list of integers" in res.output


# ------------------------------------------------------------------------------------ teacher signals at scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draft_vocab_teacher_signals_give_the_full_logits_loss(target, dtype, monkeypatch):
    """An EAGLE-3 student's teacher keeps only its draft vocabulary's logits and the full-vocabulary argmax,
    a block of positions at a time: the loss and the agreement counts are those of the full logits."""
    from specpress.compress import teacher as T
    from specpress.compress.losses import LossContext, chain_loss
    from specpress.compress.training import step_generator

    t = copy.deepcopy(target).to(dtype)
    c = cfg("eagle3", ttt_steps=3)
    student = init_student(c, t, STREAM)
    ids = sampler(c).batch_at(0)
    vocab = T.draft_vocab(student)
    monkeypatch.setattr(T, "HEAD_BLOCK_BYTES", 7 * V * 2)  # several blocks of 7 positions
    full = T.target_signals(t, ids, student.taps)
    part = T.target_signals(t, ids, student.taps, vocab)
    assert full.logits.dtype == dtype and part.logits.shape[-1] == vocab.numel() < V
    assert torch.equal(part.ref_ids(), full.ref_ids())
    assert torch.equal(part.columns(vocab), full.columns(vocab))
    a, b = (chain_loss(LossContext(student, s, c, step_generator(0, 0), None, False)) for s in (full, part))
    assert torch.equal(a.hits, b.hits) and torch.equal(a.counts, b.counts)
    torch.testing.assert_close(a.loss, b.loss)
    with pytest.raises(RequestError, match="another draft vocabulary"):
        part.columns(torch.tensor([int(i) for i in range(V) if i not in set(vocab.tolist())][:3]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_soft_cross_entropy_matches_autograd(dtype):
    """soft_ce_logits keeps only its inputs for backward; its loss and gradient are those of autograd
    through soft_ce(logits, softmax(target))."""
    from specpress.compress.losses import soft_ce, soft_ce_logits

    g = torch.Generator().manual_seed(0)
    z = (torch.randn(3, 5, 40, generator=g) * 3).to(dtype)
    t = (torch.randn(3, 5, 40, generator=g) * 3).to(dtype)
    w = torch.rand(3, 5, generator=g)
    a, b = z.clone().requires_grad_(), z.clone().requires_grad_()
    la = (soft_ce(a, torch.softmax(t.float(), -1)) * w).sum()
    lb = (soft_ce_logits(b, t) * w).sum()
    la.backward()
    lb.backward()
    torch.testing.assert_close(lb, la)
    torch.testing.assert_close(b.grad.float(), a.grad.float(), atol=1e-6 if dtype == torch.float32 else 1e-2,
                               rtol=1e-5 if dtype == torch.float32 else 1e-2)
