"""quantize --budget: a scheme per Linear under a byte budget. The budget is respected exactly (as inspect
counts bytes), the allocation is deterministic, sensitivity ranks a high-variance Linear first, a mixed
artifact round-trips bit-exactly, decodes losslessly and exports to ONNX; export hf refuses it; the CLI and
the sweep's `budget` key."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from drafters_common import (
    V,
    lm_sweep_inputs,
    make,
    random_eos_target,
    randomize,
    run,
    save_with_tokenizer,
    tiny_target,
)

from specpress.cli import cli
from specpress.compress.data import WindowSampler
from specpress.compress.quantize.budget import (
    BudgetError,
    KLProbe,
    allocate,
    parse_budget,
    parse_candidates,
    quantize_to_budget,
    sensitivities,
)
from specpress.errors import RequestError, UsageError
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.inspect import inspect_artifact
from specpress.models.quantized.integer import IntLinear
from specpress.models.quantized.modules import quantized_modules
from specpress.models.quantized.scheme import config_for
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.loop import speculative_generate
from specpress.runtime.plain import decode_plain
from specpress.runtime.policy import parse_policy

STREAM = np.random.default_rng(0).integers(1, V, size=600).astype(np.int32)
CANDS = "int8,int4:g8,float"
SELECT = config_for("int8", include=("lm_head",))


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def probe(target, d):
    return KLProbe(target, d, WindowSampler(STREAM, 24, 2, 0), 2)


def budgeted(target, budget: str, measure: str = "kl", cands: str = CANDS, seed: int = 1):
    d = make("eagle3", target, seed)
    return quantize_to_budget(d, SELECT, parse_candidates(cands), parse_budget(budget), float_dtype=torch.bfloat16,
                              measure=measure, probe=probe(target, d) if measure == "kl" else None)


def test_parse_budget_and_candidates():
    assert parse_budget("1500000").nbytes == 1_500_000 and parse_budget("1.5MB").nbytes == 1_500_000
    assert parse_budget("1.5MiB").nbytes == 1_572_864 and parse_budget("900 KiB").nbytes == 921_600
    assert parse_budget("4.5bpp").bpp == 4.5 and parse_budget("4.5bpp").total(100, 1000) == 100 + 562
    for bad in ("", "1.5 parsecs", "-3MB", "0bpp", "MiB"):
        with pytest.raises(UsageError, match="--budget"):
            parse_budget(bad)
    cands = parse_candidates("int8, int4:g64, int8:bnb, nf4:g32, fp8, float")
    assert [c.label for c in cands[:3]] == ["int8", "int4-g64", "int8-bnb"] and cands[-1].config is None
    for bad, msg in (("int8", "at least two"), ("int8,int8", "at least two"), ("int9,int8", "unknown scheme"),
                     ("int4:q7,int8", "neither a group size"), ("int4:gptq,int8", "calibration"),
                     ("int4:awq,int8", "drop :awq")):
        with pytest.raises(UsageError, match=msg):
            parse_candidates(bad)


@pytest.mark.parametrize("budget", ["15KiB", "17KiB", "19KiB", "21KiB", "23KiB", "9bpp"])
def test_budget_is_respected_exactly_as_inspect_counts(target, budget, tmp_path):
    d = budgeted(target, budget)
    step = d.provenance[-1]
    a = step["allocation"]
    assert step["bytes_after"] == a["measured_bytes"] == a["predicted_bytes"] <= a["budget_bytes"]
    if budget.endswith("KiB"):
        assert a["budget_bytes"] == int(budget[:-3]) * 1024
    assert a["min_bytes"] <= a["measured_bytes"] <= a["max_bytes"]
    # no single further upgrade fits: the allocation spent what the budget allows
    spare = a["budget_bytes"] - a["measured_bytes"]
    for n, lab in a["choice"].items():
        assert all(a["bytes"][n][o] - a["bytes"][n][lab] > spare or a["scores"][n][o] >= a["scores"][n][lab]
                   for o in a["bytes"][n])
    out = save_drafter(d, tmp_path / "d", dtype=torch.bfloat16)
    assert inspect_artifact(out)["bytes"] == step["bytes_after"]


def test_infeasible_budget_names_the_smallest_size(target):
    d = budgeted(target, "64KiB", cands="int8,int4:g8")  # the largest: int8 everywhere
    smallest = d.provenance[-1]["allocation"]["min_bytes"]
    with pytest.raises(BudgetError, match=f"stores {smallest:,} bytes"):
        budgeted(target, f"{smallest - 1}", cands="int8,int4:g8")
    assert budgeted(target, f"{smallest}", cands="int8,int4:g8").provenance[-1]["bytes_after"] == smallest
    with pytest.raises(BudgetError, match="nothing to quantize"):
        budgeted(target, "1MiB")  # float everywhere fits


def test_allocation_is_deterministic(target):
    a, b = (budgeted(target, "14KiB").provenance[-1]["allocation"] for _ in range(2))
    assert a["choice"] == b["choice"] and a["scores"] == b["scores"] and a["bytes"] == b["bytes"]
    assert len(set(a["choice"].values())) > 1  # a real mix, not a uniform answer


def test_allocate_takes_the_best_gain_per_byte_and_stops_at_the_limit():
    sizes = {"a": {"lo": 10, "hi": 20}, "b": {"lo": 10, "hi": 20}, "c": {"lo": 10, "hi": 30}}
    scores = {"a": {"lo": 1.0, "hi": 0.0}, "b": {"lo": 5.0, "hi": 0.0}, "c": {"lo": 9.0, "hi": 0.0}}
    order = ("lo", "hi")
    assert allocate(sizes, scores, 100, 130, order) == {"a": "lo", "b": "lo", "c": "lo"}
    assert allocate(sizes, scores, 100, 140, order) == {"a": "lo", "b": "hi", "c": "lo"}  # 0.5/B beats 0.45/B
    assert allocate(sizes, scores, 100, 160, order) == {"a": "lo", "b": "hi", "c": "hi"}
    assert allocate(sizes, scores, 100, 999, order) == {"a": "hi", "b": "hi", "c": "hi"}
    with pytest.raises(BudgetError, match="stores 130 bytes"):
        allocate(sizes, scores, 100, 129, order)


ATTN = [f"midlayer.self_attn.{p}_proj" for p in "qkvo"]


def _gains(target, d, measure):
    cands = parse_candidates("int8,int4:g8")
    names = [n for n, m in d.named_modules() if isinstance(m, torch.nn.Linear)]
    sizes, scores, _ = sensitivities(d, names, cands, measure=measure, float_dtype=torch.bfloat16,
                                     probe=probe(target, d) if measure == "kl" else None)
    gain = {n: (scores[n]["int4-g8"] - scores[n]["int8"]) / (sizes[n]["int8"] - sizes[n]["int4-g8"]) for n in names}
    return sizes, scores, sorted(gain, key=gain.get, reverse=True)


def _room_for(sizes, upgrades):
    """Bytes of int4 everywhere plus int8 for `upgrades`."""
    return sum(s["int8"] if n in upgrades else s["int4-g8"] for n, s in sizes.items())


def test_weight_sensitivity_gives_a_high_variance_linear_the_bits_first(target):
    d = make("eagle3", target)
    with torch.no_grad():
        d.get_submodule("midlayer.mlp.up_proj").weight.mul_(6.0)
    sizes, scores, ranked = _gains(target, d, "weight")
    assert ranked[0] == "midlayer.mlp.up_proj", ranked
    choice = allocate(sizes, scores, 0, _room_for(sizes, {"midlayer.mlp.up_proj"}), ("int8", "int4-g8"))
    assert choice["midlayer.mlp.up_proj"] == "int8" and list(choice.values()).count("int8") == 1


@pytest.mark.parametrize("seed", [1, 2])
def test_kl_sensitivity_spends_no_bits_on_a_silenced_branch(target, seed):
    """Relative quantization error does not change with a weight's scale, so KL ranks by what the draft
    distribution depends on: with o_proj scaled to ~0, the attention branch barely reaches the output and its
    four Linears rank last; an allocation with room for five upgrades gives them none."""
    d = make("eagle3", target, seed)
    with torch.no_grad():
        d.get_submodule("midlayer.self_attn.o_proj").weight.mul_(1e-3)
    sizes, scores, ranked = _gains(target, d, "kl")
    assert set(ranked[-4:]) == set(ATTN), ranked
    choice = allocate(sizes, scores, 0, _room_for(sizes, set(ranked[:5])), ("int8", "int4-g8"))
    assert all(choice[n] == "int4-g8" for n in ATTN) and list(choice.values()).count("int8") == 5


def test_mixed_artifact_round_trips_and_decodes_losslessly(target, tmp_path):
    d = budgeted(target, "14KiB")
    step = d.provenance[-1]
    assert step["scheme"] == "mixed" and set(step["module_configs"]) == set(step["quantized"])
    kinds = {type(m).__name__ for m in quantized_modules(d).values()}
    assert kinds == {"IntLinear"} and {m.bits for m in quantized_modules(d).values()} == {4, 8}
    out = save_drafter(d, tmp_path / "mixed", dtype=torch.bfloat16)
    back = load_drafter(out, target)
    assert back.provenance == d.provenance
    mine, theirs = quantized_modules(d), quantized_modules(back)
    assert mine.keys() == theirs.keys()
    for n in mine:
        assert mine[n].bits == theirs[n].bits and torch.equal(mine[n].dequantize(), theirs[n].dequantize())
    assert torch.equal(run(d, target), run(back, target))
    info = inspect_artifact(out)["quantization"]
    assert {m["scheme"] for m in info["modules"].values()} == {"int8", "int4-g8"}
    for prompt in ([5, 9, 13, 2, 44, 7], [30, 31, 32, 33, 34, 35]):
        ref = decode_plain(TorchTarget(target), prompt, 20, eos_ids=()).tokens
        got = speculative_generate(TorchTarget(target), drafter_runner(back), prompt, 20, parse_policy("chain:3"),
                                   eos_ids=())
        assert got.tokens == ref


def test_mixed_artifact_exports_to_onnx_and_export_hf_refuses_it(target, tmp_path):
    pytest.importorskip("onnxruntime")
    from specpress.export.hf.api import export_hf
    from specpress.export.onnx import export_onnx

    base = make("eagle", target)  # intermediate 64: every K a multiple of 16
    d = randomize(type(base)(dataclasses.replace(base.config, intermediate_size=64)), 1).attach_target(target)
    quantize_to_budget(d, config_for("int8"), parse_candidates("int8,int4:g16"), parse_budget("7bpp"),
                       float_dtype=None, measure="weight")
    assert d.provenance[-1]["scheme"] == "mixed"
    rep = export_onnx(d, tmp_path / "onnx", target=target)
    assert rep.quantization["schemes"] and max(e["max_rel"] for e in rep.errors["step"].values()) <= rep.tolerance
    art = save_drafter(d, tmp_path / "mixed")
    with pytest.raises(RequestError, match="mixes quantization schemes per Linear"):
        export_hf(art, tmp_path / "hf", "speculators")


def test_cli_budget(tmp_path):
    t = random_eos_target()
    tdir, data = save_with_tokenizer(t, tmp_path)
    src = save_drafter(make("eagle3", t), tmp_path / "e3")
    small = ["--target", str(tdir), "--data", str(data), "--seq-len", "16", "--batch", "2", "--calib-batches", "2",
             "--eval-batches", "2"]
    out = tmp_path / "e3-b"
    args = ["quantize", "--drafter", str(src), "--out", str(out), "--budget", "18KiB", "--candidates", CANDS,
            "--include", "lm_head"]
    res = CliRunner().invoke(cli, [*args, *small])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "budget  18KiB = 18,432 B" in res.output and "kl sensitivity" in res.output
    d = load_drafter(out, t)
    step = d.provenance[-1]
    assert step["allocation"]["sensitivity"] == "kl" and step["calibration"]["windows"] == 4
    assert inspect_artifact(out)["bytes"] == step["bytes_after"] <= 18 * 1024
    assert any(isinstance(m, IntLinear) for m in quantized_modules(d).values())
    res = CliRunner().invoke(cli, ["inspect", str(out)])
    assert res.exit_code == 0 and "budget 18KiB" in res.output, res.output
    base = ["quantize", "--drafter", str(src), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(cli, [*base, "--budget", "18KiB", "--scheme", "int4"])
    assert isinstance(res.exception, UsageError) and "drop --scheme" in str(res.exception)
    res = CliRunner().invoke(cli, base)
    assert isinstance(res.exception, UsageError) and "--budget SIZE" in str(res.exception)
    res = CliRunner().invoke(cli, [*base, "--budget", "18KiB", "--candidates", "int8,int4:g8", "--sensitivity", "kl"])
    assert isinstance(res.exception, UsageError) and "--sensitivity weight" in str(res.exception)
    res = CliRunner().invoke(cli, [*base, "--budget", "1KiB", "--candidates", "int8,int4:g8"])
    assert isinstance(res.exception, BudgetError) and "smallest allocation" in str(res.exception)
    assert not (tmp_path / "o").exists()


def test_sweep_budget_key():
    from specpress.errors import ConfigError
    from specpress.sweep.grid import expand_grid

    points, _ = expand_grid([{"quantize": {"budget": ["1MiB", "4.5bpp"], "candidates": ["int8", "int4:g64"]}},
                             {"quantize": {"budget": "2MB", "candidates": "int8,int4:g128,float",
                                           "sensitivity": "weight", "include": ["lm_head"]}}])
    ids = [p.id for p in points]
    assert ids == ["base", "budget1MiB-int8_int4-g64", "budget4.5bpp-int8_int4-g64",
                   "budget2MB-int8_int4-g128_float-weight-inc_lm_head"]
    step = points[1].steps[0]
    budget, cands, measure = step.budget()
    assert step.is_budget and budget.nbytes == 1024 ** 2 and [c.label for c in cands] == ["int8", "int4-g64"]
    assert measure == "kl" and step.config().include == ()
    for bad, msg in (({"budget": "1MiB", "scheme": "int4"}, "drop scheme"),
                     ({"scheme": "int4", "candidates": ["int8"]}, "go with `budget`"),
                     ({"budget": "1MiB", "sensitivity": "acc"}, "sensitivity 'acc'"),
                     ({"budget": "lots"}, "--budget 'lots'")):
        with pytest.raises((ConfigError, UsageError), match=msg):
            expand_grid([{"quantize": bad}])


def test_a_sweep_point_allocates_under_its_budget(tmp_path):
    import yaml

    from specpress.sweep.results import read_results

    lm_sweep_inputs(tmp_path, prompts=4)
    recipe = {"target": "target", "drafter": "drafter", "prompts": "prompts.jsonl", "policies": ["chain:3"],
              "max_new_tokens": 8, "calibration": "ids.jsonl", "agreement_data": "ids.jsonl", "agreement_batches": 1,
              "grid": [{"quantize": {"budget": "10bpp", "candidates": ["int8", "int4:g8", "float"],
                                     "calib_batches": 2, "seq_len": 32, "batch": 2}}]}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, (res.output, res.exception)
    row = next(r for r in read_results(tmp_path / "out") if r["point"] != "base")
    assert row["point"] == "budget10bpp-int8_int4-g8_float-cb2-sl32-bt2" and row["lossless_mismatches"] == 0
    step = row["provenance"][-1]
    a = step["allocation"]
    assert a["sensitivity"] == "kl" and step["calibration"]["windows"] == 4
    assert row["bytes"] == a["measured_bytes"] <= a["budget_bytes"] and len(set(a["choice"].values())) > 1
