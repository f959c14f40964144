"""Export validation on real drafting rounds (export/rounds.py): every family and both attention forms agree
with torch round by round; a corrupted graph that the rounds see fails the export and writes nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")

from specpress.export.rounds import MAX_DISAGREE, RoundsReport, near_tie, ranks_read  # noqa: E402
from specpress.export.validate import ExportValidationError, feed_mask  # noqa: E402
from specpress.manifest import file_records, load_manifest  # noqa: E402
from specpress.runtime.backends.exported import plugin_mask  # noqa: E402
from specpress.runtime.policy import parse_policy  # noqa: E402

# the exports the parity tests share (tests/export/test_loop_parity.py DEFAULT): no export of its own
CASES = [(f, "standard") for f in ("eagle", "eagle3", "mtp", "lm", "dflash", "dflash_markov")] + \
    [("eagle3", "plugin"), ("dflash", "plugin")]


@pytest.mark.parametrize("family,form", CASES)
def test_real_rounds_agree_with_torch_for_every_graph(exported, family, form):
    d, path, rep = exported(family, form)
    r = rep.rounds
    assert r is not None and r.prompts == 3 and r.rounds >= r.prompts
    assert r.disagree == 0, r.summary()
    m = load_manifest(path)
    assert set(r.errors) == {g.name for g in m.graphs}  # every graph ran in the rounds
    assert all(e["max_rel"] <= rep.tolerance for outs in r.errors.values() for e in outs.values())
    assert m.validation_rounds["rounds"] == r.rounds and m.validation_rounds["errors"] == r.errors


def _perturb_one_initializer(directory, graph: str) -> str:
    """Scale the largest float initializer the graph holds itself (not the shared target tensors) by 1.01."""
    import onnx
    from onnx import numpy_helper

    path = str(directory / f"{graph}.onnx")
    model = onnx.load(path, load_external_data=False)
    own = [t for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL
           and t.data_type == onnx.TensorProto.FLOAT]
    t = max(own, key=lambda x: np.prod(x.dims))
    t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(1.01), t.name))
    onnx.save(model, path)
    return t.name


def test_a_graph_corrupted_before_the_rounds_fails_the_export_and_writes_nothing(tmp_path, target, monkeypatch):
    from conftest import make_drafter

    import specpress.export.rounds as rounds
    from specpress.export.onnx import export_onnx

    load, hit = rounds.load_runner, []

    def corrupted(path, *a, **kw):  # after the random-input check passed: the file the rounds load is wrong
        hit.append(_perturb_one_initializer(path, "step"))
        manifest = json.loads((path / "manifest.json").read_text())  # recorded as written: only the rounds can tell
        manifest["files"].update(file_records(path, ["step.onnx"]))
        (path / "manifest.json").write_text(json.dumps(manifest))
        return load(path, *a, **kw)

    monkeypatch.setattr(rounds, "load_runner", corrupted)
    with pytest.raises(ExportValidationError, match=r"real drafting rounds .*step\.(logits|hidden_out)"):
        export_onnx(make_drafter("eagle3", target), tmp_path / "out", target=target)
    assert hit and not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_near_tie_is_a_gap_the_error_can_flip():
    chain, dyn = parse_policy("chain:4"), parse_policy("dynamic:depth=3,topk=3,budget=6")
    assert ranks_read(chain) == 2 and ranks_read(dyn) == 4
    assert ranks_read(parse_policy("tree:[[0],[1],[2],[0,0]]")) == 4
    row = torch.tensor([[5.0, 4.0, 3.0, 2.99999, -1.0]])
    assert not near_tie([(row, 1e-6)], chain)  # top-2 gap 1.0
    assert near_tie([(row, 1e-6)], dyn)  # ranks 3 and 4 are 1e-5 apart, under 1e-4 x 5
    assert near_tie([(row, 0.6)], chain)  # an error of 0.6 can flip a gap of 1.0
    assert not near_tie([(row, 0.4)], chain)


def test_rounds_that_differ_without_a_near_tie_fail():
    ok = RoundsReport("chain:4", 3, 40, 39, 1, {"step": {"logits": {"max_abs": 1e-6, "max_rel": 1e-7}}})
    ok.check(1e-4)
    bad = RoundsReport("chain:4", 3, 40, 39, 0, {"step": {"logits": {"max_abs": 1e-6, "max_rel": 1e-7}}})
    assert bad.disagree == 1 > MAX_DISAGREE * bad.rounds
    with pytest.raises(ExportValidationError, match="1 round"):
        bad.check(1e-4)
    with pytest.raises(ExportValidationError, match="0 rounds"):
        RoundsReport("chain:4", 3, 0, 0, 0, {}).check(1e-4)


def test_feed_mask_reads_back_the_plugin_form():
    gen = torch.Generator().manual_seed(3)
    mask = torch.cat([torch.ones(5, 37, dtype=torch.bool), torch.rand(5, 40, generator=gen) < 0.5], dim=1)
    committed, words = plugin_mask(mask)
    assert torch.equal(feed_mask({"committed": committed, "tree_mask": words}, 5, 77), mask)
    assert torch.equal(feed_mask({"mask": mask}, 5, 77), mask)


def test_export_without_its_target_is_refused_naming_the_fix(tmp_path, target):
    from conftest import make_drafter

    from specpress.errors import RequestError
    from specpress.export.onnx import export_onnx

    with pytest.raises(RequestError, match="pass target="):
        export_onnx(make_drafter("eagle", target), tmp_path / "out")
    assert not (tmp_path / "out").exists()
