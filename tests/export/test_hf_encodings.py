"""Every scheme of the registry, in every activation mode and method it takes, is either written by `export hf`
(and read back as it was stored) or refused with the format's rule — for --format speculators
(compressed-tensors) and --format modelopt. The cells come from the registry, not from a list here: a scheme
added without its row in EXPECTED fails, so its serving encoding (or refusal) is decided when it is added."""

from __future__ import annotations

import re
from dataclasses import fields, replace

import pytest
import torch
from drafters_common import randomize

from specpress.compress.quantize.api import quantize
from specpress.errors import ConfigError
from specpress.export.hf import export_hf
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.formats.encodings import CT, MODELOPT, encoding
from specpress.models.lm import LMConfig
from specpress.models.quantized.activations import MODES
from specpress.models.quantized.scheme import config_for, schemes

# Linears of in_features 64 / 128: every scheme's group or block (16, 32, 64) divides them
CFG = LMConfig(vocab_size=61, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)
IDS = torch.randint(1, 61, (2, 12), generator=torch.Generator().manual_seed(3))

PRE_QUANT = r"compressed-tensors has no encoding for a pre_quant_scale \(AWQ/SmoothQuant\)"
W = "written"
# (scheme, method, activations[, fp8 granularity]) -> (--format speculators, --format modelopt): written, or the rule
EXPECTED = {
    "int8/rtn/none": (W, W), "int8/rtn/dynamic": (W, "no per-token int8 activations"), "int8/rtn/static": (W, W),
    "int8/gptq/none": (W, W), "int8/gptq/dynamic": (W, "no per-token int8 activations"), "int8/gptq/static": (W, W),
    "int8/smoothquant/dynamic": (PRE_QUANT, "no per-token int8 activations"), "int8/smoothquant/static": (PRE_QUANT, W),
    "int8/bnb/none": ("compressed-tensors has no encoding for a int8 \\(bnb\\)",
                      "ModelOpt's unified checkpoint has no encoding for a int8 \\(bnb\\)"),
    "int4/rtn/none": (W, W), "int4/gptq/none": (W, W), "int4/awq/none": (PRE_QUANT, W),
    "int3/rtn/none": (W, "ModelOpt's unified checkpoint has no encoding for a int3"),
    "int3/gptq/none": (W, "ModelOpt's unified checkpoint has no encoding for a int3"),
    "int2/rtn/none": (W, "ModelOpt's unified checkpoint has no encoding for a int2"),
    "int2/gptq/none": (W, "ModelOpt's unified checkpoint has no encoding for a int2"),
    "ternary/rtn/none": (W, "ModelOpt's unified checkpoint has no encoding for a ternary"),
    "ternary/gptq/none": (W, "ModelOpt's unified checkpoint has no encoding for a ternary"),
    "nf4/bnb/none": ("has no encoding for a nf4", "has no encoding for a nf4"),
    "fp4/bnb/none": ("has no encoding for a fp4", "has no encoding for a fp4"),
    "fp8/rtn/none/channel": (W, W), "fp8/rtn/dynamic/channel": (W, W),
    "fp8/rtn/static/channel": (W, "no per-channel fp8 with a static input_scale"),
    "fp8/rtn/none/tensor": (W, W), "fp8/rtn/dynamic/tensor": (W, W), "fp8/rtn/static/tensor": (W, W),
    "nvfp4/rtn/none": (W, W), "nvfp4/rtn/static": (W, W),
    "mxfp4/rtn/none": (W, "names no MXFP4 quant_algo"), "mxfp4/rtn/dynamic": (W, "names no MXFP4 quant_algo"),
    "mxfp8/rtn/none": (W, "would be served with MX activations"), "mxfp8/rtn/dynamic": (W, W),
}


def label(cfg) -> str:
    g = getattr(cfg, "granularity", None)
    return f"{cfg.scheme}/{cfg.method}/{cfg.act_mode}" + (f"/{g}" if g else "")


def registry_configs() -> dict[str, object]:
    """Every (scheme word, method, activation mode[, granularity]) the registry accepts -> its config."""
    out: dict[str, object] = {}
    for s in schemes():
        for word, methods in s.words.items():
            for method in methods:
                for act in (None, *MODES):
                    try:
                        cfg = config_for(word, method, activations=act)
                    except ConfigError:
                        continue
                    names = {f.name for f in fields(cfg)}
                    variants = [replace(cfg, granularity=g) for g in ("channel", "tensor")] \
                        if "granularity" in names else [cfg]
                    for v in variants:
                        out.setdefault(label(v), v)
    return out


CONFIGS = registry_configs()


def test_every_registry_cell_has_an_expected_outcome():
    assert set(CONFIGS) == set(EXPECTED), (f"cells without an EXPECTED row: {sorted(set(CONFIGS) - set(EXPECTED))}; "
                                           f"rows for no cell: {sorted(set(EXPECTED) - set(CONFIGS))}")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """label -> a saved tiny lm drafter quantized with that cell's config (built on first use)."""
    cache: dict[str, object] = {}
    root = tmp_path_factory.mktemp("cells")

    def get(name: str):
        if name not in cache:
            d = randomize(build_drafter(CFG), 1)
            quantize(d, CONFIGS[name], calibration=lambda m: m(IDS))
            cache[name] = save_drafter(d, root / name.replace("/", "-"))
        return cache[name]

    return get


def _same_stored(a, b, exact: bool) -> None:
    sa, sb = a.public_state_dict(), b.public_state_dict()
    assert sa.keys() == sb.keys(), sorted(set(sa) ^ set(sb))
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape, k
        if exact or not sa[k].dtype.is_floating_point or sa[k].dtype == torch.float8_e4m3fn:
            assert torch.equal(sa[k], sb[k]), k
        else:  # a scale the format stores as its reciprocal: one rounding
            assert torch.allclose(sa[k], sb[k], rtol=2e-7, atol=0), k


@pytest.mark.parametrize("fmt", ["speculators", "modelopt"])
@pytest.mark.parametrize("cell", sorted(EXPECTED))
def test_each_cell_is_written_or_refused_with_the_rule(cell, fmt, sources, tmp_path):
    if cell not in CONFIGS:
        pytest.fail(f"{cell} is no longer a registry cell: drop its EXPECTED row")
    want = EXPECTED[cell][0 if fmt == "speculators" else 1]
    src = sources(cell)
    out = tmp_path / "out"
    if want != W:
        with pytest.raises(ConfigError) as exc:
            export_hf(src, out, fmt)
        assert re.search(want, str(exc.value)), str(exc.value)
        assert ("compressed-tensors" if fmt == "speculators" else "ModelOpt") in str(exc.value)
        assert not out.exists()
        return
    summary = export_hf(src, out, fmt)
    assert summary.scheme == CONFIGS[cell].scheme
    enc = encoding(CT if fmt == "speculators" else MODELOPT, CONFIGS[cell])
    a, b = load_drafter(src), load_drafter(out)
    _same_stored(a, b, enc.exact)
    assert b.provenance == a.provenance
    with torch.no_grad():
        ya, yb = a(IDS).logits, b(IDS).logits
    assert torch.equal(ya, yb) if enc.exact else torch.allclose(ya, yb, rtol=1e-5, atol=1e-5)


def test_a_static_input_scale_is_never_written_weight_only(sources, tmp_path):
    """The cells that store an input_scale carry it into both formats (or are refused): the export's tensors
    hold one per quantized Linear."""
    from safetensors.torch import load_file

    for cell, cfg in CONFIGS.items():
        if cfg.act_mode != "static":
            continue
        for i, fmt in enumerate(("speculators", "modelopt")):
            if EXPECTED[cell][i] != W:
                continue
            out = export_hf(sources(cell), tmp_path / f"{cell.replace('/', '-')}-{fmt}", fmt).out
            keys = load_file(str(out / "model.safetensors"))
            n_in = sum(k.endswith((".input_scale", ".input_global_scale")) for k in keys)
            n_q = len(load_drafter(out).provenance[-1]["quantized"])
            assert n_in == n_q > 0, (cell, fmt, n_in, n_q)


FAMILY_CELLS = {  # the activation / NVFP4 schemes on the families the engines load, through their layouts
    "fp8-static-tensor": lambda: replace(config_for("fp8", activations="static"), granularity="tensor"),
    "int8-static": lambda: config_for("int8", activations="static"),
    "nvfp4-static": lambda: config_for("nvfp4", activations="static", exclude=("down_proj",)),
}


@pytest.mark.parametrize("cell", list(FAMILY_CELLS))
@pytest.mark.parametrize("family,fmt", [("eagle3", "speculators"), ("dflash", "speculators"), ("eagle3", "modelopt"),
                                        ("mtp", "modelopt")])
def test_family_layouts_carry_the_activation_schemes(family, fmt, cell, target, target_dir, tmp_path):
    from drafters_common import make, run

    d = make(family, target)
    quantize(d, FAMILY_CELLS[cell](), calibration=lambda m: run(m, target))
    src = save_drafter(d, tmp_path / "src")
    out = export_hf(src, tmp_path / "out", fmt, verifier=str(target_dir)).out
    a, b = load_drafter(src, target), load_drafter(out, target)
    exact = not (cell.startswith("nvfp4") and fmt == "speculators")
    _same_stored(a, b, exact)
    ya, yb = run(a, target), run(b, target)
    assert torch.equal(ya, yb) if exact else torch.allclose(ya, yb, rtol=1e-5, atol=1e-5)


def test_an_edited_quantization_config_is_refused_on_reading(sources, tmp_path):
    """Our own export is decoded by the recorded scheme's encoding only when the file's config group is the
    one that encoding writes: dropping input_activations (a static drafter made to look weight-only) fails."""
    import json

    from specpress.errors import CheckpointError

    out = export_hf(sources("fp8/rtn/static/tensor"), tmp_path / "out", "speculators").out
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"] = None
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="input_activations.*re-export"):
        load_drafter(out)
