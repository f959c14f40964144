"""A sweep's `target_quant` axis: every point measured against compressed copies of the target too, paired with
the float target, in results, tables, plots and --find-smallest (tiny random models, seconds)."""

from __future__ import annotations

import csv
import io
import json

import pytest
import yaml
from click.testing import CliRunner
from test_sweep_end_to_end import RECIPE, write_setup

from specpress.cli import cli
from specpress.errors import ConfigError
from specpress.stats import paired_comparison
from specpress.sweep.plots import _tau_vs_target
from specpress.sweep.recipe import load_recipe, parse_recipe
from specpress.sweep.results import read_results, record_key

TARGETS = ["fp8:kv=fp8", "int4:method=gptq,group=8"]  # W8A8 + fp8 KV cache; GPTQ calibrated on `calibration`
LABELS = ["float", "fp8-dyn-kv8", "int4-g8-gptq"]
AXIS = {**RECIPE, "grid": [{"quantize": {"scheme": "int8"}}], "target_quant": TARGETS, "tolerate_failures": False}


def sweep(*args):
    return CliRunner().invoke(cli, ["sweep", *map(str, args)])


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    root = tmp_path_factory.mktemp("tq-sweep")
    write_setup(root)
    (root / "axis.yaml").write_text(yaml.safe_dump(AXIS))
    res = sweep(root / "axis.yaml", "--out", root / "out")
    assert res.exit_code == 0, (res.output, res.exception)
    return root, root / "out", res.output


def test_recipe_axis_expands_with_the_float_target_first(tmp_path):
    r = parse_recipe({**AXIS, "target_quant": ["int4:group=8,method=gptq", "none", "fp8:kv=fp8"]}, tmp_path)
    assert [t.label for t in r.targets] == ["float", "int4-g8-gptq", "fp8-dyn-kv8"]
    assert r.to_dict()["target_quant"] == ["int4:method=gptq,group=8", "fp8:kv=fp8"]
    plain = parse_recipe({**AXIS, "target_quant": ["none"]}, tmp_path)
    assert plain.target_quant == () and "target_quant" not in plain.to_dict()  # the hash of such recipes is kept
    assert plain.hash() == parse_recipe({k: v for k, v in AXIS.items() if k != "target_quant"}, tmp_path).hash()
    assert r.hash() != plain.hash()


@pytest.mark.parametrize("value,needle", [
    (["int5"], "target_quant[0]: --target-quant 'int5': unknown scheme"),
    (["fp8", "fp8:activations=dynamic"], "target_quant lists 'fp8-dyn' twice"),
    (["int4:group=8", {"scheme": "int4"}], "target_quant[1] must be a --target-quant spec string"),
    ("fp8", "target_quant must be a list"),
    ([], "target_quant is an empty list"),
])
def test_bad_axis_is_refused_at_load(tmp_path, value, needle):
    with pytest.raises(ConfigError) as exc:
        parse_recipe({**AXIS, "target_quant": value}, tmp_path)
    assert needle in str(exc.value)


def test_every_point_runs_on_every_target_losslessly(done):
    _, out, output = done
    recs = {(r["point"], r.get("target_quant")): r for r in read_results(out)}
    assert set(recs) == {(p, t) for p in ("base", "int8") for t in LABELS}
    assert all(r["status"] == "ok" and r["lossless_mismatches"] == 0 for r in recs.values())
    assert len({record_key(r) for r in recs.values()}) == 6
    for p in ("base", "int8"):
        f = recs[p, "float"]
        assert f["target_agreement"] is None and "target_paired" not in f
        for t in LABELS[1:]:
            r = recs[p, t]
            want = paired_comparison(r["per_prompt_tau"], f["per_prompt_tau"], seed=0)
            assert r["target_paired"] == want and r["target_retention"] == pytest.approx(r["tau"] / f["tau"])
            a = r["target_agreement"]
            assert a["prompts"] == 8 and 0 <= a["prefix"] <= 1 and a["exact_prompts"] <= 8
            assert r["target_quant_summary"]["quantized"] == 56 and r["bench_config"]["target_quant"] in TARGETS
    # the drafter point pairs with the base drafter on the same target
    for t in LABELS:
        want = paired_comparison(recs["int8", t]["per_prompt_tau"], recs["base", t]["per_prompt_tau"], seed=0)
        assert recs["int8", t]["paired"] == want
    # the greedy drift is the target's, whatever the drafter
    assert recs["base", "fp8-dyn-kv8"]["target_agreement"] == recs["int8", "fp8-dyn-kv8"]["target_agreement"]
    assert recs["base", "int4-g8-gptq"]["target_quant_summary"]["calibration"]["windows"] == 32
    # the drift compares the plain greedy decodes the benches made (kept under cache/), the targets' own
    from specpress.compress.quantize.target import compressed_copy, parse_target_quant
    from specpress.models.target import load_target
    from specpress.runtime.backends.torch.runner import TorchTarget
    from specpress.runtime.compressed_target import greedy_agreement
    from specpress.runtime.plain import decode_plain
    from specpress.runtime.prompts import load_prompts

    kept = {d["target"]: d["outputs"] for d in (json.loads(f.read_text()) for f in (out / "cache").glob("greedy-*"))}
    assert set(kept) == set(LABELS)
    root = out.parent
    target = load_target(root / "target")
    prompts = load_prompts(root / "prompts.jsonl", None, target.config.vocab_size)
    fp8, _ = compressed_copy(target, parse_target_quant("fp8:kv=fp8"))
    for label, t in (("float", target), ("fp8-dyn-kv8", fp8)):
        assert kept[label][:3] == [decode_plain(TorchTarget(t), p.ids, 12).tokens for p in prompts[:3]]
    assert recs["base", "fp8-dyn-kv8"]["target_agreement"] == greedy_agreement(kept["float"], kept["fp8-dyn-kv8"])
    assert "target int4-g8-gptq" in output and "vs float target Δτ" in output


def test_tables_and_plots_show_the_axis(done):
    _, out, _ = done
    md = (out / "table.md").read_text()
    assert "## policy chain:3, temperature 0, backend torch, target fp8-dyn-kv8" in md
    assert "## target precision: policy chain:3, temperature 0, backend torch" in md
    assert "Δτ vs float target [95 % CI]" in md and "greedy agreement (prefix / identical)" in md
    rows = list(csv.DictReader(io.StringIO((out / "table.csv").read_text())))
    assert sorted((r["point"], r["target_quant"]) for r in rows) == sorted(
        (p, t) for p in ("base", "int8") for t in LABELS)
    assert all(r["target_delta_tau"] for r in rows if r["target_quant"] != "float")
    assert (out / "plots" / "tau_vs_target.png").stat().st_size > 1000
    fig = _tau_vs_target(read_results(out))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == LABELS
    assert sorted(line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")) == \
        ["base", "int8"]
    tau_panels = [a.get_title() for a in __import__("specpress.sweep.plots", fromlist=["x"])._tau_vs_bytes(
        read_results(out)).axes if a.get_title()]
    assert any("target int4-g8-gptq" in t for t in tau_panels) and len(tau_panels) == 3


def test_resume_skips_every_target(done, tmp_path):
    import shutil

    root, out, _ = done
    mine = tmp_path / "o"
    shutil.copytree(out, mine)
    lines = (mine / "results.jsonl").read_text().splitlines()
    keep = [ln for ln in lines if not ('"point": "int8"' in ln and '"target_quant": "fp8-dyn-kv8"' in ln)]
    (mine / "results.jsonl").write_text("\n".join(keep) + "\n")
    res = sweep(root / "axis.yaml", "--out", mine, "--resume")
    assert res.exit_code == 0, res.output
    assert "resuming: 1 point(s) already measured, 1 to go" in res.output
    recs = [r for r in read_results(mine) if r["point"] == "int8"]
    assert sorted(r["target_quant"] for r in recs) == sorted(LABELS)


def test_find_smallest_searches_on_every_target(done, tmp_path):
    root, _, _ = done
    res = sweep(root / "axis.yaml", "--out", tmp_path / "s", "--find-smallest", "--max-tau-loss", "50%")
    assert res.exit_code == 0, (res.output, res.exception)
    s = json.loads((tmp_path / "s" / "search.json").read_text())
    assert s["target_quant"] == "float" and set(s["by_target"]) == set(LABELS)
    for label, one in s["by_target"].items():
        assert one["target_quant"] == label and one["evaluated"] == 1 and one["found"] == "int8"
        assert one["base_tau"] == next(r["tau"] for r in read_results(tmp_path / "s")
                                       if r["point"] == "base" and r["target_quant"] == label)
    assert "on target fp8-dyn-kv8" in res.output


def test_bundled_target_quant_recipe_loads():
    from pathlib import Path

    r = load_recipe(Path(__file__).resolve().parents[2] / "bench" / "target_quant.yaml")
    assert [t.label for t in r.targets] == ["float", "int8", "fp8-dyn", "int4-g64", "nvfp4-static"]


def test_a_quantize_point_can_calibrate_on_a_compressed_target(tmp_path):
    """grid quantize `target_quant`: GPTQ re-calibrated on the compressed target, its own point, measured on
    every target like any other. (The lm drafter sees only tokens: its calibration inputs change where the
    compressed target's greedy tokens do, as int4 g8's do here.)"""
    write_setup(tmp_path)
    recipe = {**AXIS, "target_quant": ["int4:group=8"], "grid": [{"quantize": {
        "scheme": "int4", "group_size": 8, "method": "gptq", "calib_batches": 1, "seq_len": 32,
        "target_quant": ["none", "int4:group=8"]}}]}
    r = parse_recipe(recipe, tmp_path)
    assert [p.id for p in r.points] == ["base", "int4-g8-gptq-cb1-sl32", "int4-g8-gptq-cb1-sl32-on-int4-g8"]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    res = sweep(tmp_path / "r.yaml", "--out", tmp_path / "o")
    assert res.exit_code == 0, (res.output, res.exception)
    recs = {(r["point"], r["target_quant"]): r for r in read_results(tmp_path / "o")}
    assert len(recs) == 6 and all(r["lossless_mismatches"] == 0 for r in recs.values())
    step = recs["int4-g8-gptq-cb1-sl32-on-int4-g8", "int4-g8"]["provenance"][-1]
    assert step["target_quant"] == {"spec": "int4:group=8", "label": "int4-g8"}
    assert "target_quant" not in recs["int4-g8-gptq-cb1-sl32", "int4-g8"]["provenance"][-1]
    from specpress.models.io import read_weights

    a, b = (read_weights(tmp_path / "o" / "points" / p / "drafter") for p in ("int4-g8-gptq-cb1-sl32",
                                                                                "int4-g8-gptq-cb1-sl32-on-int4-g8"))
    assert any(not __import__("torch").equal(a[k], b[k]) for k in a if k.endswith("qweight"))
    with pytest.raises(ConfigError, match="does not calibrate"):
        parse_recipe({**AXIS, "grid": [{"quantize": {"scheme": "int8", "target_quant": "fp8"}}]}, tmp_path)
