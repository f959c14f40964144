"""The export descriptors (EXPORTS of export/families/, each family's module registering its own with
register_export) and the graph roles they write to manifest.json."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import pytest
import torch
from drafters_common import CONFIGS, SHAPE, randomize

from specpress.errors import CheckpointError, RequestError
from specpress.export.context import Ctx
from specpress.export.families import (EXPORTS, build_graphs, cache_dims, export_family, register_export,
                                      unregister_export)
from specpress.export.graph import Graph
from specpress.manifest import CALLS, GraphRole, load_manifest, manifest_from_dict
from specpress.models import forced
from specpress.models.drafter import BUILTIN_FAMILIES, build_drafter, family_names, register_family, unregister_family
from specpress.models.eagle import EagleConfig, EagleDrafter
from specpress.models.family import DistillDefaults
from specpress.runtime.backends.base import BlockDrafter, FeatureDrafter, TokenDrafter

# every exportable shape of the test drafters: dflash with and without its Markov head, MTP with two modules
CASES = ["eagle", "eagle3", "mtp", "mtp2", "dflash", "dflash_markov", "lm"]


def drafter(name: str, target):
    from conftest import make_drafter

    if name == "mtp2":
        cfg = dataclasses.replace(CONFIGS["mtp"], num_nextn_predict_layers=2)
        return randomize(build_drafter(cfg), 3).attach_target(target)
    return make_drafter(name, target)


def built(d) -> tuple[dict[str, Ctx], dict[str, GraphRole]]:
    return build_graphs(d, lambda name: Ctx(Graph(name, 23), "standard"))


class UnexportedConfig(EagleConfig):
    family: ClassVar[str] = "unexported"


class UnexportedDrafter(EagleDrafter):
    family: ClassVar[str] = "unexported"


@pytest.fixture
def unexported():
    """A registered family (an EAGLE network under another name) that has no export descriptor."""
    traits = dict(session="feature", policies=("chain",), default_policy="chain:2", teacher_forced=forced.chain,
                  loss="chain", distill=DistillDefaults(), prunable=("ffn",), draft_vocab="target",
                  student=lambda shape, spec, t, teacher: UnexportedConfig(**shape))
    register_family("unexported", UnexportedConfig, UnexportedDrafter, lambda cfg, src: UnexportedConfig(),
                    lambda c: {}, **traits)
    yield
    unregister_family("unexported")


def test_every_family_is_exportable_or_refused_by_name(unexported):
    assert set(BUILTIN_FAMILIES) <= set(EXPORTS)  # every built-in family exports
    assert set(EXPORTS) <= set(family_names())  # and no descriptor outlives its family
    refused = [f for f in family_names() if f not in EXPORTS]
    assert refused == ["unexported"]
    for name in refused:
        with pytest.raises(RequestError, match=f"no ONNX export for drafter family '{name}'; exportable: "
                                             f"eagle, eagle3, mtp, dflash, lm"):
            export_family(name)
    d = build_drafter(UnexportedConfig(**SHAPE))
    with pytest.raises(RequestError, match="no ONNX export for drafter family 'unexported'"):
        built(d)  # refused before any graph is built


def test_a_family_registers_its_own_export(unexported, target):
    """Exporting a family is one register_export call beside its builder, from any module: the 'unexported'
    family (an EAGLE network) given eagle's descriptor here builds its graphs and is listed as exportable; a
    name registered twice is refused and a built-in stays registered."""
    with pytest.raises(ValueError, match="an ONNX export for drafter family 'eagle' is already registered"):
        register_export("eagle", EXPORTS["eagle"])
    with pytest.raises(ValueError, match="'eagle' is a built-in drafter family"):
        unregister_export("eagle")
    register_export("unexported", EXPORTS["eagle"])
    try:
        ctxs, roles = built(build_drafter(UnexportedConfig(**SHAPE), target))
        assert list(ctxs) == ["step"] and roles["step"] == GraphRole("feature", (0,))
        with pytest.raises(RequestError, match="^no ONNX export for drafter family 'medusa'; exportable: eagle, "
                                               "eagle3, mtp, dflash, lm, unexported$"):
            export_family("medusa")
    finally:
        unregister_export("unexported")
    assert list(EXPORTS) == ["eagle", "eagle3", "mtp", "dflash", "lm"]


@pytest.mark.parametrize("name", CASES)
def test_roles_describe_the_built_graphs(name, target):
    """Each graph's role matches what the builder made: attention graphs take past K/V for exactly their
    cache layers, the feature graphs are one per draft module and together hold every cache layer."""
    d = drafter(name, target)
    ctxs, roles = built(d)
    layers = cache_dims(d)[0]
    assert list(ctxs) == list(roles) and all(r.call in CALLS for r in roles.values())
    for graph, role in roles.items():
        pasts = [i for i in ctxs[graph].g.model().graph.input if i.name.startswith("past_key.")]
        assert [p.name for p in pasts] == [f"past_key.{j}" for j in range(len(role.cache_layers))], graph
        assert all(0 <= i < layers for i in role.cache_layers), graph
        assert (role.call in ("fuse", "markov")) == (not role.cache_layers), graph
    calls = [r.call for r in roles.values()]
    assert ("fuse" in calls) == (export_family(d.family).fuse is not None)
    steps = [r for r in roles.values() if r.call == "feature"]
    if steps:
        assert len(steps) in (1, d.draft_modules())
        assert sorted(i for r in steps for i in r.cache_layers) == list(range(layers))
    assert sum(c in ("feature", "lm", "block") for c in set(calls)) == 1  # one way to draft
    assert all(calls.count(c) == 1 for c in ("fuse", "lm", "block", "markov") if c in calls)


def test_manifest_roles_are_checked_and_a_format1_manifest_is_refused(exported, target):
    from specpress.runtime.backends.onnxruntime.runner import load_runner

    _, path, _ = exported("eagle3")
    raw = json.loads((path / "manifest.json").read_text())
    assert manifest_from_dict(json.loads(json.dumps(raw))).graphs == load_manifest(path).graphs
    old = json.loads(json.dumps(raw))
    old["format_version"] = 1
    for g in old["graphs"]:
        del g["role"]
    with pytest.raises(CheckpointError, match="format_version 1.*re-export with `specpress export onnx`"):
        manifest_from_dict(old)
    del raw["graphs"][0]["file"]
    with pytest.raises(CheckpointError, match=r"graphs\[0\]: missing key\(s\) file"):
        manifest_from_dict(raw)
    raw = json.loads((path / "manifest.json").read_text())
    raw["graphs"][0]["role"]["cache_layers"] = ["0"]
    with pytest.raises(CheckpointError, match=r"graphs.0..role: cache_layers must be a list of layer indices"):
        manifest_from_dict(raw)
    raw["graphs"][0]["role"]["call"] = "beam"
    raw["graphs"][0]["role"]["cache_layers"] = []
    with pytest.raises(CheckpointError, match="graphs.0..role: graph role call 'beam' is not one of"):
        manifest_from_dict(raw)
    runner = load_runner(path, target, "cpu")
    taps = target(torch.tensor([[3, 5, 7]]), taps=runner.taps).taps
    assert runner.fuse_taps(taps).shape[-1] == runner.info.hidden_size


@pytest.mark.parametrize("name, protocol", [("lm", TokenDrafter), ("eagle", FeatureDrafter), ("eagle3", FeatureDrafter),
                                            ("mtp", FeatureDrafter), ("dflash", BlockDrafter)])
def test_exported_runner_offers_the_calls_its_graphs_serve(name, protocol, exported, target):
    """The runner of an export is the protocol of the calls its graphs serve (the manifest's roles, not the
    family's name), and offers no other kind's call."""
    from specpress.runtime.backends.onnxruntime.runner import load_runner

    _, path, _ = exported(name)
    runner = load_runner(path, target, "cpu")
    assert isinstance(runner, protocol)
    calls = {"feature_step", "lm_step", "block_drafts"} - {c for c in ("feature_step", "lm_step", "block_drafts")
                                                           if hasattr(protocol, c)}
    assert not any(hasattr(runner, c) for c in calls), (name, [c for c in calls if hasattr(runner, c)])
    if name == "eagle":  # no taps: the target's last hidden state goes in as it is
        with pytest.raises(RequestError, match="eagle drafters take no fused taps"):
            runner.fuse_taps({})

