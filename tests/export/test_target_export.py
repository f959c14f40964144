"""`export target`: the target's forward as one ONNX graph, its OnnxTarget runner, and the whole loop in
onnxruntime (the drafter's export and the target's), checked against plain decoding of the torch target."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("onnxruntime")
import torch
from cli_common import run_main
from click.testing import CliRunner

from specpress.cli import cli
from specpress.errors import CheckpointError, RequestError
from specpress.export.target import TargetExportOptions, export_target, random_case
from specpress.export.validate import TOLERANCE, ExportValidationError
from specpress.manifest import load_target_manifest
from specpress.models.drafter import get_family
from specpress.runtime.backends.onnxruntime.runner import load_runner, load_target_runner
from specpress.runtime.backends.torch.runner import TorchTarget
from specpress.runtime.loop import speculative_generate
from specpress.runtime.plain import decode_plain
from specpress.runtime.policy import parse_policy
from specpress.runtime.sampling import SamplingParams

PROMPTS = [[3, 5, 7, 9], [11, 2, 40, 17, 8, 1], [59, 58]]


@pytest.fixture(scope="module")
def target_export(tmp_path_factory, target):
    out = tmp_path_factory.mktemp("target") / "export"
    return out, export_target(target, out)


def test_export_is_validated_and_described(target_export, target):
    out, rep = target_export
    m = load_target_manifest(out)
    cfg = target.config
    assert m.layers == cfg.num_hidden_layers and m.kv_heads == cfg.num_key_value_heads and m.config == cfg.to_hf()
    outs = {t.name for t in m.outputs}
    assert {"logits", "hidden"} | {f"hidden_states.{i}" for i in range(m.layers)} <= outs
    assert all(e["max_rel"] <= TOLERANCE["fp32"] for e in rep.errors.values()) and len(rep.errors) == len(outs)
    assert rep.decode["agree"] + rep.decode["near_ties"] == rep.decode["prompts"] and rep.decode["differ"] == 0
    assert m.validation_decode == rep.decode
    params = sum(p.numel() for p in target.parameters())
    data = (out / m.data_file).stat().st_size  # the fp32 weights, once (norm vectors and constants stay inline)
    assert 0.97 * 4 * params <= data <= 4 * params and rep.bytes == data + (out / m.file).stat().st_size


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_tied_head_reads_the_embedding_where_it_lies(tmp_path, target, dtype):
    """Tied embeddings (Llama-3.2-1B, Qwen3-0.6B...): the head is a Gemm with transB over the stored embedding,
    written once. A Transpose of a weight would have onnxruntime fold a transposed copy at load (V x H; in fp32
    at the 1B shape 0.98 GiB held, and more while folding); the export still validates against torch."""
    import dataclasses

    import onnx

    from drafters_common import randomize
    from specpress.models.target import TargetModel

    torch.manual_seed(0)
    tied = randomize(TargetModel(dataclasses.replace(target.config, tie_word_embeddings=True)), 1)
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    rep = export_target(tied, tmp_path / "tied", TargetExportOptions(dtype=dtype))
    assert rep.decode["differ"] == 0
    m = load_target_manifest(tmp_path / "tied")
    params = sum(p.numel() for p in tied.parameters())  # counts the shared embedding once
    assert (tmp_path / "tied" / m.data_file).stat().st_size <= {"fp32": 4, "fp16": 2}[dtype] * params
    graph = onnx.load(str(tmp_path / "tied" / m.file), load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    assert not [n for n in graph.node if n.op_type == "Transpose" and set(n.input) & weights]
    assert any(n.op_type == "Gemm" and n.input[1] in weights for n in graph.node)


def test_runner_returns_what_the_torch_target_returns(target_export, target):
    """A prefill then a tree step with taps, through OnnxTarget and through torch, from empty caches."""
    ot = load_target_runner(target_export[0])
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    taps = (0, 3, target.config.num_hidden_layers)
    caches = [target.new_cache(16), ot.new_cache(16)]
    outs = [target(ids, cache=caches[0], taps=taps), ot.forward(ids, cache=caches[1], taps=taps)]
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    mask = torch.cat([torch.ones(3, 6, dtype=torch.bool), mask], dim=1)
    step = torch.tensor([[7, 1, 2]])
    pos = torch.tensor([6, 7, 7])
    outs += [target(step, cache=caches[0], positions=pos, mask=mask, taps=taps, logits="last"),
             ot.forward(step, cache=caches[1], positions=pos, mask=mask, taps=taps, logits="last")]
    for a, b in ((outs[0], outs[1]), (outs[2], outs[3])):
        torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=1e-4)
        assert set(b.taps) == set(taps)
        for i in taps:
            torch.testing.assert_close(b.taps[i], a.taps[i], atol=1e-4, rtol=1e-4)
    assert outs[3].logits.shape[1] == 1 and caches[1].length == caches[0].length == 9
    torch.testing.assert_close(caches[1].k[:, :, :, :9], caches[0].k[:, :, :, :9], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name, policy", [("eagle3", "dynamic:depth=3,topk=2,budget=6"), ("dflash", None),
                                          ("mtp", None), ("eagle", "tree:[[0],[1],[0,0],[0,1]]"), ("lm", None)])
def test_whole_loop_in_onnxruntime_is_lossless(target_export, target, exported, name, policy):
    """Drafter and target both in onnxruntime: greedy speculative decoding emits what plain greedy decoding of
    the onnxruntime target emits (the lossless rule), and what the torch target emits (fp32, no near ties here)."""
    ot = load_target_runner(target_export[0])
    drafter = load_runner(exported(name)[1], target)
    pol = parse_policy(policy or get_family(name).default_policy)
    rounds = 0
    for p in PROMPTS:
        s = speculative_generate(ot, drafter, p, 20, pol, eos_ids=())
        plain = decode_plain(TorchTarget(target), p, 20, eos_ids=()).tokens
        assert s.tokens == decode_plain(ot, p, 20, eos_ids=()).tokens == plain
        rounds += len(s.rounds)
    if name != "lm":  # the random lm drafter shares nothing with the target and is never accepted
        assert rounds < 3 * 19  # drafts were accepted (cache compaction ran): fewer verify forwards than tokens


def test_sampling_through_the_onnxruntime_target_matches_torch(target_export, target, exported):
    """Sampling: same seed, same target distribution up to fp32 rounding -> the same tokens as the torch loop."""
    ot = load_target_runner(target_export[0])
    drafter = load_runner(exported("eagle3")[1], target)
    pol, params = parse_policy("chain:3"), SamplingParams(temperature=0.8)
    for p in PROMPTS:
        a = speculative_generate(TorchTarget(target), drafter, p, 16, pol, params, torch.Generator().manual_seed(1),
                                 eos_ids=())
        b = speculative_generate(ot, drafter, p, 16, pol, params, torch.Generator().manual_seed(1), eos_ids=())
        assert a.tokens == b.tokens


def test_bad_inputs_are_refused_clearly(target_export, exported, target, tmp_path):
    ot = load_target_runner(target_export[0])
    with pytest.raises(RequestError, match="outside the target's hidden states"):
        ot.forward(torch.tensor([[1]]), cache=ot.new_cache(4), taps=(99,))
    with pytest.raises(CheckpointError, match="drafter's export"):
        load_target_runner(exported("eagle3")[1])
    with pytest.raises(RequestError, match="--dtype 'bf16'"):
        TargetExportOptions(dtype="bf16")
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "mine.txt").write_text("x")
    with pytest.raises(RequestError, match="--force"):
        export_target(target, keep)
    assert [p.name for p in keep.iterdir()] == ["mine.txt"]


def test_over_tolerance_writes_nothing(tmp_path, target, monkeypatch):
    import specpress.export.target as exp

    monkeypatch.setitem(exp.TOLERANCE, "fp32", 0.0)  # the graph differs from torch by a rounding error
    with pytest.raises(ExportValidationError, match="target"):
        export_target(target, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_random_case_exercises_the_cache_and_a_tree(target):
    feeds, want = random_case(target)
    assert feeds["past_key.0"].shape[2] == 5 and not bool(feeds["mask"][:, 5:].all())  # a past, and a real tree
    assert want["present_key.0"].shape[2] == 11


def test_bench_runs_the_whole_loop_in_onnxruntime(tmp_path, target, monkeypatch):
    from conftest import bench_inputs

    tdir, ddir, prompts = bench_inputs(tmp_path, target, "eagle3", monkeypatch)
    base = ["bench", "--target", str(tdir), "--drafter", str(ddir), "--prompts", str(prompts),
            "--max-new-tokens", "8", "--policy", "chain:3"]
    outs = {}
    for tb in ("torch", "onnxruntime", "onnxruntime"):
        res = CliRunner().invoke(cli, base + ["--backend", "onnxruntime", "--target-backend", tb,
                                              "--json", str(tmp_path / f"{tb}.json"), "--force"])  # rerun: replace
        assert res.exit_code == 0, res.output
        outs[tb] = json.loads((tmp_path / f"{tb}.json").read_text())
    assert "cached at" in res.output and len(list((tmp_path / "cache" / "onnx-target").iterdir())) == 1
    got = outs["onnxruntime"]
    assert got["config"]["target_backend"] == "onnxruntime"
    assert got["config"]["target_provider"] == "CPUExecutionProvider"
    assert got["lossless_mismatches"] == 0 and got["outputs"] == outs["torch"]["outputs"]
    for bad, why in ((["--compile-target"], "--compile-target"), (["--dtype", "bf16"], "fp32 or fp16")):
        res = run_main(*base, "--target-backend", "onnxruntime", *bad)
        assert res.exit_code == 2 and why in res.stderr  # the command line alone is wrong
