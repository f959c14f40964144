"""Every scheme of the registry x every engine: `export hf --for ENGINE` writes an EAGLE-3 drafter the engine loads
(its loading rules: test_vllm_rules.py, test_sglang_rules.py, test_trtllm_rules.py; speculators' own code:
test_speculators_loads.py) or refuses it with the engine's rule, before writing anything. The cells come from
the registry (test_hf_encodings.registry_configs), so a scheme added without its row here fails. README's
"Serve a compressed drafter" table is this one. Also: every family x engine (routes, and refusals where none)."""

from __future__ import annotations

import json

import pytest
from cli_common import run_main
from drafters_common import run
from engines_common import drafter, saved_target, wide_target
from test_hf_encodings import CONFIGS as REGISTRY

from specpress.compress.quantize.api import quantize
from specpress.errors import ConfigError, RequestError, UsageError
from specpress.export.hf import export_hf
from specpress.export.hf.engines import ENGINES
from specpress.models.drafter_io import load_drafter, save_drafter

W = "loads"
PRE_V = "vLLM 0.34 reads a quantized drafter as compressed-tensors"
PRE_S = "not (awq|smoothquant)'s pre_quant_scale"
NO_MX = "SGLang 0.5.23 has no compressed-tensors scheme for mx"
SQ = "unsupported quant mode"
PER_TOKEN_INT8 = "no per-token int8 activations"
BNB = "has no encoding for a"
LOW_S = "SGLang 0.5.23's compressed-tensors weight-only scheme takes 4- and 8-bit weights"
INT3_V = "the two layouts disagree for 3 bits"
# TensorRT Edge-LLM 0.11.0 (export/hf/edgellm.py; its own exporter runs on the exports: test_edgellm_exports.py)
E_NVFP4_A16 = "cannot export quant_algo W4A16_NVFP4"
E_W8A16 = "cannot export quant_algo W8A16"
E_PC_PT = "cannot export quant_algo FP8_PER_CHANNEL_PER_TOKEN"
E_ALIGN = "which needs out and in features divisible by 64"  # k/v_proj [32, 128] here; 64-wide ones load
# refused by the engine's own rule (RequestError); the others by the serving format's encoding (ConfigError)
ENGINE_RULES = {PRE_V, PRE_S, NO_MX, SQ, LOW_S, INT3_V, "no W4A16_NVFP4 QuantAlgo", "no MXFP8 QuantAlgo",
                E_NVFP4_A16, E_W8A16, E_PC_PT, E_ALIGN}
# cell -> (vllm, sglang (fc kept in float), trtllm, edgellm): loads, or the rule it is refused with
EXPECTED = {
    "int8/rtn/none": (W, W, W, E_W8A16), "int8/gptq/none": (W, W, W, E_W8A16),
    "int8/rtn/dynamic": (W, W, PER_TOKEN_INT8, PER_TOKEN_INT8),
    "int8/gptq/dynamic": (W, W, PER_TOKEN_INT8, PER_TOKEN_INT8),
    "int8/rtn/static": (W, W, SQ, W), "int8/gptq/static": (W, W, SQ, W),
    "int8/smoothquant/dynamic": (PRE_V, PRE_S, PER_TOKEN_INT8, PER_TOKEN_INT8),
    "int8/smoothquant/static": (PRE_V, PRE_S, SQ, W),
    "int8/bnb/none": (BNB, BNB, BNB, BNB),
    "int4/rtn/none": (W, W, W, E_ALIGN), "int4/gptq/none": (W, W, W, E_ALIGN),
    "int4/awq/none": (PRE_V, PRE_S, W, E_ALIGN),
    "nf4/bnb/none": (BNB, BNB, BNB, BNB), "fp4/bnb/none": (BNB, BNB, BNB, BNB),
    "fp8/rtn/none/channel": (W, W, W, E_PC_PT), "fp8/rtn/dynamic/channel": (W, W, W, E_PC_PT),
    "fp8/rtn/static/channel": (W, W, "no per-channel fp8 with a static input_scale",
                               "no per-channel fp8 with a static input_scale"),
    "fp8/rtn/none/tensor": (W, W, W, E_PC_PT), "fp8/rtn/dynamic/tensor": (W, W, W, E_PC_PT),
    "fp8/rtn/static/tensor": (W, W, W, W),
    "nvfp4/rtn/none": (W, W, "no W4A16_NVFP4 QuantAlgo", E_NVFP4_A16), "nvfp4/rtn/static": (W, W, W, W),
    "mxfp4/rtn/none": (W, NO_MX, "names no MXFP4 quant_algo", "names no MXFP4 quant_algo"),
    "mxfp4/rtn/dynamic": (W, NO_MX, "names no MXFP4", "names no MXFP4"),
    "mxfp8/rtn/none": (W, NO_MX, "would be served with MX activations", "would be served with MX activations"),
    "mxfp8/rtn/dynamic": (W, NO_MX, "no MXFP8 QuantAlgo", W),
    **{f"{s}/{m}/none": (W, LOW_S, BNB, BNB) for s in ("int2", "ternary") for m in ("rtn", "gptq")},
    "int3/rtn/none": (INT3_V, LOW_S, BNB, BNB), "int3/gptq/none": (INT3_V, LOW_S, BNB, BNB),
}
ENGINE_ORDER = ("vllm", "sglang", "trtllm", "edgellm")


def test_every_registry_cell_has_an_outcome_per_engine():
    assert set(REGISTRY) == set(EXPECTED), (f"cells without a row: {sorted(set(REGISTRY) - set(EXPECTED))}; rows "
                                            f"for no cell: {sorted(set(EXPECTED) - set(REGISTRY))}")
    assert tuple(ENGINES) == ENGINE_ORDER


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routes")
    t = wide_target()
    return t, saved_target(t, tmp)


@pytest.mark.parametrize("cell", sorted(EXPECTED))
def test_each_engine_loads_or_refuses_each_scheme(cell, setting, tmp_path):
    from dataclasses import replace

    t, tdir = setting
    for engine, want in zip(ENGINE_ORDER, EXPECTED[cell], strict=True):
        d = drafter("eagle3", t)
        cfg = REGISTRY[cell]
        if engine == "sglang":
            cfg = replace(cfg, exclude=("fc",))
        quantize(d, cfg, calibration=lambda m: run(m, t))
        src = save_drafter(d, tmp_path / f"{engine}-src")
        out = tmp_path / engine
        if want == W:
            s = export_hf(src, out, engine=engine, verifier=str(tdir))
            assert s.serve and s.engine == ENGINES[engine].read_from
            back = load_drafter(out, target=t)  # specpress reads the engine's form back
            assert back.config.hidden_size == d.config.hidden_size
        else:
            with pytest.raises(RequestError if want in ENGINE_RULES else ConfigError, match=want):
                export_hf(src, out, engine=engine, verifier=str(tdir))
            assert not out.exists(), f"{engine}: a refused export left {out}"


# family -> (vllm, sglang, trtllm, edgellm) for a float drafter: the layout written, or the rule
FAMILIES = {
    "eagle3": ("speculators eagle3", "public eagle3", "public eagle3", "public eagle3"),
    "dflash": ("speculators dflash", "public dflash", "public dflash", "public dflash"),
    "eagle": ("public eagle", "public eagle", "registers EAGLE-3 draft models only",
              "recognises an EAGLE draft only as EAGLE-3"),
    "lm": ("hf llama", "hf llama", "hf llama", "has no draft-model mode"),
    "mtp": ("MTP routes load the MTP layers of the target's own architecture",) * 4,
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_has_its_route_or_the_engines_rule(family, setting, tmp_path):
    from drafters_common import CONFIGS as SMALL
    from drafters_common import make

    t, tdir = setting
    small = family not in ("eagle3", "dflash", "eagle", "lm")
    for engine, want in zip(ENGINE_ORDER, FAMILIES[family], strict=True):
        if small:  # mtp: its own config (the wide set covers the routed families)
            from drafters_common import tiny_target

            d, verifier = make(family, tiny_target()), None
            assert SMALL[family]
        else:
            d, verifier = drafter(family, t), str(tdir)
        src = save_drafter(d, tmp_path / f"{engine}-src")
        if " " in want and want.split()[0] in ("speculators", "public", "hf"):
            s = export_hf(src, tmp_path / engine, engine=engine, verifier=verifier)
            assert s.layout == want
            cfg = json.loads((s.out / "config.json").read_text())
            assert cfg["specpress"]["exported_as"].startswith(engine)
        else:  # the engine has no route for the family: its rule, a RequestError (exit 1)
            with pytest.raises(RequestError, match=want):
                export_hf(src, tmp_path / engine, engine=engine, verifier=verifier)


def test_for_and_format_that_disagree_are_refused(setting, tmp_path):
    """A --format the engine writes for no family is a command-line error (UsageError, exit 2); one it writes for
    other families only is refused for this drafter (RequestError, exit 1)."""
    t, tdir = setting
    src = save_drafter(drafter("eagle3", t), tmp_path / "src")
    with pytest.raises(UsageError, match="--for vllm never writes the --format modelopt layout"):
        export_hf(src, tmp_path / "o", "modelopt", engine="vllm", verifier=str(tdir))
    with pytest.raises(RequestError, match="--for sglang writes SGLang's own form of a eagle3 drafter") as err:
        export_hf(src, tmp_path / "o", "speculators", engine="sglang", verifier=str(tdir))
    assert not isinstance(err.value, UsageError) and not (tmp_path / "o").exists()
    s = export_hf(src, tmp_path / "o2", "speculators", engine="vllm", verifier=str(tdir))
    assert s.layout == "speculators eagle3"


def test_the_command_prints_how_to_serve_and_refuses_in_one_line(setting, tmp_path):
    from click.testing import CliRunner

    from specpress.cli import cli
    from specpress.models.quantized.scheme import config_for

    t, tdir = setting
    d = drafter("eagle3", t)
    quantize(d, config_for("int4", group_size=32))
    src = save_drafter(d, tmp_path / "src")
    ok = CliRunner().invoke(cli, ["export", "hf", "--drafter", str(src), "--out", str(tmp_path / "v"), "--for", "vllm",
                                  "--target", str(tdir)])
    assert ok.exit_code == 0, ok.output
    assert f"for vLLM 0.34.0: vllm serve {tdir} --speculative-config" in ok.output and '"method": "eagle3"' in ok.output
    bad = run_main("export", "hf", "--drafter", src, "--out", tmp_path / "s", "--for", "sglang", "--target", tdir)
    lines = bad.stderr.strip().splitlines()  # the engine refuses this drafter: exit 1, one line, no usage hint
    assert bad.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and "--exclude fc" in lines[0]
    assert not (tmp_path / "s").exists()
    neither = run_main("export", "hf", "--drafter", src, "--out", tmp_path / "n")  # the command line alone: exit 2
    assert neither.exit_code == 2 and "--for ENGINE" in neither.stderr and "Try 'specpress export hf --help'" in \
        neither.stderr
    assert not (tmp_path / "n").exists()
