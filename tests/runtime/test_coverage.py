"""Draft-vocabulary coverage on the evaluation prompts: bench's JSON, summary line and warning."""

from __future__ import annotations

import numpy as np
import torch
from drafters_common import make

from specpress.compress.prune import PruneConfig, prune
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.runtime.coverage import calibration_coverage, coverage_warning, eval_coverage

from test_bench_cli import bench_json, setup

POLICY = ["--policy", "dynamic:depth=3,topk=3,budget=8", "--max-new-tokens", "16"]


def test_eval_coverage_counts_emitted_tokens_in_the_token_map():
    assert eval_coverage([[1, 2, 3], [9]], torch.tensor([2, 9, 40])) == 0.5
    assert eval_coverage([[1, 2]], None) is None and eval_coverage([[]], torch.tensor([1])) is None
    assert coverage_warning(0.90, 0.95) and coverage_warning(0.93, 0.95) is None and coverage_warning(0.9, None) is None


def test_bench_reports_coverage_of_the_emitted_tokens(tmp_path):
    target, tdir, ddir, prompts = setup(tmp_path)
    d, out = bench_json(tmp_path, ["--target", str(tdir), "--drafter", str(ddir), "--prompts", str(prompts), *POLICY])
    vocab = set(load_drafter(ddir, target).to_target_ids(torch.arange(24)).tolist())
    emitted = [t for o in d["outputs"] for t in o]
    assert d["eval_coverage"] == round(sum(t in vocab for t in emitted) / len(emitted), 6)
    assert d["calibration_coverage"] is None  # no prune --vocab chose this vocabulary
    assert f"covers {100 * d['eval_coverage']:.1f} % of the emitted tokens" in " ".join(out.split())


def test_full_vocabulary_drafter_has_no_coverage(tmp_path):
    _, tdir, ddir, prompts = setup(tmp_path, family="eagle")
    d, out = bench_json(tmp_path, ["--target", str(tdir), "--drafter", str(ddir), "--prompts", str(prompts),
                                   "--max-new-tokens", "8"])
    assert d["eval_coverage"] is None and "emitted tokens" not in out


def test_bench_warns_when_the_prompts_differ_from_the_ranking_data(tmp_path):
    """A vocabulary ranked on data made only of its own tokens covers 100 % of that data; the target's output on
    the prompts (dominated by token 1, kept out of the vocabulary) is mostly outside it: bench warns."""
    target, tdir, _, prompts = setup(tmp_path)
    base = make("eagle3", target)
    ids = [t for t in base.to_target_ids(torch.arange(24)).tolist() if t != 1][:6]
    stream = np.array(ids * 400, dtype=np.int64)
    pruned = prune(base, PruneConfig(vocab=6, vocab_source="data", vocab_tokens=2048), calib=stream)
    assert calibration_coverage(pruned.provenance) == 1.0
    pdir = save_drafter(pruned, tmp_path / "pruned")
    d, out = bench_json(tmp_path, ["--target", str(tdir), "--drafter", str(pdir), "--prompts", str(prompts), *POLICY])
    text = " ".join(out.split())
    assert d["calibration_coverage"] == 1.0 and d["eval_coverage"] < 0.97
    assert "calibration coverage 100.0 %" in text and "warning: the draft vocabulary covers" in text
    assert "more than 3 points lower" in text

