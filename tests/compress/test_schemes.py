"""The scheme registry: its rules, and every registered scheme through every consumer.

Each (scheme word, method) pair names.py lists runs through the CLI as a user would: quantize (with the
target and data, so calibrated methods calibrate) -> inspect -> bench (lossless against plain decoding)
-> export onnx (validated against torch by the exporter) -> bench on the export with onnxruntime. A
scheme added later is covered by adding its file and its row in names.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from drafters_common import V, randomize, save_with_tokenizer

from specpress.cli import cli
from specpress.errors import ConfigError
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.eagle3 import Eagle3Config
from specpress.models.quantized import names as N
from specpress.models.quantized import scheme as S
from specpress.models.quantized.modules import quantized_modules
from specpress.models.target import TargetConfig, TargetModel

# every Linear's in_features (fc 192, q/k/v and down 128, o / gate / up / head 64) is a multiple of 64, so
# each scheme's default group or block size applies
WIDE = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=128)
PAIRS = [(n.word, m) for n in N.NAMES for m in n.methods]
# every pair at its default, plus the other activation modes and calibration settings each scheme takes
CASES = [(w, m, ()) for w, m in PAIRS] + [
    ("fp8", "rtn", ("--activations", "none")),
    ("fp8", "rtn", ("--activations", "static")),
    ("fp8", "rtn", ("--activations", "static", "--act-calibration", "percentile:99.9", "--calib-inputs", "first-step")),
    ("int8", "rtn", ("--activations", "dynamic")),
    ("int8", "rtn", ("--activations", "static", "--act-calibration", "mse")),
    ("int8", "smoothquant", ("--activations", "dynamic")),
    ("nvfp4", "rtn", ("--activations", "static")),
    ("nvfp4", "rtn", ("--activations", "static", "--act-calibration", "fixed:2688")),
    ("mxfp4", "rtn", ("--activations", "none")),
    ("mxfp8", "rtn", ("--activations", "none")),
    ("fp8", "rtn", ("--kv-cache", "fp8")),
]


def test_names_table_is_the_registry():
    """names.py (torch-free, the CLI's choices) and the registered schemes answer the same pairs, each pair
    one scheme, registered from the file names.py gives it."""
    S.load_all()
    registered = {(w, m): s for s in S.schemes() for w, ms in s.words.items() for m in ms}
    assert set(registered) == set(PAIRS)
    for word, method in PAIRS:
        scheme, _ = S.for_words(word, method)
        assert scheme is registered[word, method]
        assert N.BY_WORD[word].methods[method] == scheme.make_config.__module__
        cfg = S.config_for(word, method)
        assert S.scheme_of(cfg) is scheme and cfg.scheme == word and cfg.method == method
        assert S.config_from_dict(cfg.to_dict()) == cfg
        assert cfg.label() and 0 < scheme.tolerance < 1


def test_every_scheme_lowers_to_onnx():
    from specpress.export.quant import load_lowerings

    load_lowerings()
    assert [s.name for s in S.schemes() if S.facet("onnx", s) is None] == []


def test_registration_fails_loudly():
    s = S.schemes()[0]
    with pytest.raises(ValueError, match="registered twice"):
        S.register_scheme(s)
    with pytest.raises(ValueError, match="names.py does not list"):
        S.register_scheme(S.Scheme(name="toy", words={"int4": ("toy",)}, configs=(), modules=(),
                                   make_config=s.make_config, quantize=s.quantize, restore=s.restore, tolerance=0.1))
    with pytest.raises(ValueError, match="names.py gives --scheme int8 --method rtn to"):
        S.register_scheme(S.Scheme(name="toy", words={"int8": ("rtn",)}, configs=(), modules=(),
                                   make_config=lambda w, m, x: None, quantize=s.quantize, restore=s.restore,
                                   tolerance=0.1))
    with pytest.raises(ValueError, match="facet of scheme 'toy' is registered twice"):
        S.register_facet("onnx", "toy")(object())
        S.register_facet("onnx", "toy")(object())
    with pytest.raises(ConfigError, match="unknown scheme 'int5'; choose one of int8, int4"):
        S.config_for("int5")
    with pytest.raises(ConfigError, match="unknown quantize config 'hqq'; known: .*gptq"):
        S.config_from_dict({"name": "hqq"})


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """(target dir with a tokenizer, data file, an EAGLE-3 drafter dir, prompts file), made once."""
    tmp = tmp_path_factory.mktemp("schemes")
    torch.manual_seed(0)
    target = randomize(TargetModel(TargetConfig(**WIDE, num_hidden_layers=8, eos_token_id=0)), 0)
    with torch.no_grad():
        target.lm_head.weight[1] *= 25.0  # a target that favours token 1, so a random drafter gets drafts accepted
    tdir, data = save_with_tokenizer(target, tmp)
    d = randomize(build_drafter(Eagle3Config(**WIDE, draft_vocab_size=24)), 1).attach_target(target)
    d.set_draft_vocab(torch.arange(24))
    with torch.no_grad():
        d.lm_head.weight[1] *= 25.0
    ddir = save_drafter(d, tmp / "eagle3")
    prompts = tmp / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"input_ids": p}) for p in ([5, 9, 13, 2], [30, 31, 32])) + "\n")
    return tdir, data, ddir, prompts, target


def _ok(res) -> str:
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res.output


@pytest.mark.parametrize("word,method,extra", CASES, ids=[f"{w}-{m}" + "".join(x.strip("-").replace(":", "")
                                                                              for x in e) for w, m, e in CASES])
def test_every_scheme_through_every_consumer(word, method, extra, wide, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path / "cache"))
    tdir, data, ddir, prompts, target = wide
    run = CliRunner().invoke
    q = tmp_path / "q"
    out = _ok(run(cli, ["quantize", "--drafter", str(ddir), "--out", str(q), "--scheme", word, "--method", method,
                        "--include", "lm_head", "--target", str(tdir), "--data", str(data), "--seq-len", "16",
                        "--batch", "2", "--calib-batches", "2", "--eval-batches", "1", *extra]))
    assert "acc@k after" in out
    opts = dict(zip(extra[0::2], extra[1::2]))
    cfg = S.config_for(word, method, include=("lm_head",), activations=opts.get("--activations"),
                       act_calibration=opts.get("--act-calibration"), kv_cache=opts.get("--kv-cache"))
    d = load_drafter(q, target)
    step = d.provenance[-1]
    assert S.config_from_dict(step["config"]) == cfg and step["scheme"] == word and step["method"] == method
    assert d.kv_cache_format == cfg.kv_cache == step.get("kv_cache", "none")
    mods = quantized_modules(d)
    assert set(mods) == set(step["quantized"]) and "lm_head" in mods
    assert all(isinstance(m, S.scheme_of(cfg).modules) and m.act_mode == cfg.act_mode for m in mods.values())
    assert step["bytes_after"] < step["bytes_before"]
    if cfg.act_mode == "static":
        assert set(step["input_amax"]) == set(mods) and all(float(m.input_scale) > 0 for m in mods.values())

    info = json.loads(_ok(run(cli, ["inspect", str(q), "--json"])))
    assert info["quantization"]["scheme"] == word and info["bytes"] <= step["bytes_after"] + 1024
    text = _ok(run(cli, ["inspect", str(q)]))
    assert cfg.storage_label() in text and info["quantization"]["activations"] == cfg.act_mode
    if cfg.act_mode != "none" or word in ("fp8", "nvfp4", "mxfp4", "mxfp8"):
        assert "saves bytes, not time" in text

    res = tmp_path / "bench.json"
    _ok(run(cli, ["bench", "--target", str(tdir), "--drafter", str(q), "--prompts", str(prompts),
                  "--max-new-tokens", "12", "--policy", "chain:3", "--json", str(res)]))
    torch_run = json.loads(res.read_text())
    assert torch_run["lossless_mismatches"] == 0 and torch_run["tau"] >= 1.0

    onnx_dir = tmp_path / "onnx"
    out = _ok(run(cli, ["export", "onnx", "--drafter", str(q), "--target", str(tdir), "--out", str(onnx_dir)]))
    manifest = json.loads((onnx_dir / "manifest.json").read_text())
    assert manifest["quantization"]["schemes"] == [word]
    assert manifest["quantization"]["tolerances"] == {word: S.scheme_of(cfg).tolerance}
    _ok(run(cli, ["bench", "--target", str(tdir), "--drafter", str(onnx_dir), "--backend", "onnxruntime",
                  "--prompts", str(prompts), "--max-new-tokens", "12", "--policy", "chain:3", "--json", str(res),
                  "--force"]))  # replaces the torch run's file
    assert json.loads(res.read_text())["lossless_mismatches"] == 0
