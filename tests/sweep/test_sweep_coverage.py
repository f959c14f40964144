"""A sweep over an EAGLE-3 drafter with a draft-vocabulary prune: every point reports evaluation coverage beside
the calibration coverage prune recorded; the table has the column and warns about the point ranked off-traffic."""

from __future__ import annotations

import csv
import io
import json

import torch
import yaml
from click.testing import CliRunner
from drafters_common import make, tiny_target

from specpress.cli import cli
from specpress.models.drafter_io import save_drafter
from specpress.models.target import save_target
from specpress.sweep.results import read_results


def test_sweep_points_report_eval_and_calibration_coverage(tmp_path):
    target = tiny_target()
    with torch.no_grad():
        target.lm_head.weight[1] *= 25.0  # the target emits token 1 often; the pruned vocabulary leaves it out
    save_target(target, tmp_path / "target")
    base = make("eagle3", target)
    save_drafter(base, tmp_path / "drafter")
    kept = [t for t in base.to_target_ids(torch.arange(24)).tolist() if t != 1][:6]
    g = torch.Generator().manual_seed(3)
    prompts = [{"input_ids": torch.randint(2, 60, (5,), generator=g).tolist()} for _ in range(4)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts))
    data = [{"input_ids": [kept[i % 6] for i in range(300)]}]  # ranking data made of the kept tokens only
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    recipe = {"target": "target", "drafter": "drafter", "prompts": "prompts.jsonl", "policies": ["chain:3"],
              "max_new_tokens": 12, "calibration": "ids.jsonl", "agreement_data": "ids.jsonl",
              "agreement_batches": 1, "grid": [{"prune": {"vocab": 6, "vocab_source": "data", "vocab_tokens": 1024}}]}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, (res.output, res.exception)
    recs = {r["point"]: r for r in read_results(tmp_path / "out")}
    assert set(recs) == {"base", "vocab6-vdata-vt1024"}
    assert recs["base"]["calibration_coverage"] is None and 0 <= recs["base"]["eval_coverage"] <= 1
    pruned = recs["vocab6-vdata-vt1024"]
    assert pruned["calibration_coverage"] > 0.9 and pruned["eval_coverage"] < pruned["calibration_coverage"] - 0.03
    md = (tmp_path / "out" / "table.md").read_text()
    assert "vocab coverage eval / calib" in md
    assert f"{100 * pruned['eval_coverage']:.1f} / {100 * pruned['calibration_coverage']:.1f} % ⚠" in md
    assert "**Warning** vocab6-vdata-vt1024: the draft vocabulary covers" in md and "**Warning** base" not in md
    rows = {r["point"]: r for r in csv.DictReader(io.StringIO((tmp_path / "out" / "table.csv").read_text()))}
    assert float(rows["vocab6-vdata-vt1024"]["eval_coverage"]) == pruned["eval_coverage"]
    text = " ".join(res.output.split())
    assert "warning: vocab6-vdata-vt1024: the draft vocabulary covers" in text
    assert f"vocab coverage {100 * pruned['eval_coverage']:.1f} % (calibration " in text  # the per-point line


def test_tables_without_a_reduced_vocabulary_have_no_coverage_column():
    from specpress.sweep.report import COVERAGE, markdown

    row = {"point": "base", "status": "ok", "policy": "chain:3", "temperature": 0.0, "backend": "torch",
           "steps": [], "eval_coverage": None}
    assert COVERAGE not in markdown([row]) and COVERAGE in markdown([{**row, "eval_coverage": 0.9}])
