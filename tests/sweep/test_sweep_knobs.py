"""`search:` knobs for --find-smallest: expansion and validation, the proxy-pruned search on constructed cases,
Spearman, and a whole search on tiny random models (a candidate pruned by the proxy is never benched)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from drafters_common import lm_sweep_inputs

from specpress.cli import cli
from specpress.errors import ConfigError
from specpress.stats import spearman
from specpress.sweep.knobs import MAX_CANDIDATES, search_knobs, tau_proxy
from specpress.sweep.recipe import parse_recipe
from specpress.sweep.results import read_results
from specpress.sweep.search import Candidate, Trial

MINIMAL = {"target": "target", "drafter": "drafter", "prompts": "p.jsonl", "grid": [{"quantize": {"scheme": "int8"}}]}


def parse(tmp_path: Path, search: object) -> object:
    return parse_recipe({**MINIMAL, "search": search}, tmp_path, tmp_path / "r.yaml")


# ----------------------------------------------------------------------------------------------- recipe


def test_knobs_expand_to_the_product_and_join_the_grid(tmp_path):
    knobs = [{"chain": [{"prune": {"ffn": [20, 30]}}, {"quantize": {"scheme": ["int8", "int4"]}}]},
             {"quantize": {"scheme": ["int8", "fp8"]}}]  # int8 is already a grid point: not a second candidate
    r = parse(tmp_path, {"knobs": knobs, "margin": 0.1})
    ids = [p.id for p in r.search.points]
    assert ids == ["ffn20+int8", "ffn20+int4-g64", "ffn30+int8", "ffn30+int4-g64", "fp8-dyn"]
    assert [p.id for p in r.points] == ["base", "int8"]  # a plain sweep still runs the grid only
    assert r.point("ffn30+int4-g64").steps[0].kind == "prune" and r.search.margin == 0.1
    assert r.search.proxy_batches == 2
    plain = parse_recipe(MINIMAL, tmp_path, tmp_path / "r.yaml")
    assert "search" not in plain.to_dict() and r.hash() != plain.hash()  # recipes without it hash as before


@pytest.mark.parametrize("search, words", [
    ({"knobs": [{"quantize": {"scheme": ["int8"]}}], "marign": 0.1}, ["'marign'", "knobs", "margin",
                                                                      "proxy_batches"]),
    ({"margin": 0.1}, ["search.knobs", "non-empty list"]),
    ({"knobs": []}, ["search.knobs", "non-empty list"]),
    ([{"quantize": {"scheme": "int8"}}], ["search must be a mapping", "knobs"]),
    ({"knobs": [{"quantize": {"scheme": "int8"}}], "margin": 1.5}, ["search.margin", "[0, 1)"]),
    ({"knobs": [{"quantize": {"scheme": "int8"}}], "proxy_batches": 0}, ["search.proxy_batches", ">= 1"]),
    ({"knobs": [{"quantize": {"scheme": "int8"}}], "objective": "tau"}, ["search.objective", "bytes", "speed"]),
    ({"knobs": [{"prune": {"head_rnak": [8, 16]}}]}, ["search.knobs[0]", "'head_rnak'", "head_rank"]),
    ({"knobs": [{"id": "int8", "quantize": {"scheme": "int4"}}]}, ["'int8'", "other steps", "`id`"]),
])
def test_a_bad_search_block_names_the_key_and_the_fix(tmp_path, search, words):
    with pytest.raises(ConfigError) as e:
        parse(tmp_path, search)
    assert "r.yaml" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_a_search_too_large_is_refused_before_expanding(tmp_path):
    big = {"prune": {"ffn": list(range(1, 17)), "kv_heads": [1, 2], "recover_steps": list(range(0, 90, 10))}}
    with pytest.raises(ConfigError, match=rf"search.knobs\[0\] expands to 288 points; a search holds at most "
                                          rf"{MAX_CANDIDATES}.*list fewer values"):
        parse(tmp_path, {"knobs": [big]})


# ----------------------------------------------------------------------------------------------- search


def test_tau_proxy_and_spearman():
    assert tau_proxy([]) == 1.0 and tau_proxy([0.5, 0.5]) == pytest.approx(1.75)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / 10 ** 0.5)  # ties at mean rank (scipy agrees)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def _case(ret: dict[str, float], proxy: dict[str, float]):
    """Candidates c0 < c1 < ... by bytes with real retention `ret` and proxy `proxy`; evaluate logs its calls."""
    calls: list[str] = []

    def evaluate(pid: str) -> Trial:
        calls.append(pid)
        return Trial(pid, 0, ret[pid], tau=3 * ret[pid])

    cands = [Candidate(k, 100 * (i + 1)) for i, k in enumerate(ret)]
    return cands, evaluate, calls


def test_a_candidate_the_proxy_prunes_is_never_benched():
    ret = {"c0": 0.50, "c1": 0.99, "c2": 0.99, "c3": 1.0}
    cands, evaluate, calls = _case(ret, {})
    proxy = {"c0": 0.70, "c1": 0.97, "c2": 0.98, "c3": 1.0}
    ks = search_knobs(cands, proxy.__getitem__, evaluate, 0.97, 0.05)
    assert "c0" not in calls and ks.result.found == "c1"  # c0's 70 % is > 5 points under 97 %: skipped
    d = ks.to_dict(cands, 0.05)
    assert d["pruned"] == ["c0"] and d["prune_below"] == pytest.approx(0.92)
    row = d["candidates"][0]
    assert row == {"id": "c0", "bytes": 100, "proxy": 0.70, "pruned": True, "tau": None, "retention": None,
                   "speedup": None}
    assert d["spearman_n"] == len(set(calls)) and len(calls) >= 1


def test_the_answer_is_the_smallest_passing_by_real_tau_not_by_the_proxy():
    # the proxy ranks c0 and c1 as passing, but real τ fails them: the answer is c2, confirmed by its real τ;
    # c3's proxy is far below (wrongly): it is pruned, and c4 is the next larger that passes
    ret = {"c0": 0.90, "c1": 0.95, "c2": 0.98, "c3": 0.99, "c4": 1.0}
    proxy = {"c0": 0.99, "c1": 0.99, "c2": 0.96, "c3": 0.50, "c4": 0.99}
    cands, evaluate, calls = _case(ret, proxy)
    ks = search_knobs(cands, proxy.__getitem__, evaluate, 0.97, 0.02)
    passing = [c.id for c in cands if c.id not in ks.to_dict(cands, 0.02)["pruned"] and ret[c.id] >= 0.97]
    assert ks.result.found == passing[0] == "c2" and "c2" in calls and "c3" not in calls
    found = next(t for t in ks.result.trials if t.id == "c2")
    assert found.passed and found.retention == 0.98


def test_objective_speed_benches_what_the_proxy_keeps_and_picks_the_fastest_passing():
    ret = {"c0": 0.99, "c1": 0.98, "c2": 0.99, "c3": 0.90, "c4": 1.0}
    proxy = {"c0": 0.50, "c1": 0.99, "c2": 0.99, "c3": 0.99, "c4": 1.0}
    speed = {"c0": 9.0, "c1": 1.5, "c2": 2.0, "c3": 3.0, "c4": 1.2}  # c0 pruned, c3 fails real τ
    cands, evaluate, calls = _case(ret, proxy)
    ks = search_knobs(cands, proxy.__getitem__, evaluate, 0.97, 0.05, speed=speed.get)
    assert ks.result.found == "c2" and calls == ["c1", "c2", "c3", "c4"]
    rows = {r["id"]: r for r in ks.to_dict(cands, 0.05)["candidates"]}
    assert rows["c2"]["speedup"] == 2.0 and rows["c0"]["speedup"] is None and rows["c0"]["pruned"]


def test_a_candidate_that_cannot_be_built_is_left_out_and_said_so():
    ret = {"c0": 0.99, "c1": 1.0}
    cands, evaluate, calls = _case(ret, {})

    def proxy(pid: str) -> float:
        if pid == "c0":
            raise RuntimeError("no such head")
        return 1.0

    ks = search_knobs(cands, proxy, evaluate, 0.97, 0.05)
    assert ks.result.found == "c1" and "c0" not in calls
    assert ks.unbuilt == [{"point": "c0", "error": "RuntimeError: no such head"}]


# ----------------------------------------------------------------------------------------------- end to end


def _setup(root: Path, ffn: tuple[int, ...] = (1, 36, 38), **search: object) -> Path:
    """A tiny target and an lm drafter holding its weights (every draft accepted until compressed); the grid
    holds int8, the knobs FFN cuts of the drafter (a deep one the proxy prunes) chained with int8."""

    lm_sweep_inputs(root, prompts=6)
    recipe = {"target": "target", "drafter": "drafter", "prompts": "prompts.jsonl", "policies": ["chain:3"],
              "max_new_tokens": 10, "calibration": "ids.jsonl", "agreement_data": "ids.jsonl",
              "agreement_batches": 1, "grid": [{"quantize": {"scheme": "int8"}}],
              "search": {"knobs": [{"chain": [{"prune": {"ffn": list(ffn)}}, {"quantize": {"scheme": "int8"}}]}],
                         "margin": 0.05, "proxy_batches": 1, **search}}
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return root / "recipe.yaml"


def test_find_smallest_searches_the_knobs_prunes_by_proxy_and_confirms_by_real_tau(tmp_path):
    recipe = _setup(tmp_path)
    res = CliRunner().invoke(cli, ["sweep", str(recipe), "--out", str(tmp_path / "s"), "--find-smallest",
                                   "--max-tau-loss", "3%"])
    assert res.exit_code == 0, (res.output, res.exception)
    s = json.loads((tmp_path / "s" / "search.json").read_text())
    k = s["knobs"]
    rows = {r["id"]: r for r in k["candidates"]}
    assert set(rows) == {"int8", "ffn1+int8", "ffn36+int8", "ffn38+int8"}
    assert all(r["proxy"] is not None and r["bytes"] > 0 for r in rows.values())
    assert [r["bytes"] for r in k["candidates"]] == sorted(r["bytes"] for r in k["candidates"])
    assert k["pruned"] == ["ffn1+int8"] and rows["ffn1+int8"]["proxy"] < k["prune_below"]
    benched = {r["point"] for r in read_results(tmp_path / "s")}
    assert "ffn1+int8" not in benched and (tmp_path / "s" / "points" / "ffn1+int8" / "drafter").is_dir()
    for t in s["trials"]:  # every benched candidate's real τ is in its row
        assert rows[t["id"]]["retention"] == t["retention"] and rows[t["id"]]["tau"] == t["tau"]
    assert s["found"] is not None and s["found"] != "ffn1+int8"
    found = next(t for t in s["trials"] if t["id"] == s["found"])
    assert found["passed"] and found["retention"] >= 0.97  # confirmed by real τ
    smaller = [r for r in k["candidates"] if r["bytes"] < rows[s["found"]]["bytes"] and not r["pruned"]]
    assert all(r["retention"] < 0.97 for r in smaller if r["retention"] is not None)
    assert not smaller or smaller[-1]["retention"] is not None  # the next smaller one was benched, and failed
    assert k["spearman_n"] == len(s["trials"]) and (k["spearman_n"] >= 3 or k["spearman"] is None)
    assert "pruned (not benched)" in res.output


def test_objective_speed_answers_the_fastest_benched_candidate(tmp_path):
    recipe = _setup(tmp_path, ffn=(38,), objective="speed")
    res = CliRunner().invoke(cli, ["sweep", str(recipe), "--out", str(tmp_path / "s"), "--find-smallest",
                                   "--max-tau-loss", "50%"])
    assert res.exit_code == 0, (res.output, res.exception)
    s = json.loads((tmp_path / "s" / "search.json").read_text())
    rows = s["knobs"]["candidates"]
    assert s["knobs"]["objective"] == "speed" and all(r["speedup"] is not None for r in rows)  # all benched
    passing = [r for r in rows if r["retention"] >= 0.5]
    assert s["found"] == max(passing, key=lambda r: r["speedup"])["id"] and "fastest point" in res.output


def test_the_readme_example_loads_and_help_says_how_it_works(tmp_path):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Find the smallest drafter", 1)[1]
    example = yaml.safe_load(section.split("```yaml", 1)[1].split("```", 1)[0])
    r = parse(tmp_path, example["search"])
    assert len(r.search.points) == 3 * 2 * 2 + 2 and r.search.margin == 0.05
    out = CliRunner().invoke(cli, ["sweep", "--help"]).output
    assert "search:" in out and "proxy" in out and "Spearman" in out
