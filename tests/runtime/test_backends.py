"""The backend seam: the registry (every backend module registered), and the torch runners computing exactly
what their drafter module does."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from drafters_common import FAMILIES, IDS, make, tiny_target

from specpress.errors import RequestError
from specpress.models.drafter import get_family
from specpress.runtime import backends
from specpress.runtime.backends import Backend, get_backend, load_runner
from specpress.runtime.backends import backends as registry
from specpress.runtime.backends.base import BlockDrafter, FeatureDrafter, TokenDrafter
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner

PACKAGE = Path(backends.__file__).parent


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(RequestError, match="unknown backend 'nope'; known backends: torch, onnxruntime, tensorrt"):
        get_backend("nope")
    assert get_backend("torch").reads == "drafter" and get_backend("tensorrt").reads == "engine"


def test_every_backend_module_is_registered():
    """Each subpackage of runtime/backends registers the backend of its name, whose runner module defines
    load_runner (and target_runner when it runs the target); and every module under runtime/backends that
    defines load_runner is a registered backend's runner module, so a backend cannot be written and left
    out of the registry (the tensorrt backend was, once)."""
    packages = sorted(m.name for m in pkgutil.iter_modules([str(PACKAGE)]) if m.ispkg)
    assert sorted(registry()) == packages == ["onnxruntime", "tensorrt", "torch"]
    runner_modules = {b.module for b in registry().values()}
    for b in registry().values():
        tree = ast.parse(Path(importlib.util.find_spec(b.module).origin).read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert "load_runner" in defined and ("target_runner" in defined) == b.runs_target, b
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix=f"{backends.__name__}."):
        origin = Path(importlib.util.find_spec(info.name).origin)
        tree = ast.parse(origin.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name == "load_runner" for n in tree.body):
            assert info.name in runner_modules, f"{origin} defines load_runner but no backend registers it"


def test_backend_choices_need_neither_torch_nor_a_backend_library():
    code = ("import sys\nfrom specpress.runtime.backends import names\nfrom specpress.commands import decode\n"
            "print(names())\nbad = [m for m in ('torch', 'onnxruntime', 'tensorrt', 'tensorrt_rtx')\n"
            "       if m in sys.modules]\nassert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "tensorrt" in proc.stdout


def test_backend_that_cannot_import_gives_its_install_hint(monkeypatch, tmp_path):
    hint = "install it with `pip install specpress[missing]`"
    monkeypatch.setitem(registry(), "missing",
                        Backend("missing", "specpress_no_such_module_for_tests", "drafter", hint))
    with pytest.raises(RequestError) as info:
        load_runner("missing", tmp_path, tiny_target(), torch.device("cpu"))
    msg = str(info.value)
    assert hint in msg and "specpress_no_such_module_for_tests" in msg and "missing backend" in msg


def test_exported_backend_refuses_a_drafter_artifact(monkeypatch, tmp_path):
    from specpress.models.drafter_io import save_drafter

    target = tiny_target()
    art = save_drafter(make("eagle3", target), tmp_path / "eagle3")
    monkeypatch.setitem(registry(), "graph", Backend("graph", "specpress_never_imported", "onnx", "n/a"))
    with pytest.raises(RequestError, match="export it first with `specpress export onnx"):
        load_runner("graph", art, target, torch.device("cpu"))


def test_torch_backend_loads_a_runner(tmp_path):
    from specpress.models.drafter_io import save_drafter

    target = tiny_target()
    module = make("eagle3", target)
    art = save_drafter(module, tmp_path / "eagle3")
    runner = load_runner("torch", art, target, TorchTarget(target).device)
    assert isinstance(runner, FeatureDrafter) and runner.backend == "torch" and runner.family == "eagle3"
    assert runner.taps == module.taps and runner.vocab_size == module.config.vocab_size


def same_cache(a, b) -> bool:
    n = a.length
    return n == b.length and torch.equal(a.k[..., :n, :], b.k[..., :n, :]) and torch.equal(a.v[..., :n, :],
                                                                                       b.v[..., :n, :])


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_torch_runner_computes_exactly_what_the_module_does(family):
    """Every runner method against the module called directly on a twin cache: bitwise equal outputs and
    caches (a prefill, then a masked tree step at explicit positions). Each family's runner is of its session
    kind's protocol and offers no other kind's call."""
    target = tiny_target()
    d = make(family, target)
    runner = drafter_runner(d)
    protocol = {"feature": FeatureDrafter, "lm": TokenDrafter, "block": BlockDrafter}[get_family(family).session]
    assert isinstance(runner, protocol)
    others = {FeatureDrafter: ("feature_step",), TokenDrafter: ("lm_step", ), BlockDrafter: ("block_drafts",)}
    assert not any(hasattr(runner, call) for p, calls in others.items() if p is not protocol for call in calls)
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


def test_the_loop_imports_no_backend():
    """runtime/loop.py, plain.py and drafting.py see runners only: they import no backend module (a function-
    level import included), and the torch backend imports nothing of runtime/bench.py."""
    runtime = PACKAGE.parent
    for name in ("loop.py", "plain.py", "drafting.py"):
        imported = [n.module for n in ast.walk(ast.parse((runtime / name).read_text()))
                    if isinstance(n, ast.ImportFrom) and n.module]
        assert not [m for m in imported if m.startswith("specpress.runtime.backends") and not m.endswith(".base")], name
    torch_runner = ast.parse((PACKAGE / "torch" / "runner.py").read_text())
    assert not [n for n in ast.walk(torch_runner)
                if isinstance(n, ast.ImportFrom) and n.module == "specpress.runtime.bench"]


def test_compile_and_target_quant_follow_the_modules_trait_not_a_name(monkeypatch, tmp_path):
    """--compile, --compile-target and --target-quant need a backend that runs specpress's torch modules: the
    checks read the registry's `modules` trait, so a new module-running backend passes them without an edit
    and a graph backend is refused by its own name."""
    from specpress.decode.bench_pipeline import check_compile
    from specpress.decode.target_quant_steps import check_target_backend
    from specpress.errors import UsageError

    assert [b.name for b in registry().values() if b.modules] == ["torch"]
    monkeypatch.setitem(registry(), "eager2", Backend("eager2", "specpress_never_imported", "drafter", "n/a",
                                                      modules=True))
    check_compile(True, tmp_path, "eager2")
    check_target_backend(object(), "eager2", compile_target=False)
    for name in ("onnxruntime", "tensorrt"):
        with pytest.raises(UsageError, match=f"the {name} backend runs its own graph"):
            check_compile(True, tmp_path, name)
        with pytest.raises(UsageError, match=f"--target-backend {name} runs the float target's export"):
            check_target_backend(object(), name, compile_target=False)
