"""The backend seam: the registry, and the torch runner computing exactly what its drafter module does."""

from __future__ import annotations

import pytest
import torch
from drafters_common import FAMILIES, IDS, make, tiny_target

from specpress.errors import UsageError
from specpress.runtime import backends
from specpress.runtime.backends import Backend, get_backend, load_runner
from specpress.runtime.backends.base import DrafterRunner
from specpress.runtime.backends.torch import TorchDrafterRunner, TorchTarget
from specpress.runtime.loop import speculative_generate
from specpress.runtime.policy import parse_policy


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(UsageError, match="unknown backend 'nope'; known backends: torch"):
        get_backend("nope")
    assert get_backend("torch").reads == "drafter"


def test_backend_that_cannot_import_gives_its_install_hint(monkeypatch, tmp_path):
    hint = "install it with `pip install specpress[missing]`"
    monkeypatch.setitem(backends.BACKENDS, "missing",
                        Backend("missing", "specpress_no_such_module_for_tests", "drafter", hint))
    with pytest.raises(UsageError) as info:
        load_runner("missing", tmp_path, tiny_target(), torch.device("cpu"))
    msg = str(info.value)
    assert hint in msg and "specpress_no_such_module_for_tests" in msg and "missing backend" in msg


def test_exported_backend_refuses_a_drafter_artifact(monkeypatch, tmp_path):
    from specpress.models.drafter_io import save_drafter

    target = tiny_target()
    art = save_drafter(make("eagle3", target), tmp_path / "eagle3")
    monkeypatch.setitem(backends.BACKENDS, "graph", Backend("graph", "specpress_never_imported", "onnx", "n/a"))
    with pytest.raises(UsageError, match="export it first with `specpress export onnx"):
        load_runner("graph", art, target, torch.device("cpu"))


def test_torch_backend_loads_a_runner(tmp_path):
    from specpress.models.drafter_io import save_drafter

    target = tiny_target()
    module = make("eagle3", target)
    art = save_drafter(module, tmp_path / "eagle3")
    runner = load_runner("torch", art, target, TorchTarget(target).device)
    assert isinstance(runner, DrafterRunner) and runner.backend == "torch" and runner.family == "eagle3"
    assert runner.taps == module.taps and runner.vocab_size == module.config.vocab_size


def same_cache(a, b) -> bool:
    n = a.length
    return n == b.length and torch.equal(a.k[..., :n, :], b.k[..., :n, :]) and torch.equal(a.v[..., :n, :],
                                                                                       b.v[..., :n, :])


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_torch_runner_computes_exactly_what_the_module_does(family):
    """Every runner method against the module called directly on a twin cache: bitwise equal outputs and
    caches (a prefill, then a masked tree step at explicit positions)."""
    target = tiny_target()
    d = make(family, target)
    runner = TorchDrafterRunner(d)
    ids = IDS[:, :8]
    out = target(ids, taps=d.taps)
    mine, ref = runner.new_cache(32), d.new_cache(32)
    if family == "lm":
        got = runner.lm_step(ids, mine, None, None, last_only=True)
        want = d(ids, cache=ref, logits="last").logits
        assert torch.equal(got, want) and got.shape == (1, 1, d.config.vocab_size)
        pos, mask = torch.tensor([8, 8, 9]), torch.tensor([[True] * 8 + [1, 0, 0], [True] * 8 + [0, 1, 0],
                                                           [True] * 8 + [1, 0, 1]], dtype=torch.bool)
        nxt = torch.tensor([[3, 4, 5]])
        assert torch.equal(runner.lm_step(nxt, mine, pos, mask), d(nxt, cache=ref, positions=pos, mask=mask).logits)
    elif family == "dflash":
        feats = runner.fuse_taps(out.taps)
        assert torch.equal(feats, d.fuse_taps(out.taps))
        got = runner.block_drafts(feats[:, :7], 9, 4, mine)
        logits = d(feats[:, :7], d.make_block(torch.tensor([9]), 4), cache=ref)[0]
        assert got == d.greedy_drafts(logits, 9) and len(got) == 3
    else:
        feats = runner.fuse_taps(out.taps) if d.taps else out.hidden
        if d.taps:
            assert torch.equal(feats, d.fuse_taps(out.taps))
        kw = {"step": 0} if family == "mtp" else {}
        got = runner.feature_step(feats[:, :-1], ids[:, 1:], mine, None, None, 0)
        want = d(feats[:, :-1], ids[:, 1:], cache=ref, **kw)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        g = got[1][:, -1:].expand(1, 2, -1)
        pos, mask = torch.tensor([7, 7]), torch.ones(2, 9, dtype=torch.bool)
        mask[0, 8] = False
        kw = {"step": 1} if family == "mtp" else {}
        got = runner.feature_step(g, torch.tensor([[3, 4]]), mine, pos, mask, 1)
        want = d(g, torch.tensor([[3, 4]]), cache=ref, positions=pos, mask=mask, **kw)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert same_cache(mine, ref) and mine.length > 0
    if family == "eagle3":
        assert torch.equal(runner.token_map, d.to_target_ids(torch.arange(d.config.draft_vocab_size)))
    else:
        assert runner.token_map is None


@pytest.mark.parametrize("family, policy", [("eagle3", "dynamic:depth=3,topk=3,budget=8"), ("mtp", "mtp:3"),
                                            ("dflash", "block:4"), ("lm", "tree:[[0],[1],[0,0]]")])
def test_loop_takes_a_runner_or_a_module_alike(family, policy):
    target = tiny_target()
    d = make(family, target)
    pol = parse_policy(policy)
    a = speculative_generate(target, d, [5, 9, 13, 2], 16, pol, eos_ids=())
    b = speculative_generate(TorchTarget(target), TorchDrafterRunner(d), [5, 9, 13, 2], 16, pol, eos_ids=())
    assert a.tokens == b.tokens and [r.accepted for r in a.rounds] == [r.accepted for r in b.rounds]
