"""A whole sweep on a real-target-shaped recipe, at tiny scale: a .gguf target converted on first use, chat data
the target writes itself (`regenerate: {self_instruct: N}`), MT-bench-style questions as chat prompts, and GPTQ
calibrated on the drafter's own data (`calibration: drafter-data`). Every point lossless."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from specpress.cli import cli
from specpress.sweep.results import read_results
from gguf_common import write_tiny_gguf

pytest.importorskip("gguf")


def test_chat_sweep_on_a_gguf_target(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path / "cache"))
    write_tiny_gguf(tmp_path / "t.gguf")
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"question_id": i, "turns": [t, "again"]}) + "\n" for i, t in
                                              enumerate(["Write a poem.", "What is 2+2?", "Name a color."])))
    recipe = {"target": "t.gguf", "prompts": {"questions": "q.jsonl", "n": 2}, "policies": ["chain:3"],
              "max_new_tokens": 8, "calibration": "drafter-data", "agreement_batches": 0, "dtype": "fp32",
              "drafter": {"distill": {"family": "eagle3", "steps": 2, "batch": 2, "seq_len": 16, "eval_batches": 1,
                                      "draft_vocab": 200, "taps": [0, 1, 2],
                                      "regenerate": {"self_instruct": 6, "new_tokens": 40, "query_tokens": 120,
                                                     "batch": 8}}},
              "grid": [{"quantize": {"scheme": "int4", "group_size": 32, "method": "gptq"}}]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "out")])
    import traceback
    assert res.exit_code == 0, (res.output, "".join(traceback.format_exception(*res.exc_info)))
    rows = {r["point"]: r for r in read_results(tmp_path / "out")}
    assert set(rows) == {"base", "int4-g32-gptq"} and all(r["status"] == "ok" for r in rows.values())
    assert all(r["lossless_mismatches"] == 0 for r in rows.values())
    data = list((tmp_path / "cache" / "regenerated").glob("*.jsonl"))
    assert len(data) == 1 and all("<|im_start|>assistant\n" in json.loads(x)["text"]
                                  for x in data[0].read_text().splitlines())
    assert len(list((tmp_path / "cache" / "gguf").iterdir())) == 1  # converted once, into the cache
    base = json.loads(next((tmp_path / "cache" / "drafters").glob("*/config.json")).read_text())
    assert base["specpress"]["steps"][0]["data"]["source"] == f"self-instruct ({data[0].name})"
