"""The family descriptor: registration rules, every built-in family's traits, a toy family registered here
running through every consumer of the descriptor, and the teacher-forced forward against the forwards it
replaced."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping

import numpy as np
import pytest
import torch

from drafters_common import CONFIGS, IDS, make, tiny_target
from specpress.compress.config import DistillConfig, record_keys
from specpress.compress.importance import calibration_signals, fit, layer_stack, make_probes
from specpress.compress.losses import LOSSES, LossContext, chain_loss, get_loss
from specpress.compress.quantize.api import quantize
from specpress.compress.quantize.calibrate import drafter_forward
from specpress.compress.students import student_config
from specpress.compress.teacher import target_signals
from specpress.errors import ConfigError, RequestError
from specpress.models import eagle, forced
from specpress.models.drafter import (BUILTIN_FAMILIES, build_drafter, families_where, family_names, get_family,
                                      register_family, unregister_family)
from specpress.models.drafter_io import detect_family, read_drafter_config, save_drafter
from specpress.models.eagle import EagleConfig, EagleDrafter
from specpress.models.family import (REQUIRED_TRAITS, TRAITS, Detection, DistillDefaults, DistillOptions,
                                    StudentSpec, positive_option)
from specpress.models.forced import input_features
from specpress.models.target import TargetConfig, TargetModel
from specpress.runtime.backends.torch.runner import drafter_runner
from specpress.runtime.drafting import FeatureSession, check_policy, make_session
from specpress.runtime.policy import parse_policy


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return tiny_target()


# ------------------------------------------------------------------------------------ a toy family


class ToyConfig(EagleConfig):
    family: ClassVar[str] = "toy"


class ToyDrafter(EagleDrafter):
    family: ClassVar[str] = "toy"


def toy_student(shape: Mapping[str, Any], spec: StudentSpec, t: TargetConfig, teacher: Any) -> ToyConfig:
    return ToyConfig(**shape, num_hidden_layers=spec.layers or 1)


TOY_TRAITS = dict(session="feature", policies=("chain",), default_policy="chain:2", teacher_forced=forced.chain,
                  loss="chain", distill=DistillDefaults(lr=5e-4, grad_clip=0.25, ttt_steps=2),
                  prunable=("heads", "ffn"), draft_vocab="target", student=toy_student, note="a toy")


def toy_read(cfg: Mapping[str, Any], source: str) -> ToyConfig:
    """EAGLE-1's public config, read as a toy's."""
    c = eagle.read_config(cfg, source)
    return ToyConfig(**{f.name: getattr(c, f.name) for f in fields(c)})


def _register_toy(**traits: Any):
    return register_family("toy", ToyConfig, ToyDrafter, toy_read, eagle.write_config, **{**TOY_TRAITS, **traits})


@pytest.fixture
def toy():
    fam = _register_toy()
    yield fam
    unregister_family("toy")


def test_registration_fails_loudly(toy):
    with pytest.raises(ValueError, match="'toy' is already registered"):
        _register_toy()
    unregister_family("toy")
    with pytest.raises(ValueError, match=r"missing trait\(s\) \['session'\].*declares"):
        register_family("toy", ToyConfig, ToyDrafter, lambda c, s: ToyConfig(), lambda c: {},
                        **{k: v for k, v in TOY_TRAITS.items() if k != "session"})
    with pytest.raises(ValueError, match=r"unknown trait\(s\) \['colour'\]"):
        _register_toy(colour="red")
    for bad, match in (({"session": "beam"}, "session"), ({"default_policy": "block:8"}, "default_policy"),
                       ({"prunable": ("layers",)}, "layer_stack"), ({"prunable": ("vocab",)}, "draft_vocab"),
                       ({"loss": "mse"}, "loss"), ({"student": None}, "student"),
                       ({"speculators": "medusa"}, "speculators 'medusa' must be among eagle3, dflash")):
        with pytest.raises(ValueError, match=match):
            _register_toy(**bad)
    assert "toy" not in family_names()  # nothing half-registered
    with pytest.raises(ValueError, match="built-in"):
        unregister_family("eagle")


def test_unknown_family_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown drafter family 'medusa'; known families: dflash, eagle"):
        get_family("medusa")
    with pytest.raises(ConfigError, match="known families"):
        DistillConfig(family="medusa", steps=1)


@pytest.mark.parametrize("name", BUILTIN_FAMILIES)
def test_every_builtin_family_supplies_every_trait(name, target):
    fam = get_family(name)
    for trait in REQUIRED_TRAITS:
        assert getattr(fam, trait) not in (None, (), ""), trait
    assert fam.distill.published  # where its distill defaults come from
    check_policy(name, parse_policy(fam.default_policy))  # the runtime runs its default policy
    assert fam.loss in LOSSES and get_loss(name) is LOSSES[fam.loss]
    assert issubclass(fam.distill.options, DistillOptions)
    assert set(fam.distill.options.names()) <= set(record_keys())  # a recipe or a record may spell each one
    assert type(DistillConfig(family=name, steps=1).options) is fam.distill.options
    c = DistillConfig(family=name, steps=1)
    assert (c.lr, c.optimizer, c.resolved_grad_clip()) == (fam.distill.lr, fam.distill.optimizer, fam.distill.grad_clip)
    d = make(name, target)
    if fam.layer_stack is not None:
        assert len(layer_stack(d)[1]) == CONFIGS[name].num_hidden_layers
    else:
        with pytest.raises(RequestError, match="single layer"):
            layer_stack(d)
    student = student_config(DistillConfig(family=name, steps=1, draft_vocab=24 if name == "eagle3" else None),
                             target.config)
    assert student.family == name
    assert type(make_session(drafter_runner(d), 64)).__name__ == {"feature": "FeatureSession", "lm": "LMSession",
                                                 "block": "BlockSession"}[fam.session]


def test_family_only_options_name_the_families_that_take_them():
    assert families_where(lambda f: f.takes("taps")) == ["eagle3", "dflash"]
    with pytest.raises(ConfigError, match="'markov_rank' applies to dflash drafters, not eagle"):
        DistillConfig(family="eagle", steps=1, markov_rank=4)


def test_a_toy_family_runs_through_every_consumer(toy, target):
    assert get_family("toy") is toy and "toy" in family_names()
    c = DistillConfig(family="toy", steps=1, batch=2, seq_len=12)
    assert (c.lr, c.optimizer, c.resolved_grad_clip(), c.resolved_ttt_steps()) == (5e-4, "adamw", 0.25, 2)
    with pytest.raises(ConfigError, match="'taps' applies to eagle3 and dflash drafters, not toy"):
        DistillConfig(family="toy", steps=1, taps=(2,))
    check_policy("toy", parse_policy("chain:3"))
    with pytest.raises(RequestError, match="cannot run with a toy drafter; use one of chain:K"):
        check_policy("toy", parse_policy("tree:[[0],[1]]"))
    cfg = student_config(c, target.config)
    assert isinstance(cfg, ToyConfig)
    torch.manual_seed(0)
    d = build_drafter(cfg, target)
    assert isinstance(make_session(drafter_runner(d), 64), FeatureSession)
    assert get_loss("toy") is chain_loss
    ids = torch.randint(1, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    batch = target_signals(target, ids, d.taps)
    out = chain_loss(LossContext(d, batch, c, torch.Generator().manual_seed(0)))
    assert out.hits.shape == (2,) and torch.isfinite(out.loss)  # two unrolled steps: the toy's ttt_steps
    probes = make_probes(d, calibration_signals(target, [ids], d.taps))
    assert set(fit(d, probes)) == {"kl", "agreement"}
    drafter_forward(d, ids, batch.hidden, batch.taps)
    with pytest.raises(RequestError, match=r"toy drafters have a single layer \(a toy\)"):
        layer_stack(d)


@dataclass(frozen=True)
class ToyOptions(DistillOptions):
    """A toy family's own distill option, unknown to every built-in family."""

    sharpness: float | None = None

    def __post_init__(self) -> None:
        positive_option("sharpness", self.sharpness)


def test_a_family_brings_its_own_distill_options():
    """The options class is the family's: held as config.options, recorded flat after the shared fields, read
    back by from_dict and a recipe, refused by name on a family that does not take it, and gone with the family."""
    _register_toy(distill=DistillDefaults(lr=5e-4, options=ToyOptions))
    try:
        c = DistillConfig(family="toy", steps=1, options=ToyOptions(sharpness=2.0))
        assert c.options.sharpness == 2.0 and get_family("toy").takes("sharpness")
        d = c.to_dict()
        assert list(d)[-1] == "sharpness" and d["sharpness"] == 2.0 and d["taps"] is None
        assert DistillConfig.from_dict(json.loads(json.dumps(d))) == c
        assert "sharpness" in record_keys()
        with pytest.raises(ConfigError, match="'sharpness' must be a positive number, found -1"):
            DistillConfig.from_dict({**d, "sharpness": -1})
        with pytest.raises(ConfigError, match="'sharpness' applies to toy drafters, not eagle3"):
            DistillConfig.from_dict({"family": "eagle3", "steps": 1, "sharpness": 2.0})
        with pytest.raises(ConfigError, match="toy's options are ToyOptions, found Eagle3Options"):
            DistillConfig(family="toy", steps=1, options=DistillConfig(family="eagle3", steps=1).options)
        with pytest.raises(ValueError, match="must be a frozen dataclass subclassing DistillOptions"):
            DistillDefaults(options=dict)  # type: ignore[arg-type]
    finally:
        unregister_family("toy")
    assert "sharpness" not in record_keys()
    with pytest.raises(ConfigError, match="unknown key"):
        DistillConfig.from_dict({"family": "eagle3", "steps": 1, "sharpness": 2.0})


def test_a_toy_family_goes_through_export_hf(toy, target, tmp_path):
    """`export hf` routes a family by its serving facet (export/hf/facets/) and its traits: without a facet each
    engine refuses the toy with the message any unrouted family gets; with one registered from the test (as a
    family's own facet module would), each engine writes it or refuses it by the facet, and no engine file
    changes."""
    from specpress.export.hf import export_hf
    from specpress.export.hf.engines import ENGINES, engine, help_text
    from specpress.export.hf.facets import (
        Route,
        ServingFacet,
        register_serving,
        unregister_serving,
    )
    from specpress.models.drafter_io import save_drafter
    from specpress.models.quantized.scheme import config_for
    from specpress.models.target import save_target

    tdir = save_target(target, tmp_path / "target")
    d = build_drafter(student_config(DistillConfig(family="toy", steps=1), target.config), target)
    src = save_drafter(d, tmp_path / "src")
    for name, eng in ENGINES.items():  # no facet: the engine has no route for it
        with pytest.raises(RequestError) as err:
            export_hf(src, tmp_path / name, engine=name, verifier=str(tdir))
        assert str(err.value) == f"{eng.read_from} has no route for 'toy' drafters"
        assert "toy" not in eng.layouts and not (tmp_path / name).exists()
    with pytest.raises(ConfigError, match="speculators has no layout for specpress's 'toy' drafters"):
        export_hf(src, tmp_path / "sp", "speculators", verifier=str(tdir))  # its `speculators` trait is None

    facet = ServingFacet("toy", routes={"vllm": Route("public", "eagle"),
                                        "sglang": Route("public", "TOY", plain_fc="llama_toy.py",
                                                        architectures=("LlamaForCausalLMToy",))},
                         no_route={"trtllm": "TensorRT-LLM serves no toy: a toy"})
    register_serving(facet)
    try:
        with pytest.raises(ValueError, match="'toy' is already registered"):
            register_serving(facet)
        with pytest.raises(ValueError, match=r"unknown engines \['tgi'\]"):
            ServingFacet("toy2", no_route={"tgi": "no"})
        with pytest.raises(ValueError, match="layout 'onnx'"):
            Route("onnx", "x")
        assert engine("vllm").layouts["toy"] == "public" and "toy (public)" in help_text()
        s = export_hf(src, tmp_path / "v", engine="vllm", verifier=str(tdir))
        assert s.layout == "public toy" and '"method": "eagle"' in s.serve and s.speculative_tokens == 3
        s = export_hf(src, tmp_path / "s", engine="sglang", verifier=str(tdir))
        assert "--speculative-algorithm TOY" in s.serve and "--speculative-num-steps 3" in s.serve
        assert json.loads((s.out / "config.json").read_text())["architectures"] == ["LlamaForCausalLMToy"]
        with pytest.raises(RequestError, match="^TensorRT-LLM serves no toy: a toy$"):
            export_hf(src, tmp_path / "t", engine="trtllm", verifier=str(tdir))
        quantize(d, config_for("int8"))
        qsrc = save_drafter(d, tmp_path / "qsrc")
        with pytest.raises(RequestError, match=r"SGLang 0\.5\.23's TOY `fc` is a plain torch Linear \(srt/models/"
                                               r"llama_toy\.py"):
            export_hf(qsrc, tmp_path / "qs", engine="sglang", verifier=str(tdir))
        unregister_serving("toy")
        float_only = Route("public", "eagle", no_quant="builds toys in float")
        register_serving(ServingFacet("toy", routes={"vllm": float_only}))
        with pytest.raises(RequestError, match="^vLLM 0.34 builds toys in float$"):
            export_hf(qsrc, tmp_path / "qv", engine="vllm", verifier=str(tdir))
    finally:
        unregister_serving("toy")
    assert "toy" not in engine("vllm").layouts


def test_a_toy_family_is_detected_by_its_own_rule(target, tmp_path):
    """A public checkpoint (no `specpress` block) is told to be a family by the family's detection trait: a toy
    registered here with one is claimed by it, before the families with a later priority, named when nothing
    claims a config, and loads bare; drafter_io is not edited. Without one the toy is never detected."""
    with pytest.raises(ValueError, match="must name architectures, fields or weights"):
        Detection(priority=5)
    with pytest.raises(ValueError, match="detection priority 40 is eagle's; give it one of its own"):
        _register_toy(detection=Detection(priority=40, fields=("toy_depth",)))
    assert "toy" not in family_names()
    toy_arch = {"architectures": ["LlamaForCausalLMToy"]}
    _register_toy(detection=Detection(priority=5, architectures=("LlamaForCausalLMToy",), fields=("toy_depth",)))
    try:
        assert detect_family(toy_arch) == "toy"
        eagle1 = {"architectures": ["LlamaForCausalLM"], "bias": True}
        assert detect_family({**eagle1, "toy_depth": 2}) == "toy"  # asked before eagle (priority 40)
        assert detect_family(eagle1) == "eagle" and detect_family({**eagle1, "draft_vocab_size": 8}) == "eagle3"
        with pytest.raises(ConfigError) as err:
            detect_family({"architectures": ["Medusa"]})
        assert str(err.value) == (
            "config.json: cannot tell which drafter family this is: none claims architectures ['Medusa']; known "
            "families: eagle, eagle3, mtp, dflash, lm, toy (architectures DFlashDraftModel, Eagle3LlamaForCausalLM, "
            "LlamaForCausalLM, LlamaForCausalLMEagle3, LlamaForCausalLMToy, MistralForCausalLM, Qwen2ForCausalLM, "
            "Qwen3ForCausalLM)")
        d = build_drafter(student_config(DistillConfig(family="toy", steps=1), target.config), target)
        out = save_drafter(d, tmp_path / "toy")
        cfg = json.loads((out / "config.json").read_text())
        del cfg["specpress"]  # a public checkpoint: its weights hold EAGLE-1's fc.weight too
        (out / "config.json").write_text(json.dumps({**cfg, **toy_arch}))
        family, config, _ = read_drafter_config(out)
        assert family == "toy" and config == d.config
    finally:
        unregister_family("toy")
    _register_toy()  # no detection trait: only its own artifacts load as a toy
    try:
        with pytest.raises(ConfigError, match=r"none claims architectures \['LlamaForCausalLMToy'\]; known families: "
                                              r"eagle, eagle3, mtp, dflash, lm \("):
            detect_family(toy_arch)
    finally:
        unregister_family("toy")


def test_no_engine_file_branches_on_a_family_name():
    """What an engine does with a family is in the family's serving facet (export/hf/facets/) or its traits: the
    files that read them compare no family name and key no table by one (speculators.py keys its forms by
    speculators' own model types; a trait's value that is spelled like a family, `session == "lm"`, is a trait)."""
    root = Path(__file__).parents[2] / "specpress"
    names = set(BUILTIN_FAMILIES)
    files = [*sorted((root / "export" / "hf").glob("*.py")), root / "models" / "formats" / "speculators.py",
             root / "plan" / "commands.py", root / "models" / "inspect.py"]
    found = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            consts: list[ast.AST] = []
            sides = (node.left, *node.comparators) if isinstance(node, ast.Compare) else ()
            if any(isinstance(side, ast.Attribute) and side.attr in TRAITS for side in sides):
                continue  # a trait of the family's descriptor
            if isinstance(node, ast.Compare):
                for side in sides:
                    consts += side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            elif isinstance(node, ast.Dict) and f.name != "speculators.py":
                consts += [k for k in node.keys if k is not None]
            found += [f"{f.relative_to(root)}:{node.lineno} {c.value!r}" for c in consts
                      if isinstance(c, ast.Constant) and c.value in names]
    assert found == []
    assert len(files) > 8  # the scan saw the engine files


# ------------------------------------------------------------------------------------ teacher-forced forward


def test_chain_forward_is_the_plain_forward_it_replaced(target):
    """Calibration used to run d(features[:, :-1], ids[:, 1:]) without a cache: the one chained forward
    over T - 1 positions gives exactly those logits."""
    ids = IDS.repeat(2, 1)
    s = target_signals(target, ids, ())
    for name in ("eagle", "eagle3", "mtp"):
        d = make(name, target)
        s = target_signals(target, ids, tuple(d.taps))
        feats = input_features(d, s.hidden, s.taps)
        with torch.no_grad():
            old, _ = d(feats[:, :-1], ids[:, 1:])
            new = forced.chain(d, ids, feats, steps=1, span=ids.shape[1] - 1).steps[0][0]
        assert torch.equal(old, new), name


def test_block_forward_is_the_plain_forward_it_replaced(target):
    d = make("dflash", target)
    ids = IDS.repeat(2, 1)
    s = target_signals(target, ids, tuple(d.taps))
    bk = d.config.block_size
    anchors = forced.spaced_anchors(2, ids.shape[1], bk, ids.device)
    blocks, pos, mask = forced.block_inputs(d, ids, anchors, bk)
    with torch.no_grad():
        out = d(d.fuse_taps(s.taps), blocks, positions=pos, mask=mask)
        old = out.view(2, -1, bk, out.shape[-1])[:, :, 1:]
        new = forced.block(d, ids, d.fuse_taps(s.taps)).draft_logits(d)
    assert torch.equal(old, new)


# ------------------------------------------------------------------------------------ layers


def test_models_import_nothing_above_them():
    """models/ is the bottom layer: it imports nothing from compress/, runtime/, sweep/, export/ or the CLI."""
    above = ("specpress.compress", "specpress.runtime", "specpress.sweep", "specpress.export", "specpress.commands",
             "specpress.cli")
    root = Path(__file__).parents[2] / "specpress" / "models"
    found = []
    for f in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{f.relative_to(root)}: {n}" for n in names if n.startswith(above)]
    assert found == []
    assert sum(1 for _ in root.rglob("*.py")) > 10  # the scan saw the package


def test_students_follow_the_descriptor_for_vocabulary(target):
    """A reduced draft vocabulary is drawn from the data; an own vocabulary may change the hidden size."""
    from specpress.compress.students import init_student

    stream = np.tile(np.arange(1, 40), 20)
    d = init_student(DistillConfig(family="eagle3", steps=1, draft_vocab=24), target, stream)
    assert int(d.t2d.sum()) == 24
    with pytest.raises(RequestError, match="share the target's embeddings"):
        student_config(DistillConfig(family="dflash", steps=1, hidden=16), target.config)
    assert student_config(DistillConfig(family="lm", steps=1, hidden=16, heads=2), target.config).hidden_size == 16
