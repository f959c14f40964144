"""TensorRT Edge-LLM 0.11.0's own exporter reads what `export hf --for edgellm` writes for an EAGLE-3 drafter (each
scheme it deploys) and a float DFlash one, and the ONNX it writes holds our drafter (export/hf/edgellm.py has the
rules, read from the same wheel).

In the Edge-LLM side interpreter (.ci/edgellm-venv, SPECPRESS_EDGELLM_PYTHON; tests/export/side.py),
`tensorrt-edgellm-export EXPORT OUT` runs on each scheme's export (CPU, about 10 s each; the DFlash draft with
`TARGET OUT --dflash-draft --dflash-draft-dir EXPORT`), and the script reads the ONNX back with onnx 1.19: for
every Gemm it evaluates the weight input's chain (DequantizeLinear, trt::DequantizeLinear with block_size,
TRT_MXFP8DequantizeLinear, Cast) from the initializers, and collects the activation side's scales (QuantizeLinear
/ TRT_FP4DynamicQuantize scales, the pre_quant_scale Mul). For the int4 plugin
(trt_edgellm::Int4GroupwiseGemmPluginV2) it checks the packed weight equals Edge-LLM's own cuteDSL repack
(checkpoint/repacking.py repack_to_cutedsl_fragment) of our int4 codes, and returns its scales.

Checked against specpress: every Linear's weight equals our dequantized weight in float16, with the scales Edge-LLM
holds in float16 rounded so (FP8's weight_scale, AWQ's weight_scale: the export's note says so); every activation
scale equals ours (float16-rounded where Edge-LLM holds it so: FP8's input_scale, the pre_quant_scales; NVFP4's
and INT8's float32 input_scale bit for bit); llm/config.json records our taps; d2t.safetensors maps the draft
vocabulary to our target ids (DFlash: dflash_config our taps, block size, mask token; its lm_head our target's);
the graph's inputs and outputs (names, dtypes, ranks) equal the checked-in contract of 0.11
(edgellm_0.11_eagle3_io.json, edgellm_0.11_dflash_io.json), so a release that changes it fails here.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from drafters_common import run
from engines_common import CELLS, drafter, saved_target, wide_target
from side import EDGELLM_ENV, need_side, run_side

from specpress.compress.quantize.api import quantize
from specpress.errors import RequestError
from specpress.export.hf import export_hf
from specpress.models.drafter_io import save_drafter
from specpress.models.quantized import primitives as P
from specpress.models.quantized.fp8 import Fp8Linear
from specpress.models.quantized.modules import quantized_modules

GOLDEN = {f: Path(__file__).with_name(f"edgellm_0.11_{f}_io.json") for f in ("eagle3", "dflash")}
# cell -> the scheme cell of engines_common (None: float); int4-awq with 4 KV heads, so every Linear it quantizes is
# 64-aligned (Int4GroupwiseGemmPluginV2; a 2-head drafter is refused: test_engine_routes.py)
PROVEN = {"float": None, "fp8": "fp8-tensor-static", "nvfp4": "nvfp4-static", "mxfp8": "mxfp8-dynamic",
          "int8-sq": "int8-smoothquant", "int8-w8a8": "int8-static", "int4-awq": "int4-awq", "int4-rtn": "int4"}
WIDE_KV = {"int4-awq": {"num_key_value_heads": 4}, "int4-rtn": {"num_key_value_heads": 4}}
DFLASH = ("dflash",)  # float only (facets/dflash.py): its base's lm_head, our layers and taps

SIDE = r"""
import json, subprocess, sys
from pathlib import Path
import numpy as np, onnx, torch
from onnx import numpy_helper
from safetensors.torch import load_file
from tensorrt_edgellm.checkpoint.repacking import repack_to_cutedsl_fragment

payload = torch.load(sys.argv[1], weights_only=False)
exe = Path(sys.executable).parent / "tensorrt-edgellm-export"
NP = {1: np.float32, 10: np.float16, 11: np.float64}
out = {}


def name_of(dtype):
    return onnx.TensorProto.DataType.Name(dtype)


def io(values):
    return [[v.name, name_of(v.type.tensor_type.elem_type), len(v.type.tensor_type.shape.dim)] for v in values]


for cell, src in payload["exports"].items():
    dst = Path(payload["tmp"]) / f"onnx-{cell}"
    if cell in payload["dflash"]:  # a DFlash draft is exported beside its base, into dflash_draft/
        args, sub = [payload["target"], str(dst), "--dflash-draft", "--dflash-draft-dir", src], "dflash_draft"
    else:
        args, sub = [src, str(dst)], "llm"
    r = subprocess.run([str(exe), *args], capture_output=True, text=True)
    if r.returncode:
        out[cell] = {"error": (r.stdout[-2000:] + r.stderr[-4000:])}
        continue
    m = onnx.load(str(dst / sub / "model.onnx"))
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    made = {o: n for n in g.node for o in n.output}
    attrs = lambda n: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}

    def array(name):
        return numpy_helper.to_array(inits[name])

    def value(name):
        # the float32 / float16 value of a weight-side tensor: an initializer, or a chain of dequantizing ops
        if name in inits:
            a = array(name)
            return a if a.dtype in (np.float16, np.float32) else a.astype(np.float32)
        n = made[name]
        at = attrs(n)
        if n.op_type == "Cast":
            return value(n.input[0]).astype(NP[at["to"]])
        if n.op_type == "DequantizeLinear":
            x = value(n.input[0]).astype(np.float32)
            s = value(n.input[1])
            dt = NP[at["output_dtype"]] if at.get("output_dtype") else s.dtype
            s = s.astype(np.float32)
            if s.size > 1 and at.get("block_size"):
                s = np.repeat(s, at["block_size"], axis=at.get("axis", 1))
            elif s.size > 1:
                shape = [1] * x.ndim
                shape[at.get("axis", 1)] = -1
                s = s.reshape(shape)
            return (x * s).astype(dt)
        if n.op_type == "TRT_MXFP8DequantizeLinear":
            x = value(n.input[0]).astype(np.float32)
            e = array(n.input[1]).astype(np.int32) - 127
            s = np.repeat(np.ldexp(np.float32(1), e).astype(np.float32), at["block_size"], axis=at.get("axis", -1))
            return (x * s).astype(NP[at["output_dtype"]])
        raise ValueError(f"unexpected op {n.op_type} on a weight path ({name})")

    def leaf(name):
        # the `.weight` initializer a weight chain starts from
        if name in inits:
            return name
        return leaf(made[name].input[0])

    def act(name, found):
        # walk the activation input back through its quantizers, collecting their scales
        n = made.get(name)
        if n is None:
            return found
        if n.op_type in ("QuantizeLinear", "TRT_FP4DynamicQuantize"):
            found.setdefault(n.op_type, []).append(torch.from_numpy(array(n.input[1]).copy()))
        elif n.op_type == "TRT_MXFP8DynamicQuantize":
            found.setdefault(n.op_type, []).append(attrs(n)["block_size"])
        elif n.op_type == "Mul" and n.input[1].endswith("pre_quant_scale"):
            found.setdefault("pre_quant_scale", []).append(torch.from_numpy(array(n.input[1]).copy()))
            return found
        elif n.op_type not in ("DequantizeLinear", "TRT_MXFP8DequantizeLinear", "Cast"):
            return found
        return act(n.input[0], found)

    linears = {}
    for n in g.node:
        if n.op_type == "Gemm":
            w = value(n.input[1])
            if not attrs(n).get("transB", 0):
                w = w.T
            key = leaf(n.input[1])
            linears[key] = {"op": "Gemm", "weight": torch.from_numpy(np.ascontiguousarray(w)),
                            "act": act(n.input[0], {})}
        elif n.op_type == "Int4GroupwiseGemmPluginV2":
            key = n.input[1]
            codes = payload["int4_codes"][cell][key]
            packed = repack_to_cutedsl_fragment(codes.numpy())
            linears[key] = {"op": n.op_type, "repacked_equal": bool(np.array_equal(packed, array(key))),
                            "weight_scale": torch.from_numpy(array(n.input[2]).copy()),
                            "group_size": attrs(n)["group_size"], "act": act(n.input[0], {})}
    d2t = dst / sub / "d2t.safetensors"
    out[cell] = {"inputs": io(g.input), "outputs": io(g.output), "linears": linears,
                 "config": json.loads((dst / sub / "config.json").read_text()),
                 "d2t": load_file(str(d2t))["d2t"] if d2t.exists() else None}
torch.save(out, sys.argv[2])
"""


def onnx_name(public: str) -> str:
    """The initializer name Edge-LLM gives a Linear's weight (midlayer is its layers.0; `_model.` its wrapper)."""
    return "_model." + public.replace("midlayer.", "layers.0.", 1) + ".weight"


def held(m) -> torch.Tensor:
    """Our dequantized weight with the scales Edge-LLM holds in float16 (FP8's per-tensor weight_scale,
    _cast_fp8_linear_scales) rounded so, in float16 as its graph computes."""
    if isinstance(m, Fp8Linear):
        return P.dequantize_fp8(m.weight_fp8, m.scales.half().float(), torch.float32).half()
    return m.dequantize(torch.float32).half()


@pytest.fixture(scope="module")
def read(tmp_path_factory):
    """(per cell: our drafter; Edge-LLM's reading of its export) — every cell in one side-interpreter run."""
    need_side(EDGELLM_ENV)  # before building anything
    tmp = tmp_path_factory.mktemp("edgellm")
    target = wide_target()
    tdir = saved_target(target, tmp)
    drafters, exports, int4 = {}, {}, {}
    for cell, scheme in {**PROVEN, **dict.fromkeys(DFLASH)}.items():
        d = drafter("dflash" if cell in DFLASH else "eagle3", target, **WIDE_KV.get(cell, {}))
        if scheme is not None:
            quantize(d, CELLS[scheme](), calibration=lambda m: run(m, target))
        src = save_drafter(d, tmp / f"src-{cell}")
        exports[cell] = str(export_hf(src, tmp / f"out-{cell}", engine="edgellm", verifier=str(tdir)).out)
        drafters[cell] = d
        if cell.startswith("int4"):
            int4[cell] = {onnx_name(n): m.codes().to(torch.int16) for n, m in quantized_modules(d).items()}
    payload = {"exports": exports, "tmp": str(tmp), "int4_codes": int4, "dflash": DFLASH, "target": str(tdir)}
    got = run_side(SIDE, payload, tmp / "side", env=EDGELLM_ENV)
    return drafters, got, target


@pytest.mark.edgellm
@pytest.mark.parametrize("cell", [*PROVEN, *DFLASH])
def test_edgellm_exports_it_and_the_graph_contract_is_0_11s(cell, read):
    _, got, _ = read
    assert "error" not in got[cell], f"tensorrt-edgellm-export failed on the {cell} export:\n{got[cell]['error']}"
    path = GOLDEN["dflash" if cell in DFLASH else "eagle3"]
    golden = json.loads(path.read_text())
    assert got[cell]["inputs"] == golden["inputs"] and got[cell]["outputs"] == golden["outputs"], (
        f"Edge-LLM's draft graph changed its inputs / outputs (names, dtypes, ranks) from {path.name}: re-read its "
        f"contract before updating the golden")


@pytest.mark.edgellm
@pytest.mark.parametrize("cell", [*PROVEN, *DFLASH])
def test_every_weight_is_ours_and_every_activation_scale(cell, read):
    drafters, got, target = read
    d, res = drafters[cell], got[cell]
    assert "error" not in res, res.get("error")
    q = quantized_modules(d)
    linears = {n: m for n, m in d.named_modules() if isinstance(m, torch.nn.Linear) or n in q}
    if cell in DFLASH:  # DFlash drafts through its target's lm_head, which Edge-LLM takes from the base
        linears["lm_head"] = target.lm_head
    assert set(res["linears"]) == {onnx_name(n) for n in linears}, "a Linear is missing from the graph"
    bad = []
    for name, mod in linears.items():
        r = res["linears"][onnx_name(name)]
        if name not in q:  # float: our weight in float16, read directly by its Gemm
            if not torch.equal(r["weight"], mod.weight.detach().half()):
                bad.append(f"{name}: float weight differs")
            continue
        if r["op"] == "Int4GroupwiseGemmPluginV2":  # our codes in Edge-LLM's own fragment layout, our scales
            if not r["repacked_equal"]:
                bad.append(f"{name}: int4 weight is not our codes repacked")
            if not torch.equal(r["weight_scale"], mod.scales.t().half()) or r["group_size"] != mod.group_size:
                bad.append(f"{name}: int4 scales / group size differ")
        elif not torch.equal(r["weight"], held(mod)):
            diff = (r["weight"].float() - held(mod).float()).abs().max()
            bad.append(f"{name}: dequantized weight differs (max {float(diff):.3g})")
        act = r["act"]
        if mod.pre_quant_scale is not None or "pre_quant_scale" in act:
            want = mod.pre_quant_scale if mod.pre_quant_scale is not None else torch.ones(mod.in_features)
            if [torch.equal(t, want.half()) for t in act.get("pre_quant_scale", [])] != [True]:
                bad.append(f"{name}: pre_quant_scale differs")
        s = mod.input_scale
        if cell == "fp8":
            ok = [t.dtype for t in act.get("QuantizeLinear", [])] == [torch.float16] and \
                torch.equal(act["QuantizeLinear"][0], s.half().reshape(()))
        elif cell in ("int8-sq", "int8-w8a8"):
            ok = [torch.equal(t, s.reshape(())) for t in act.get("QuantizeLinear", [])] == [True]
        elif cell == "nvfp4":
            ok = [torch.equal(t.reshape(()), s.reshape(())) for t in act.get("TRT_FP4DynamicQuantize", [])] == [True]
        elif cell == "mxfp8":
            ok = act.get("TRT_MXFP8DynamicQuantize") == [32]
        else:  # int4: weight-only, the activation reaches the plugin through the pre_quant_scale Mul alone
            ok = set(act) <= {"pre_quant_scale"}
        if not ok:
            bad.append(f"{name}: activation quantization {({k: v for k, v in act.items()})} is not ours ({s})")
    assert not bad, f"{cell}: " + "; ".join(bad)


@pytest.mark.edgellm
@pytest.mark.parametrize("cell", ["float", "nvfp4"])
def test_config_records_our_taps_and_d2t_maps_our_draft_vocabulary(cell, read):
    drafters, got, _ = read
    d, res = drafters[cell], got[cell]
    assert res["config"]["eagle3_config"]["target_layer_ids"] == list(d.taps) == [2, 4, 5]
    assert res["config"]["draft_vocab_size"] == d.config.draft_vocab_size
    ids = d.t2d.nonzero().flatten()  # the target ids of the draft vocabulary, in order
    d2t = res["d2t"]
    assert d2t.dtype == torch.int32 and torch.equal(torch.arange(d2t.numel()) + d2t.long(), ids)


@pytest.mark.edgellm
def test_dflash_config_records_our_taps_block_and_mask(read):
    drafters, got, _ = read
    d, cfg = drafters["dflash"], got["dflash"]["config"]["dflash_config"]
    assert cfg["version"] == 1 and cfg["target_layer_ids"] == list(d.config.target_layer_ids)
    assert (cfg["block_size"], cfg["mask_token_id"]) == (d.config.block_size, d.config.mask_token_id)


# ------------------------------------------------------------------------------------------------- refusals (CPU)


def test_other_taps_are_refused_with_edgellms_rule(tmp_path):
    t = wide_target()
    d = drafter("eagle3", t, target_layer_ids=(1, 4, 6))
    src = save_drafter(d, tmp_path / "src")
    with pytest.raises(RequestError, match=r"layer_indices = \[2, n_layers // 2, n_layers - 3\].*taps \[1, 4, 6\]"):
        export_hf(src, tmp_path / "out", engine="edgellm")
    assert not (tmp_path / "out").exists()


def test_a_float_linear_in_the_draft_layer_is_refused(tmp_path):
    t = wide_target()
    d = drafter("eagle3", t)
    quantize(d, replace(CELLS["nvfp4-static"](), exclude=("midlayer.mlp.down_proj",)), calibration=lambda m: run(m, t))
    src = save_drafter(d, tmp_path / "src")
    with pytest.raises(RequestError, match="no module name.*midlayer.mlp.down_proj are float"):
        export_hf(src, tmp_path / "out", engine="edgellm")


def test_a_quantized_dflash_drafter_is_refused(tmp_path):
    """Only the float DFlash route is proven (above); a quantized one is refused, naming the fix."""
    t = wide_target()
    d = drafter("dflash", t)
    quantize(d, CELLS["nvfp4-static"](), calibration=lambda m: run(m, t))
    src = save_drafter(d, tmp_path / "src")
    with pytest.raises(RequestError, match="Edge-LLM 0.11.0 exports a DFlash draft beside its base.*in float only"):
        export_hf(src, tmp_path / "out", engine="edgellm")


def test_a_shared_head_is_refused(tmp_path):
    """Edge-LLM builds the draft's own lm_head from the draft checkpoint; a drafter sharing the target's (over the
    whole vocabulary, which the other engines take from the target) has none to give it."""
    from specpress.compress.prune import PruneConfig, prune

    t = wide_target()
    d = prune(drafter("eagle3", t, draft_vocab_size=t.config.vocab_size), PruneConfig(share_head=True))
    src = save_drafter(d, tmp_path / "src")
    with pytest.raises(RequestError, match="shares none of the base's: this drafter has no lm_head"):
        export_hf(src, tmp_path / "out", engine="edgellm")


def test_the_export_writes_the_taps_at_the_top_level(tmp_path):
    """Edge-LLM reads target_layer_ids from config.json's top level only (config.py); a float fc / lm_head are
    allowed (they are looked up by name), which this export also writes."""
    t = wide_target()
    d = drafter("eagle3", t)
    quantize(d, replace(CELLS["fp8-tensor-static"](), exclude=("fc",)), calibration=lambda m: run(m, t))
    s = export_hf(save_drafter(d, tmp_path / "src"), tmp_path / "out", engine="edgellm")
    cfg = json.loads((s.out / "config.json").read_text())
    assert cfg["target_layer_ids"] == [2, 4, 5] and "fc" in cfg["quantization_config"]["ignore"]
    assert s.serve.startswith(f"tensorrt-edgellm-export {s.out} ") and "--eagle-base" in s.serve
    assert any("runs the draft in float16" in n for n in s.notes)
