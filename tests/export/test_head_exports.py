"""Low-rank and shared draft heads through the product, as a user runs it: prune -> inspect -> bench ->
quantize -> export onnx (validated against torch by the exporter) -> bench on onnxruntime, and export hf
(written where the engines load it, else refused by name or written dense with --materialize-head)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner
from drafters_common import CONFIGS, V, make, randomize, run, saved_target_and_drafter

from specpress.cli import cli
from specpress.compress.prune import PruneConfig, prune
from specpress.errors import RequestError
from specpress.export.hf import export_hf
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.io import tensor_index

VARIANTS = {"rank": ["--head-rank", "4"], "shared": ["--share-head"]}


def _ok(res) -> str:
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res.output


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """(target dir with a tokenizer and an EOS, data file, an EAGLE-3 drafter dir, prompts file)."""
    root = tmp_path_factory.mktemp("heads")
    tdir, data, ddir = saved_target_and_drafter(root)
    prompts = root / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"input_ids": p}) for p in ([5, 9, 13, 2], [30, 31, 32])) + "\n")
    return tdir, data, ddir, prompts


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cli_prune_inspect_bench_quantize_export_bench(variant, inputs, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path / "cache"))
    tdir, data, ddir, prompts = inputs
    invoke = CliRunner().invoke
    p = tmp_path / "p"
    out = _ok(invoke(cli, ["prune", "--drafter", str(ddir), "--out", str(p), *VARIANTS[variant], "--target",
                           str(tdir), "--data", str(data), "--recover-steps", "1", "--seq-len", "16", "--batch", "2"]))
    assert "draft head: 768 -> " in out and ("rank 4 factors" if variant == "rank" else "target's lm_head rows") in out
    info = json.loads(_ok(invoke(cli, ["inspect", str(p), "--json"])))
    assert [s["step"] for s in info["provenance"]] == ["prune", "distill"]
    assert info["provenance"][0]["config"]["head_rank" if variant == "rank" else "share_head"] in (4, True)
    assert (info["shared_bytes"] > 0) == (variant == "shared")
    text = _ok(invoke(cli, ["inspect", str(p)]))
    assert ("768 of the target's head parameters read as the draft head" in text) == (variant == "shared")

    res = tmp_path / "bench.json"
    for policy in ("chain:3", "dynamic:depth=3,topk=2,budget=6"):
        _ok(invoke(cli, ["bench", "--target", str(tdir), "--drafter", str(p), "--prompts", str(prompts),
                         "--max-new-tokens", "10", "--policy", policy, "--json", str(res), "--force"]))
        assert json.loads(res.read_text())["lossless_mismatches"] == 0

    q = tmp_path / "q"
    include = ["--include", "lm_head"] if variant == "rank" else []
    _ok(invoke(cli, ["quantize", "--drafter", str(p), "--out", str(q), "--scheme", "int4", "--group-size", "4",
                     "--method", "gptq", *include, "--target", str(tdir), "--data", str(data), "--seq-len", "16",
                     "--batch", "2", "--calib-batches", "1", "--eval-batches", "1"]))
    quantized = load_drafter(q).provenance[-1]["quantized"]
    assert ({"lm_head.down", "lm_head.up"} <= set(quantized)) == (variant == "rank")

    for src in (p, q):
        onnx_dir = tmp_path / f"onnx-{src.name}"
        _ok(invoke(cli, ["export", "onnx", "--drafter", str(src), "--target", str(tdir), "--out", str(onnx_dir)]))
        manifest = json.loads((onnx_dir / "manifest.json").read_text())
        assert (manifest["shared_file"] is not None)  # the target's embeddings (and, shared, its head)
        _ok(invoke(cli, ["bench", "--target", str(tdir), "--drafter", str(onnx_dir), "--backend", "onnxruntime",
                         "--prompts", str(prompts), "--max-new-tokens", "10", "--policy", "chain:3",
                         "--json", str(res), "--force"]))
        assert json.loads(res.read_text())["lossless_mismatches"] == 0


def test_onnx_heads_and_where_their_bytes_live(target, exported, tmp_path):
    """The shared head's rows are the target's head in target_shared.bin (not the drafter's graph bytes): a
    low-rank or dense head's graph carries its own weights, the shared one's graph does not. Each export
    (eagle3 low rank and shared, lm low rank) passed the exporter's checks against torch."""
    pytest.importorskip("onnxruntime")
    from specpress.export.onnx import ExportOptions, export_onnx

    base = make("eagle3", target)
    dense = exported("eagle3")[2]
    shared = export_onnx(prune(base, PruneConfig(share_head=True)), tmp_path / "s", ExportOptions(), target=target)
    low = export_onnx(prune(base, PruneConfig(head_rank=4)), tmp_path / "r", ExportOptions(), target=target)
    head_bytes = 24 * 32 * 4
    assert shared.graphs["step"] < dense.graphs["step"] - head_bytes + 1024
    assert shared.shared_bytes == dense.shared_bytes + V * 32 * 4  # + the target's head, transposed
    assert low.graphs["step"] < dense.graphs["step"] - (head_bytes - 4 * (24 + 32) * 4) + 1024
    lm = randomize(build_drafter(CONFIGS["lm"]), 1).attach_target(target)
    lm_low = export_onnx(prune(lm, PruneConfig(head_rank=4)), tmp_path / "lm", ExportOptions(), target=target)
    for rep in (shared, low, lm_low):
        assert rep.rounds is not None and max(v["max_rel"] for o in rep.errors.values() for v in o.values()) < 1e-4


def full_vocab_eagle3(target):
    d = randomize(build_drafter(dataclasses.replace(CONFIGS["eagle3"], draft_vocab_size=V)), 4)
    return d.attach_target(target)


def test_export_hf_writes_refuses_or_materializes_by_the_engines_rules(target, target_dir, tmp_path):
    cases = {"rank": prune(make("eagle3", target), PruneConfig(head_rank=4)),
             "shared": prune(make("eagle3", target), PruneConfig(share_head=True)),
             "shared-full": prune(full_vocab_eagle3(target), PruneConfig(share_head=True)),
             "lm-rank": prune(randomize(build_drafter(CONFIGS["lm"]), 1).attach_target(target),
                              PruneConfig(head_rank=4))}
    refused = {"rank": "ParallelLMHead", "shared": "share the target's WHOLE lm_head",
               "lm-rank": "plain HF decoder"}
    for name, d in cases.items():
        src = save_drafter(d, tmp_path / name)
        if name in refused:
            with pytest.raises(RequestError, match=refused[name] + ".*--materialize-head"):
                export_hf(src, tmp_path / f"x-{name}", "speculators", verifier=str(target_dir))
            s = export_hf(src, tmp_path / f"m-{name}", "speculators", verifier=str(target_dir), materialize_head=True)
            assert "wrote a dense lm_head" in s.notes[0] and "larger than the one measured" in s.notes[0]
            assert "lm_head.weight" in tensor_index(s.out)
            assert json.loads((s.out / "config.json").read_text())["specpress"]["materialized_head"] in (
                "low_rank", "shared")
        else:  # the full vocabulary: written without lm_head, which the engines share from the target
            with pytest.raises(RequestError, match="drop the flag"):
                export_hf(src, tmp_path / "y", "speculators", verifier=str(target_dir), materialize_head=True)
            s = export_hf(src, tmp_path / f"m-{name}", "speculators", verifier=str(target_dir))
            assert "no lm_head written" in s.notes[0]
            assert not any(k.startswith("lm_head") for k in tensor_index(s.out))
        back = load_drafter(s.out, target)  # read back by specpress: the same drafter
        assert torch.allclose(run(back, target), run(d, target), atol=1e-5)
        assert (back.lm_head is None) == (name == "shared-full")


def test_export_hf_materializes_quantized_factors_dequantised(target, target_dir, tmp_path):
    """int4 factors multiply back into a float head: the export computes what the quantized drafter did."""
    from specpress.compress.quantize.api import quantize
    from specpress.models.quantized.scheme import config_for

    d = prune(make("eagle3", target), PruneConfig(head_rank=4))
    quantize(d, config_for("int4", group_size=4, include=("lm_head",)))
    src = save_drafter(d, tmp_path / "q")
    s = export_hf(src, tmp_path / "x", "speculators", verifier=str(target_dir), materialize_head=True)
    step = json.loads((s.out / "config.json").read_text())["specpress"]["steps"][-1]
    assert not [n for n in step["quantized"] if n.startswith("lm_head")] and "multiplied back" in step["notes"][-1]
    back = load_drafter(s.out, target)
    assert torch.allclose(run(back, target), run(load_drafter(src, target), target), atol=1e-4)


def test_cli_export_hf_flag(target, target_dir, tmp_path):
    src = save_drafter(prune(make("eagle3", target), PruneConfig(head_rank=4)), tmp_path / "r")
    invoke = CliRunner().invoke
    res = invoke(cli, ["export", "hf", "--drafter", str(src), "--out", str(tmp_path / "x"), "--format",
                       "speculators", "--target", str(target_dir)])
    assert res.exit_code != 0 and "--materialize-head" in str(res.exception) and not (tmp_path / "x").exists()
    out = _ok(invoke(cli, ["export", "hf", "--drafter", str(src), "--out", str(tmp_path / "x"), "--format",
                           "speculators", "--target", str(target_dir), "--materialize-head"]))
    assert "note: wrote a dense lm_head" in out


@pytest.mark.trt
@pytest.mark.parametrize("variant", ["rank", "shared"])
def test_head_exports_build_with_tensorrt_for_rtx(variant, tmp_path):
    """The factor MatMuls and the shared head's Gather of the target's rows parse and build (fp16, plugin form)."""
    from test_trt_exports import _saved_pair

    from specpress.export.onnx import ExportOptions, export_from_dirs
    from specpress.export.trt.builder import BuildOptions, build_engines
    from specpress.export.trt.profiles import Budget
    from specpress.runtime.backends.tensorrt.library import TensorRTUnavailable, load_tensorrt

    try:
        load_tensorrt("tensorrt_rtx")
    except TensorRTUnavailable as exc:
        pytest.skip(f"TensorRT for RTX is not installed ({exc})")
    tdir, ddir = _saved_pair("eagle3", tmp_path)
    d = load_drafter(ddir)
    cfg = PruneConfig(head_rank=8) if variant == "rank" else PruneConfig(share_head=True)
    src = save_drafter(prune(d, cfg), tmp_path / "head")
    export_from_dirs(src, tdir, tmp_path / "onnx", ExportOptions(attention="plugin", dtype="fp16"))
    manifest = build_engines(tmp_path / "onnx", tmp_path / "engines",
                             BuildOptions(budget=Budget(max_tree=32, max_context=128), targets=("sm89",)),
                             echo=lambda _m: None)
    assert set(manifest["engines"]) == {"fuse", "step"}


def test_modelopt_format_follows_the_same_rules(target, tmp_path):
    """TensorRT-LLM's layout: a low-rank head is written dense (excluded from quantization, as ModelOpt keeps
    lm_head) with --materialize-head; a shared head over the whole vocabulary is written without lm_head."""
    from specpress.compress.quantize.api import quantize
    from specpress.models.quantized.scheme import config_for

    low = prune(make("eagle3", target), PruneConfig(head_rank=4))
    shared = prune(full_vocab_eagle3(target), PruneConfig(share_head=True))
    for name, d in (("low", low), ("shared", shared)):
        quantize(d, config_for("fp8", activations="none", include=("lm_head",) if name == "low" else ()))
        src = save_drafter(d, tmp_path / name)
        if name == "low":
            with pytest.raises(RequestError, match="ParallelLMHead"):
                export_hf(src, tmp_path / "x", "modelopt")
        s = export_hf(src, tmp_path / f"m-{name}", "modelopt", materialize_head=name == "low")
        names = set(tensor_index(s.out))
        assert ("lm_head.weight" in names) == (name == "low") and not any(".down." in n or ".up." in n for n in names)
        excluded = json.loads((s.out / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
        assert ("lm_head" in excluded) == (name == "low")
        back = load_drafter(s.out, target)
        assert torch.allclose(run(back, target), run(load_drafter(src, target), target), atol=1e-4)
