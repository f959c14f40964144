"""A sweep with head points (recipe keys head_rank / share_head, also chained with quantization): each point
is paired against the base, lossless, and the table counts a shared head's bytes apart in a "shared" column."""

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


def test_sweep_measures_low_rank_and_shared_heads(tmp_path):
    target = tiny_target()
    save_target(target, tmp_path / "target")
    save_drafter(make("eagle3", target), tmp_path / "drafter")
    g = torch.Generator().manual_seed(3)
    prompts = [{"input_ids": torch.randint(2, 60, (5,), generator=g).tolist()} for _ in range(3)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts))
    data = [{"input_ids": torch.randint(1, 60, (400,), generator=g).tolist()}]
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    int4 = {"quantize": {"scheme": "int4", "group_size": 4, "method": "rtn", "include": ["lm_head"]}}
    recipe = {"target": "target", "drafter": "drafter", "prompts": "prompts.jsonl", "max_new_tokens": 10,
              "policies": ["dynamic:depth=3,topk=2,budget=6"], "calibration": "ids.jsonl", "float_dtype": "bf16",
              "agreement_data": "ids.jsonl", "agreement_batches": 1,
              "grid": [{"prune": {"head_rank": [3, 8]}}, {"prune": {"share_head": True}},
                       {"chain": [{"prune": {"head_rank": 8}}, int4]},
                       {"chain": [{"prune": {"share_head": True}}, {"quantize": {"scheme": "int4", "group_size": 4}}]}]}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, (res.output, res.exception)
    recs = {r["point"]: r for r in read_results(tmp_path / "out")}
    assert set(recs) == {"base", "headrank3", "headrank8", "sharedhead", "headrank8+int4-g4-inc_lm_head",
                         "sharedhead+int4-g4"}
    assert all(r["status"] == "ok" and r["lossless_mismatches"] == 0 for r in recs.values())
    assert all(r["paired"] is not None for p, r in recs.items() if p != "base")
    h, vd = 32, 24
    head16 = 2 * h * vd  # the dense head in bf16
    # points store floats in bf16 (the base as it is, fp32): they differ from each other by their heads only
    assert recs["headrank8"]["bytes"] - recs["sharedhead"]["bytes"] == 2 * 8 * (h + vd)
    assert recs["headrank8"]["bytes"] - recs["headrank3"]["bytes"] == 2 * 5 * (h + vd)
    assert recs["headrank8"]["params"] == recs["base"]["params"] - h * vd + 8 * (h + vd)
    assert recs["sharedhead"]["shared_bytes"] == head16 and recs["headrank8"]["shared_bytes"] == 0
    # a quantized point records the float dtype it stores (bf16 here; its int4 scales are fp32): the shared head's
    # rows are priced in it, as for the float point
    assert recs["sharedhead+int4-g4"]["dtype"] == "bfloat16" and recs["sharedhead+int4-g4"]["shared_bytes"] == head16
    assert recs["headrank8+int4-g4-inc_lm_head"]["bytes"] < recs["headrank8"]["bytes"]
    md = (tmp_path / "out" / "table.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| point"))
    assert header.startswith("| point | bytes | shared | % base@16-bit |")
    shared_row = next(line for line in md.splitlines() if line.startswith("| sharedhead |"))
    assert shared_row.split(" | ")[2] == f"{head16 / 1024:.2f} KiB" if head16 >= 1024 else f"{head16} B"
    rows = {r["point"]: r for r in csv.DictReader(io.StringIO((tmp_path / "out" / "table.csv").read_text()))}
    assert int(rows["sharedhead"]["shared_bytes"]) == head16


def test_tables_without_a_shared_head_have_no_shared_column():
    from specpress.sweep.report import SHARED, headers

    row = {"point": "base", "status": "ok", "shared_bytes": 0}
    assert SHARED not in headers([row]) and SHARED in headers([row, {**row, "shared_bytes": 96}])
