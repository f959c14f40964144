"""The onnxruntime runner, called through its runner protocol, against the torch drafter's forward
on the same inputs: prefill, a tree level with its mask and positions, crop / compact, for every family
and both attention forms."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")
import torch

from specpress.runtime.backends.onnxruntime.runner import load_runner

FORMS = ["standard", "plugin"]
ATOL = 2e-5


def close(a, b):
    torch.testing.assert_close(a.float(), b.float(), atol=ATOL, rtol=1e-4)


def tree_mask(past: int, k: int) -> torch.Tensor:
    m = torch.zeros(k, past + k, dtype=torch.bool)
    m[:, :past] = True
    m[torch.arange(k), past + torch.arange(k)] = True
    m[2:, past] = True  # a few nodes see the first new slot (their parent), like a tree level
    return m


@torch.no_grad()
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("family", ["eagle", "eagle3", "mtp"])
def test_feature_step_matches_torch(exported, target, family, form):
    d, path, report = exported(family, form)
    runner = load_runner(path, target, "cpu")
    assert runner.family == family and runner.taps == tuple(d.taps) and runner.provider == "CPUExecutionProvider"
    ids = torch.randint(0, d.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    out = target(ids, taps=d.taps)
    feats_t = d.fuse_taps(out.taps) if family == "eagle3" else out.hidden
    feats_o = runner.fuse_taps(out.taps) if family == "eagle3" else out.hidden
    tc, oc = d.new_cache(32), runner.new_cache(32)
    # prefill (default positions, causal)
    lt, gt = d(feats_t[:, :-1], ids[:, 1:], cache=tc)
    lo, go = runner.feature_step(feats_o[:, :-1], ids[:, 1:], oc, None, None)
    close(lo, lt), close(go, gt)
    assert oc.length == tc.length == 8
    close(oc.k[:, :, :, :8], tc.k[:, :, :, :8])
    # one tree level: 4 nodes fed back with the drafter's own hidden, explicit positions and mask
    k = 4
    mask, pos = tree_mask(8, k), torch.full((k,), 9)
    nodes = torch.randint(0, d.config.vocab_size, (1, k), generator=torch.Generator().manual_seed(4))
    kw = {"step": 1} if family == "mtp" else {}
    lt, gt = d(gt[:, -1:].expand(1, k, -1), nodes, cache=tc, positions=pos, mask=mask, **kw)
    lo, go = runner.feature_step(go[:, -1:].expand(1, k, -1), nodes, oc, pos, mask, module=1)
    close(lo, lt), close(go, gt)
    # keep nodes 1 and 3 after slot 8, as a session does after verification; then step again
    tc.compact(8, [1, 3]), oc.compact(8, [1, 3])
    close(oc.k[:, :, :, :10], tc.k[:, :, :, :10])
    tc.crop(9), oc.crop(9)
    lt, _ = d(gt[:, :1], nodes[:, :1], cache=tc)
    lo, _ = runner.feature_step(go[:, :1], nodes[:, :1], oc, None, None)
    close(lo, lt)


@torch.no_grad()
@pytest.mark.parametrize("form", FORMS)
def test_lm_step_matches_torch(exported, target, form):
    d, path, _ = exported("lm", form)
    runner = load_runner(path, target, "cpu")
    ids = torch.randint(0, d.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(5))
    tc, oc = d.new_cache(32), runner.new_cache(32)
    close(runner.lm_step(ids, oc, None, None, last_only=True), d(ids, cache=tc, logits="last").logits)
    mask, pos = tree_mask(7, 3), torch.full((3,), 7)
    close(runner.lm_step(ids[:, :3], oc, pos, mask), d(ids[:, :3], cache=tc, positions=pos, mask=mask).logits)
    tc.compact(7, [2]), oc.compact(7, [2])
    close(oc.v[:, :, :, :8], tc.v[:, :, :, :8])


@torch.no_grad()
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", ["dflash", "dflash_markov"])
def test_block_drafts_match_torch(exported, target, name, form):
    d, path, _ = exported(name, form)
    runner = load_runner(path, target, "cpu")
    assert runner.manifest.drafter.markov == (name == "dflash_markov")
    ids = torch.randint(0, d.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(6))
    out = target(ids, taps=d.taps)
    tc, oc = d.new_cache(64), runner.new_cache(64)
    bs = d.config.block_size
    for lo_, hi in ((0, 7), (7, 10)):  # two rounds: the context grows by what was accepted
        root = int(ids[0, hi - 1])
        logits = d(d.fuse_taps({i: t[:, lo_:hi] for i, t in out.taps.items()}),
                   d.make_block(torch.tensor([root]), bs), cache=tc)[0]
        want = d.greedy_drafts(logits, root)
        got = runner.block_drafts(runner.fuse_taps({i: t[:, lo_:hi] for i, t in out.taps.items()}), root, bs, oc)
        assert got == want and oc.length == tc.length == hi
        close(oc.k[:, :, :, :hi], tc.k[:, :, :, :hi])
    assert runner.block_drafts(None, 3, bs, oc) == d.greedy_drafts(d(None, d.make_block(torch.tensor([3]), bs),
                                                                     cache=tc)[0], 3)


def _fp16_case(exported, target, family):
    from specpress.export.validate import reference_copy

    d, path, report = exported(family, "standard", dtype="fp16")
    assert report.tolerance == 2e-2 and report.graphs
    runner = load_runner(path, target, "cpu")
    assert runner.new_cache(4).k.dtype == torch.float16
    ref = reference_copy(d, "fp16")
    ids = torch.randint(0, d.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(8))
    out = target(ids, taps=d.taps)
    if family == "lm":
        want = ref(ids, cache=ref.new_cache(8)).logits
        got = runner.lm_step(ids, runner.new_cache(8), None, None)
    else:
        feats = (d.fuse_taps(out.taps) if family == "eagle3" else out.hidden).half()
        want, _ = ref(feats, ids, cache=ref.new_cache(8))
        got, _ = runner.feature_step(feats, ids, runner.new_cache(8), None, None)
    assert got.dtype == torch.float16
    assert float((got.float() - want.float()).abs().max()) <= 2e-2 * float(want.float().abs().max())


@torch.no_grad()
def test_fp16_export_runs_in_fp16(exported, target):
    _fp16_case(exported, target, "eagle3")


@pytest.mark.slow
@torch.no_grad()
@pytest.mark.parametrize("family", ["eagle", "mtp", "lm"])
def test_fp16_export_every_family(exported, target, family):
    _fp16_case(exported, target, family)


def test_another_target_warns_or_fails_strict(exported, target):
    from drafters_common import randomize

    from specpress.errors import CheckpointError

    _, path, _ = exported("eagle")
    other = randomize(__import__("copy").deepcopy(target), 9)
    said: list[str] = []
    load_runner(path, other, "cpu", warn=said.append)
    assert said and "another target" in said[0]
    with pytest.raises(CheckpointError, match="another target"):
        load_runner(path, other, "cpu", strict=True)
    said.clear()
    load_runner(path, target, "cpu", strict=True, warn=said.append)
    assert not said


@torch.no_grad()
def test_build_runner_drives_any_session_with_run(exported, target):
    """The tensorrt backend's path: build_runner over sessions that take and give torch tensors."""
    import json

    import onnxruntime as ort

    from specpress.runtime.backends.onnxruntime.runner import build_runner

    class TorchIO:  # an onnxruntime session behind EngineSession's calling convention (torch in, torch out)
        def __init__(self, path):
            self.s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

        def run(self, names, feeds):
            return [torch.from_numpy(a) for a in self.s.run(names, {n: t.numpy() for n, t in feeds.items()})]

    d, path, _ = exported("mtp", "plugin")
    raw = json.loads((path / "manifest.json").read_text())
    runner = build_runner(raw, {g["name"]: TorchIO(path / g["file"]) for g in raw["graphs"]}, target, "cpu",
                          backend="tensorrt", provider="test")
    assert runner.backend == "tensorrt" and runner.provider == "test"
    ids = torch.randint(0, d.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(9))
    hidden = target(ids).hidden
    lt, _ = d(hidden, ids, cache=d.new_cache(8))
    lo, _ = runner.feature_step(hidden, ids, runner.new_cache(8), None, None)
    close(lo, lt)


def test_runner_sessions_do_not_spin_between_runs():
    """torch runs between two session runs on the same cores (the target, tree building): idle onnxruntime
    workers must block, not spin (spinning made the medium target's loop 2.3x slower per round)."""
    ort = pytest.importorskip("onnxruntime")
    from specpress.runtime.backends.onnxruntime.runner import session_options

    opts = session_options(ort, 2)
    assert opts.intra_op_num_threads == 2
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
