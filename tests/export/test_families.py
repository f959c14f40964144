"""The export descriptor table (export/families.py EXPORTS) and the graph roles it writes to manifest.json."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import pytest
import torch
from drafters_common import CONFIGS, SHAPE, randomize

from specpress.errors import CheckpointError, UsageError
from specpress.export.blocks import Ctx
from specpress.export.families import EXPORTS, build_graphs, cache_dims, export_family
from specpress.export.graph import Graph
from specpress.manifest import CALLS, GraphRole, format1_role, load_manifest, manifest_from_dict
from specpress.models import forced
from specpress.models.drafter import BUILTIN_FAMILIES, build_drafter, family_names, register_family, unregister_family
from specpress.models.eagle import EagleConfig, EagleDrafter
from specpress.models.family import DistillDefaults

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
        with pytest.raises(UsageError, match=f"no ONNX export for drafter family '{name}'; exportable: "
                                             f"eagle, eagle3, mtp, dflash, lm"):
            export_family(name)
    d = build_drafter(UnexportedConfig(**SHAPE))
    with pytest.raises(UsageError, match="no ONNX export for drafter family 'unexported'"):
        built(d)  # refused before any graph is built


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


@pytest.mark.parametrize("name", CASES)
def test_format1_manifests_get_the_roles_export_writes(name, target):
    """Exports written before roles were recorded load with the roles a fresh export writes."""
    d = drafter(name, target)
    _, roles = built(d)
    layers = cache_dims(d)[0]
    assert {g: format1_role(g, layers) for g in roles} == roles


def test_format1_manifest_loads_and_drives_the_same_graphs(exported, target, tmp_path):
    from specpress.runtime.backends.onnxruntime import load_runner

    _, path, _ = exported("eagle3")
    raw = json.loads((path / "manifest.json").read_text())
    old = json.loads(json.dumps(raw))
    old["format_version"] = 1
    for g in old["graphs"]:
        del g["role"]
    assert manifest_from_dict(old).graphs == load_manifest(path).graphs
    del old["graphs"][0]["file"]
    with pytest.raises(CheckpointError, match=r"graphs\[0\]: missing key\(s\) file"):
        manifest_from_dict(old)
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


def test_format1_role_refuses_unknown_graph_names():
    assert format1_role("step.1", 2) == GraphRole("feature", (1,))
    assert format1_role("block", 3) == GraphRole("block", (0, 1, 2))
    for bad in ("draft", "step.x", "fuse.1"):
        with pytest.raises(CheckpointError, match=f"graph '{bad}' of a format-1 manifest has no known role"):
            format1_role(bad, 2)


@pytest.mark.parametrize("name, calls", [
    ("lm", ("fuse_taps", "feature_step", "block_drafts")),
    ("eagle", ("fuse_taps", "lm_step", "block_drafts")),
    ("dflash", ("feature_step", "lm_step")),
])
def test_exported_runner_refuses_calls_its_graphs_do_not_serve(name, calls, exported, target):
    from specpress.runtime.backends.onnxruntime import load_runner

    _, path, _ = exported(name)
    runner = load_runner(path, target, "cpu")
    ids = torch.tensor([[1, 2]])
    cache = runner.new_cache(8)
    args = {"fuse_taps": ({},), "feature_step": (torch.zeros(1, 2, 4), ids, cache, None, None),
            "lm_step": (ids, cache, None, None), "block_drafts": (None, 1, 4, cache)}
    said = {"fuse_taps": "take no fused taps", "feature_step": "have no feature step",
            "lm_step": "are not standalone language models", "block_drafts": "do not draft blocks"}
    for call in calls:
        with pytest.raises(NotImplementedError, match=f"{name} drafters {said[call]}"):
            getattr(runner, call)(*args[call])
