"""Speculative decoding against a compressed target is lossless against that target's own plain decoding, and
bench / run report what the compression changed against the float target."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from drafters_common import CONFIGS, SHAPE, V, make, randomize

from specpress.cli import cli
from specpress.compress.quantize.target import compressed_copy, parse_target_quant
from specpress.models.drafter_io import save_drafter
from specpress.models.lm import LMDrafter
from specpress.models.target import TargetConfig, TargetModel, save_target
from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
from specpress.runtime.compressed_target import greedy_agreement
from specpress.runtime.loop import speculative_generate
from specpress.runtime.plain import decode_plain
from specpress.runtime.policy import parse_policy

TREE = "tree:[[0],[1],[0,0],[1,0],[0,1],[0,0,0]]"
DYN = "dynamic:depth=3,topk=3,budget=8"
CASES = {"eagle": ["chain:3", TREE, DYN], "eagle3": ["chain:3", TREE, DYN], "lm": ["chain:4", TREE, DYN],
         "mtp": ["mtp:3"], "dflash": ["block:4"]}
PROMPTS = [[5, 9, 13, 2, 44, 7], [30, 31, 32, 33, 34, 35, 36, 37, 38], [11, 12]]
# weights + per-token activations + fp8 KV cache; W4A16; W4A4 (static scales without data); the KV cache alone
SPECS = ["fp8:kv=fp8", "int4:group=16", "nvfp4:activations=static,calibration=weights", "none:kv=fp8"]


def float_target(easy: bool = False) -> TargetModel:
    """An 8-layer random target (K = 32 / 64 fits every scheme's blocks) whose head favours a few tokens, so
    that random drafters get drafts accepted; `easy`: one token nearly always (every drafter agrees)."""
    torch.manual_seed(0)
    t = randomize(TargetModel(TargetConfig(**{**SHAPE, "intermediate_size": 64}, num_hidden_layers=8)), 0)
    with torch.no_grad():
        t.model.embed_tokens.weight.normal_(0, 1)
        if easy:
            t.lm_head.weight[1] *= 25.0
        else:
            t.lm_head.weight[1:4] *= 6.0
    return t


def compressed(t: TargetModel, spec: str) -> TargetModel:
    """As run / bench compress it: float64 around the quantizers where the spec rounds activations."""
    return compressed_copy(t, parse_target_quant(spec))[0]


@pytest.fixture(scope="module")
def targets() -> dict[str, TargetModel]:
    f, easy = float_target(), float_target(easy=True)
    return {"float": f, **{spec: compressed(f, spec) for spec in SPECS},
            **{f"easy {spec}": compressed(easy, spec) for spec in SPECS}}


# every policy against the most changed target (weights, activations and KV cache); the tree policies and the
# chained families against W4A16; the dynamic tree against W4A4 (slow: NVFP4's emulated activations) and a
# float target with an fp8 KV cache
LOSSLESS = [(SPECS[0], f, p) for f, ps in CASES.items() for p in ps] + [
    (SPECS[1], "eagle3", DYN), (SPECS[1], "lm", TREE), (SPECS[1], "mtp", "mtp:3"), (SPECS[1], "dflash", "block:4"),
    (SPECS[2], "eagle3", DYN), (SPECS[3], "lm", DYN)]


def drafter_for(family: str, target: TargetModel):
    if family == "lm":  # a noisy copy of the (float) target's weights: agrees often, not always
        d = LMDrafter(CONFIGS["lm"].__class__.from_target_config(target.config))
        src = float_target()
        d.load_state_dict(src.state_dict())
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in d.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.3 * p.std())
        return d.eval().attach_target(target)
    d = make(family, target)
    if family == "eagle3":  # its own head over a reduced vocabulary: favour what the targets favour
        d.set_draft_vocab(torch.arange(24))
        with torch.no_grad():
            d.lm_head.weight[1:4] *= 6.0
    return d


@pytest.mark.parametrize("spec,family,policy", LOSSLESS)
def test_speculative_equals_the_compressed_targets_plain_greedy(targets, spec, family, policy):
    accepted = 0
    for tgt in (targets[spec], targets[f"easy {spec}"]):
        d = drafter_for(family, tgt)
        for prompt in PROMPTS:
            ref = decode_plain(TorchTarget(tgt), prompt, 20, eos_ids=()).tokens
            got = speculative_generate(TorchTarget(tgt), drafter_runner(d), prompt, 20, parse_policy(policy),
                                       eos_ids=())
            assert got.tokens == ref, f"{spec} {family} {policy} prompt {prompt}"
            accepted += sum(r.accepted for r in got.rounds)
    assert accepted > 0, "no draft was ever accepted: the accept path went untested"


@pytest.mark.parametrize("spec", SPECS)
def test_each_compressed_target_decodes_differently(targets, spec):
    """So that the lossless test above compares against the compressed target, not a copy of the float one."""
    ids = torch.randint(1, V, (1, 12), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        logits = []
        for t in (targets[spec], targets["float"]):
            cache = t.new_cache(12)
            logits.append(torch.cat([t(ids[:, i:i + 1], cache=cache).logits for i in range(12)], dim=1))
    assert (logits[0] - logits[1]).abs().max() > 1e-4


def test_greedy_agreement_definition():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9], [1, 2]]
    out = [[1, 2, 3, 4], [5, 6, 0, 8], [8, 9], [1, 2, 3]]  # same; diverges at 2; at 0; longer (EOS missed)
    a = greedy_agreement(ref, out)
    assert a["prefix"] == pytest.approx((1 + 2 / 4 + 0 + 2 / 3) / 4)
    assert a["exact"] == 0.25 and a["exact_prompts"] == 1 and a["prompts"] == 4
    assert a["first_divergence"] == [None, 2, 0, 2] and a["median_first_divergence"] == 2
    same = greedy_agreement(ref, ref)
    assert same["prefix"] == 1.0 and same["exact"] == 1.0 and same["median_first_divergence"] is None
    with pytest.raises(ValueError, match="same prompts"):
        greedy_agreement(ref, out[:2])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("tq")
    t = float_target()
    save_target(t, root / "target")
    save_drafter(drafter_for("eagle3", t), root / "drafter")
    g = torch.Generator().manual_seed(3)
    rows = [{"input_ids": torch.randint(1, V, (6,), generator=g).tolist()} for _ in range(6)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = [{"input_ids": torch.randint(1, V, (300,), generator=g).tolist()} for _ in range(4)]
    (root / "ids.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    return root


def bench(root, *args):
    out = root / f"b{len(list(root.glob('b*.json')))}.json"
    res = CliRunner().invoke(cli, ["bench", "--target", root / "target", "--prompts", root / "prompts.jsonl",
                                   "--max-new-tokens", "16", "--json", out, *map(str, args)])
    assert res.exit_code == 0, (res.output, res.exception)
    return json.loads(out.read_text()), res.output


def test_bench_reports_the_compressed_target_against_the_float_one(saved):
    plain_float, _ = bench(saved, "--drafter", saved / "drafter", "--policy", DYN)
    q, out = bench(saved, "--drafter", saved / "drafter", "--policy", DYN, "--target-quant", "int4:group=16")
    assert q["lossless_mismatches"] == 0 and q["config"]["target_quant"] == "int4:group=16"
    assert q["target_quant"]["label"] == "int4-g16" and q["target_quant"]["quantized"] == 56
    f = q["float_target"]
    assert f["tau"] == plain_float["tau"] and f["per_prompt_tau"] == [p["tau"] for p in plain_float["per_prompt"]]
    assert f["lossless_mismatches"] == 0
    p = q["target_paired"]
    assert p["n"] == 6 and p["delta_tau"] == pytest.approx(
        sum(a["tau"] - b for a, b in zip(q["per_prompt"], f["per_prompt_tau"], strict=True)) / 6)
    assert q["target_retention"] == pytest.approx(q["tau"] / f["tau"])
    a = q["target_agreement"]
    assert a["prompts"] == 6 and a["exact"] < 1  # int4 changes some greedy continuation of this random target
    assert a["prefix"] == greedy_agreement(plain_float["outputs"], q["outputs"])["prefix"]
    assert "plain_outputs" not in q
    assert "greedy output vs the float target" in out and "against the float target: tau" in out


def test_bench_with_a_float_spec_changes_nothing(saved):
    q, _ = bench(saved, "--drafter", saved / "drafter", "--policy", "chain:3", "--target-quant", "none")
    assert q["target_agreement"]["exact"] == 1.0 and q["target_agreement"]["prefix"] == 1.0
    assert q["target_paired"]["delta_tau"] == 0 and q["target_retention"] == 1.0


def test_bench_compare_drafter_is_paired_per_prompt(saved):
    q, _ = bench(saved, "--drafter", saved / "drafter", "--policy", "chain:3", "--compare-drafter", saved / "drafter",
                 "--target-quant", "fp8")
    c = q["compare"]
    assert c["tau"] == q["tau"] and c["paired"]["delta_tau"] == 0 and c["paired"]["n"] == 6
    assert c["lossless_mismatches"] == 0  # against the compressed target, like --drafter's


def test_bench_plain_and_calibrated_target(saved):
    q, out = bench(saved, "--target-quant", "fp8:activations=static", "--target-quant-data", saved / "ids.jsonl")
    assert q["target_quant"]["calibration"]["windows"] == 32 and q["target_quant"]["input_amax"]
    assert q["lossless_mismatches"] == 0 and "target_paired" not in q and q["target_agreement"]["prompts"] == 6


@pytest.mark.parametrize("args,needle", [
    (["--target-quant", "int5"], "unknown scheme 'int5'"),
    (["--target-quant", "nvfp4:activations=static"], "pass --target-quant-data"),
    (["--target-quant-data", "zoo:train"], "pass --target-quant too"),
    (["--target-quant", "fp8", "--target-quant-data", "zoo:train"], "needs no calibration data"),
    (["--target-quant", "fp8", "--target-backend", "onnxruntime"], "drop one of them"),
    (["--target-quant", "fp8", "--compile-target"], "drop --compile-target"),
])
def test_bench_refuses_bad_target_quant_before_loading(tmp_path, args, needle):
    res = CliRunner().invoke(cli, ["bench", "--target", tmp_path / "missing", "--prompts", tmp_path / "p.jsonl",
                                   "--max-new-tokens", "4", *args])
    assert res.exit_code != 0 and needle in str(res.exception), res.exception


def test_run_says_how_far_the_compressed_greedy_output_drifts(saved):
    from drafters_common import save_with_tokenizer

    (saved / "with-tok").mkdir(exist_ok=True)
    tdir, _ = save_with_tokenizer(float_target(), saved / "with-tok")
    res = CliRunner().invoke(cli, ["run", "--target", tdir, "--prompt", "def add(a, b):", "--max-new-tokens", "12",
                                   "--target-quant", "int4:group=16"])
    assert res.exit_code == 0, (res.output, res.exception)
    assert "target int4-g16: 56 Linears quantized" in res.output
    assert "the float target's greedy continuation" in res.output
