"""Recipes: strict loading (unknown keys, types, empty grid, relative paths), grid expansion, shipped recipes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from specpress.errors import ConfigError
from specpress.sweep.recipe import BUNDLED, TOP_KEYS, load_recipe, parse_recipe

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
BENCH_RECIPES = sorted((REPO / "bench").glob("*.yaml"))  # the studies BENCHMARKS.md quotes
MINIMAL = {"target": "target", "drafter": "drafter", "prompts": "p.jsonl", "grid": [{"quantize": {"scheme": "int8"}}]}


def parse(tmp_path: Path, **changes) -> object:
    obj = {**MINIMAL, **changes}
    return parse_recipe({k: v for k, v in obj.items() if v is not None}, tmp_path, tmp_path / "r.yaml")


@pytest.mark.parametrize("path", RECIPES + BENCH_RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_recipe_loads(path):
    import warnings

    from specpress.errors import Deprecated

    with warnings.catch_warnings():
        warnings.simplefilter("error", Deprecated)  # shipped recipes use today's spellings
        r = load_recipe(path)
    assert r.points[0].id == "base" and len(r.points) > 1
    assert len({p.id for p in r.points}) == len(r.points)


def test_shipped_recipes_exist_and_readme_mentions_each():
    names = {p.name for p in RECIPES}
    assert {"quickstart.yaml", "eagle3.yaml", "eagle.yaml", "mtp.yaml", "dflash.yaml",
            "llama31-8b-eagle3.yaml"} <= names
    readme = (REPO / "README.md").read_text()
    missing = sorted(n for n in names if not re.search(rf"(?<![\w.-]){re.escape(n)}", readme))
    assert not missing, f"README.md does not mention {missing}"


def test_repo_quickstart_is_the_bundled_file():
    """One source: recipes/quickstart.yaml is a link to the packaged recipe, not a second copy."""
    repo_copy = REPO / "recipes" / "quickstart.yaml"
    assert repo_copy.is_symlink() and repo_copy.resolve() == (BUNDLED / "quickstart.yaml").resolve()
    assert load_recipe("quickstart").hash() == load_recipe(REPO / "recipes" / "quickstart.yaml").hash()


def test_unknown_top_level_key_names_it_and_the_allowed_ones(tmp_path):
    with pytest.raises(ConfigError) as e:
        parse(tmp_path, max_new_token=3)
    msg = str(e.value)
    assert "'max_new_token'" in msg and all(k in msg for k in TOP_KEYS) and "r.yaml" in msg


@pytest.mark.parametrize("changes, words", [
    (dict(grid=[{"quantize": {"scheme": "int8", "bitz": 4}}]), ["'bitz'", "group_size", "scheme"]),
    (dict(grid=[{"prune": {"fnn": 0.5}}]), ["'fnn'", "ffn", "recover_steps"]),
    (dict(grid=[{"quantise": {"scheme": "int8"}}]), ["'quantise'", "quantize", "chain"]),
    (dict(drafter={"distill": {"family": "eagle3", "steps": 5, "stepz": 1}}), ["'stepz'", "data", "ttt_steps"]),
    (dict(prompts={"heldout": {"n": 5, "tokenz": 3}}), ["'tokenz'", "tokens"]),
])
def test_unknown_nested_keys(tmp_path, changes, words):
    with pytest.raises(ConfigError) as e:
        parse(tmp_path, **changes)
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("changes, words", [
    (dict(max_new_tokens="48"), ["max_new_tokens", "integer", "'48'"]),
    (dict(policies="chain:4"), ["policies", "list"]),
    (dict(policies=["chain:x"]), ["policies[0]", "chain:K"]),
    (dict(temperatures=[-1]), ["temperatures[0]", ">= 0"]),
    (dict(grid=[{"quantize": {"scheme": "int4", "group_size": "64"}}]), ["group_size", "'64'"]),
    (dict(grid=["int8"]), ["grid[0]", "mapping"]),
    (dict(grid={"quantize": {"scheme": "int8"}}), ["grid", "list"]),
    (dict(drafter={"distill": {"family": "eagle3"}}), ["budget"]),
    (dict(drafter={"distill": {"family": "nope", "steps": 3}}), ["nope", "eagle3"]),
    (dict(target="zoo:huge"), ["huge", "small"]),
    (dict(backends=["nope"]), ["nope", "backends: torch"]),
    (dict(dtype="fp64"), ["fp64", "bf16"]),
    (dict(float_dtype="half"), ["float_dtype", "half", "auto"]),
    (dict(target=None), ["needs 'target'"]),
])
def test_wrong_types_and_values_are_clear(tmp_path, changes, words):
    with pytest.raises(ConfigError) as e:
        parse(tmp_path, **changes)
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("grid", [[], None])
def test_empty_grid_is_an_error(tmp_path, grid):
    obj = {**MINIMAL, "grid": grid}
    with pytest.raises(ConfigError, match="grid is empty"):
        parse_recipe(obj, tmp_path)


def test_paths_resolve_against_the_recipe_file(tmp_path, monkeypatch):
    sub = tmp_path / "recipes"
    sub.mkdir()
    f = sub / "r.yaml"
    f.write_text(yaml.safe_dump({**MINIMAL, "target": "../models/t", "drafter": "d", "prompts": "/abs/p.jsonl",
                                 "calibration": "data/calib.txt", "agreement_data": "zoo-val"}))
    monkeypatch.chdir(tmp_path.parent)
    r = load_recipe(f)
    assert r.target.path == (tmp_path / "models" / "t").resolve()
    assert r.drafter.path == (sub / "d").resolve()
    assert r.prompts.path == Path("/abs/p.jsonl")
    assert r.calibration.path == (sub / "data" / "calib.txt").resolve()
    assert r.agreement_data.zoo_split == "val" and r.target.zoo is None


def test_product_expansion_ids_and_skipped_combinations(tmp_path):
    r = parse(tmp_path, grid=[
        {"quantize": {"scheme": ["int4", "nf4"], "group_size": [32, 64], "method": ["rtn", "gptq", "bnb"]}},
        {"chain": [{"prune": {"ffn": [576, 384], "recover_steps": 10}}, {"quantize": {"scheme": "int8"}}]},
        {"id": "vq", "prune": {"vocab": 512}},
        [{"prune": {"kv_heads": 2}}, {"quantize": {"scheme": "fp8"}}],
    ])
    ids = [p.id for p in r.points]
    assert ids == ["base", "int4-g32", "int4-g32-gptq", "int4-g64", "int4-g64-gptq", "nf4-g32", "nf4-g64",
                   "ffn576-r10+int8", "ffn384-r10+int8", "vq", "kv2+fp8-dyn"]
    assert len(r.skipped) == 6  # int4 x bnb (2), nf4 x rtn / gptq (4): combinations that do not exist
    assert sum("'nf4'" in s and "'gptq'" in s for s in r.skipped) == 2
    chain = r.point("ffn384-r10+int8")
    assert [s.kind for s in chain.steps] == ["prune", "quantize"]
    assert chain.steps[0].config().ffn == 384 and chain.steps[0].config().recover_steps == 10
    assert r.point("int4-g64-gptq").steps[0].config().method == "gptq"


def test_deprecated_prune_shares_still_load_with_their_old_ids_and_warn(tmp_path):
    """prune ffn / heads as shares to remove (the old spelling) load for one release: their old point ids, one
    warning per spelling naming the recipe and what to write instead."""
    from specpress.errors import Deprecated

    with pytest.warns(Deprecated) as caught:
        r = parse(tmp_path, grid=[{"prune": {"ffn": [0.25, 0.5]}}, {"prune": {"ffn": 0.5, "recover_steps": 5}},
                                  [{"prune": {"heads": 0.5}}, {"quantize": {"scheme": "fp8"}}]])
    assert [p.id for p in r.points] == ["base", "ffn25", "ffn50", "ffn50-r5", "heads50+fp8-dyn"]
    said = [str(w.message) for w in caught]
    assert len(said) == 3 and all("r.yaml: prune" in m and "deprecated" in m for m in said)  # ffn 0.5 once
    assert any("heads 0.5" in m and "kv_heads N" in m for m in said)


def test_explicit_invalid_point_is_an_error_not_a_skip(tmp_path):
    with pytest.raises(ConfigError, match="nf4"):
        parse(tmp_path, grid=[{"quantize": {"scheme": "nf4", "method": "gptq"}}])


def test_quantization_must_come_last(tmp_path):
    with pytest.raises(ConfigError, match="last step"):
        parse(tmp_path, grid=[{"chain": [{"quantize": {"scheme": "int8"}}, {"prune": {"ffn": 0.5}}]}])


def test_duplicate_points_and_reserved_base(tmp_path):
    with pytest.raises(ConfigError, match="appears twice"):
        parse(tmp_path, grid=[{"quantize": {"scheme": "int8"}}, {"quantize": {"scheme": "int8"}}])
    with pytest.raises(ConfigError, match="reserved"):
        parse(tmp_path, grid=[{"id": "base", "quantize": {"scheme": "int8"}}])
    with pytest.raises(ConfigError, match="expands to 2"):
        parse(tmp_path, grid=[{"id": "x", "quantize": {"scheme": ["int8", "fp8"]}}])


def test_hash_ignores_name_and_description_but_not_settings(tmp_path):
    a = parse(tmp_path, name="a", description="x")
    assert a.hash() == parse(tmp_path, name="b").hash()
    assert a.hash() != parse(tmp_path, max_new_tokens=65).hash()
    assert parse(tmp_path, policies=["chain:4", "dynamic:depth=2,topk=2,budget=4"]).policies == (
        "chain:4", "dynamic:depth=2,topk=2,budget=4")


def test_zoo_splits_accept_the_cli_spelling(tmp_path):
    """`zoo:train` (as `--data` spells it) and `zoo-train` are the same source, with the same recipe hash."""
    a, b = parse(tmp_path, calibration="zoo:train", agreement_data="zoo:val"), parse(tmp_path)
    assert a.calibration == b.calibration and a.agreement_data.zoo_split == "val" and a.hash() == b.hash()
    with pytest.raises(ConfigError, match="zoo:trian.*zoo:train"):
        parse(tmp_path, calibration="zoo:trian")


def test_real_target_chat_prompts_and_self_instruct_keys(tmp_path):
    """`target: smollm2-135m`, `prompts: {questions, n}`, `regenerate: {self_instruct: N}`, `drafter-data`."""
    from specpress.compress.self_instruct import ChatRegenConfig

    (tmp_path / "q.jsonl").write_text('{"turns": ["hi"]}\n')
    r = parse(tmp_path, target="smollm2-135m", prompts={"questions": "q.jsonl", "n": 5},
              drafter={"distill": {"family": "eagle3", "steps": 5,
                                   "regenerate": {"self_instruct": 7, "new_tokens": 9, "batch": 3}}},
              calibration="drafter-data")
    assert r.target.zoo == "smollm2-135m" and r.target.to_json() == "zoo:smollm2-135m"
    assert r.prompts.questions == tmp_path / "q.jsonl" and r.prompts.questions_n == 5
    assert r.drafter.distill.regenerate == ChatRegenConfig(conversations=7, answer_tokens=9, batch=3)
    assert r.calibration.drafter_data and r.calibration.to_json() == "drafter-data"
    assert parse(tmp_path, target="zoo:smollm2-135m").target.zoo == "smollm2-135m"
    with pytest.raises(ConfigError, match="unknown key 'sequences'"):
        parse(tmp_path, drafter={"distill": {"family": "eagle3", "steps": 5,
                                             "regenerate": {"self_instruct": 7, "sequences": 1}}})
    with pytest.raises(ConfigError, match="unknown key 'nn'"):
        parse(tmp_path, prompts={"questions": "q.jsonl", "nn": 5})
    with pytest.raises(ConfigError, match="drafter-data"):
        parse(tmp_path, drafter={"distill": {"family": "eagle3", "steps": 5, "data": "drafter-data"}})
