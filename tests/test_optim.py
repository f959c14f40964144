"""GroupedMuon (batched Newton-Schulz) against torch.optim.Muon: same updates, same state."""

import copy

import pytest
import torch

from specpress.optim import GroupedMuon, MuonWithAdamW, build_optimizer, newton_schulz

SHAPES = [(48, 24), (48, 24), (24, 48), (32, 32), (48, 24), (16, 40)]  # repeats, tall, wide, square


def _pair(**kw):
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    return a, torch.optim.Muon(a, **kw), b, GroupedMuon(b, **kw)


def _steps(a, oa, b, ob, n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p, q in zip(a, b):
            g = torch.randn(p.shape, generator=gen)
            p.grad, q.grad = g.clone(), g.clone()
        oa.step()
        ob.step()


@pytest.mark.parametrize("kw", [dict(lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"),
                                dict(lr=2e-2, weight_decay=0.0, nesterov=False),
                                dict(lr=1e-2, momentum=0.9, adjust_lr_fn="original")])
def test_grouped_muon_matches_torch_muon(kw):
    a, oa, b, ob = _pair(**kw)
    start = [p.detach().clone() for p in a]
    _steps(a, oa, b, ob, 4)
    for p, q, p0 in zip(a, b, start):
        assert not torch.equal(p, p0)  # the parameters moved
        torch.testing.assert_close(q, p, rtol=0, atol=1e-5)
        torch.testing.assert_close(ob.state[q]["momentum_buffer"], oa.state[p]["momentum_buffer"], rtol=0, atol=1e-6)


def test_grouped_muon_takes_torch_muon_state():
    a, oa, b, ob = _pair(lr=1e-2, adjust_lr_fn="match_rms_adamw")
    _steps(a, oa, b, ob, 2)
    with torch.no_grad():
        for p, q in zip(a, b):
            q.copy_(p)
    # a checkpoint written by torch's Muon continues under the grouped one (a copy, as from disk: loading
    # a live state_dict would share its momentum tensors between the two optimizers)
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))
    _steps(a, oa, b, ob, 2, seed=2)
    for p, q in zip(a, b):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-5)


def test_newton_schulz_orthogonalises_each_matrix_alone():
    g = torch.randn(3, 24, 40)
    g[1] *= 1000  # a matrix's scale must not leak into its neighbours'
    out = newton_schulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7).float()
    for i in range(3):
        solo = newton_schulz(g[i:i + 1], (3.4445, -4.7750, 2.0315), 5, 1e-7).float()[0]
        torch.testing.assert_close(out[i], solo, rtol=0, atol=1e-2)
        sv = torch.linalg.svdvals(out[i])
        assert 0.5 < sv.min() and sv.max() < 1.5  # Muon's quintic leaves singular values near 1


def test_build_optimizer_uses_grouped_muon_only_when_fused():
    lin = torch.nn.ModuleDict({"layers": torch.nn.ModuleList([torch.nn.Linear(8, 8)]), "head": torch.nn.Linear(8, 4)})
    fused = build_optimizer(lin.named_parameters(), "muon", 1e-3, 0.0, (0.9, 0.95), fused=True)
    plain = build_optimizer(lin.named_parameters(), "muon", 1e-3, 0.0, (0.9, 0.95))
    assert isinstance(fused, MuonWithAdamW) and isinstance(fused.parts[0], GroupedMuon)
    assert isinstance(plain, MuonWithAdamW) and type(plain.parts[0]) is torch.optim.Muon
