"""A low-rank head's two factors are ordinary Linears: every registered (scheme, method) pair quantizes them
(with --include lm_head; left in full precision without it), and the result reloads, decodes losslessly and
exports to ONNX (validated against torch by the exporter). A shared head stores nothing to quantize."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from drafters_common import V, randomize, save_with_tokenizer

from specpress.cli import cli
from specpress.compress.quantize.api import quantize
from specpress.errors import ConfigError
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.eagle3 import Eagle3Config
from specpress.models.quantized import names as N
from specpress.models.quantized import scheme as S
from specpress.models.quantized.modules import quantized_modules
from specpress.models.quantized.scheme import config_for
from specpress.models.target import TargetConfig, TargetModel

# hidden 64 and rank 32: both factors' in_features (64, 32) are multiples of every scheme's block (<= 32)
WIDE = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=128)
PAIRS = [(n.word, m) for n in N.NAMES for m in n.methods]
FACTORS = {"lm_head.down", "lm_head.up"}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """(target dir with a tokenizer, data file, a low-rank EAGLE-3 drafter dir, prompts file, target)."""
    tmp = tmp_path_factory.mktemp("head_schemes")
    torch.manual_seed(0)
    target = randomize(TargetModel(TargetConfig(**WIDE, num_hidden_layers=8, eos_token_id=0)), 0)
    with torch.no_grad():
        target.lm_head.weight[1] *= 25.0  # favours token 1: a random drafter gets drafts accepted
    tdir, data = save_with_tokenizer(target, tmp)
    d = randomize(build_drafter(Eagle3Config(**WIDE, draft_vocab_size=48, head_rank=32)), 1).attach_target(target)
    d.set_draft_vocab(torch.arange(48))
    prompts = tmp / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"input_ids": p}) for p in ([5, 9, 13, 2], [30, 31, 32])) + "\n")
    return tdir, data, save_drafter(d, tmp / "lowrank"), prompts, target


def _ok(res) -> str:
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res.output


@pytest.mark.parametrize("word,method", PAIRS, ids=[f"{w}-{m}" for w, m in PAIRS])
def test_every_scheme_quantizes_the_factors(word, method, wide, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path / "cache"))
    tdir, data, ddir, prompts, target = wide
    invoke = CliRunner().invoke
    q = tmp_path / "q"
    try:  # groups of 32 where the scheme takes a group size (its default may not divide the rank)
        S.config_for(word, method, group_size=32)
        group = ["--group-size", "32"]
    except ConfigError:
        group = []
    _ok(invoke(cli, ["quantize", "--drafter", str(ddir), "--out", str(q), "--scheme", word, "--method", method,
                     *group, "--include", "lm_head", "--target", str(tdir), "--data", str(data), "--seq-len", "16",
                     "--batch", "2", "--calib-batches", "2", "--eval-batches", "1"]))
    d = load_drafter(q, target)
    mods = quantized_modules(d)
    cfg = S.config_from_dict(d.provenance[-1]["config"])
    assert FACTORS <= set(mods) and all(isinstance(mods[n], S.scheme_of(cfg).modules) for n in FACTORS)
    res = tmp_path / "bench.json"
    _ok(invoke(cli, ["bench", "--target", str(tdir), "--drafter", str(q), "--prompts", str(prompts),
                     "--max-new-tokens", "10", "--policy", "chain:3", "--json", str(res)]))
    assert json.loads(res.read_text())["lossless_mismatches"] == 0
    _ok(invoke(cli, ["export", "onnx", "--drafter", str(q), "--target", str(tdir), "--out", str(tmp_path / "onnx")]))


def test_factors_stay_in_full_precision_unless_included(wide):
    _, _, ddir, _, target = wide
    d = load_drafter(ddir, target)
    quantize(d, config_for("int8"))
    skipped = {s["module"]: s["reason"] for s in d.provenance[-1]["skipped"]}
    assert FACTORS <= set(skipped) and all("draft head" in skipped[n] for n in FACTORS)
    assert not FACTORS & set(quantized_modules(d))


def test_a_shared_head_has_nothing_to_include(wide):
    from specpress.compress.prune import PruneConfig, prune

    _, _, ddir, _, target = wide
    dense = randomize(build_drafter(Eagle3Config(**WIDE, draft_vocab_size=48)), 1).attach_target(target)
    shared = prune(dense, PruneConfig(share_head=True))
    with pytest.raises(ConfigError, match="--include 'lm_head' matches no Linear"):
        quantize(shared, config_for("int4", group_size=32, include=("lm_head",)))
    quantize(shared, config_for("int4", group_size=32))
    assert not any(n.startswith("lm_head") for n in quantized_modules(shared))
