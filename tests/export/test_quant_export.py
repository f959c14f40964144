"""Quantized drafters exported as stored: each scheme x format gives the graph node it should, matches
the torch quantized drafter through onnxruntime, and shrinks the graph; what has no form is refused."""

from __future__ import annotations

import dataclasses

import onnx
import pytest

pytest.importorskip("onnxruntime")
import torch

from specpress.errors import RequestError
from specpress.export.onnx import ExportOptions, export_onnx

# (scheme, group, symmetric, format) -> the op the Linears become
CASES = {
    ("int4", 16, True, "matmulnbits"): "MatMulNBits",
    ("int4", 16, False, "matmulnbits"): "MatMulNBits",
    ("int4", 8, True, "matmulnbits"): "DequantizeLinear",  # block 8 < 16: Q/DQ fallback
    ("int4", 32, True, "qdq"): "DequantizeLinear",
    ("int4", 16, False, "qdq"): "DequantizeLinear",
    ("int8", None, True, "matmulnbits"): "DequantizeLinear",  # 8-bit: Q/DQ in both formats (faster on CPU)
    ("int8", None, False, "qdq"): "DequantizeLinear",
    ("fp8", None, None, "matmulnbits"): "DequantizeLinear",
    ("int2", 16, True, "matmulnbits"): "MatMulNBits",  # 2-bit MatMulNBits
    ("int2", 16, False, "matmulnbits"): "MatMulNBits",  # with 2-bit zero points
    ("ternary", 16, None, "matmulnbits"): "MatMulNBits",  # as 2-bit codes, zero point 2
    ("int3", 16, True, "matmulnbits"): "DequantizeLinear",  # no 3-bit MatMulNBits: codes held in int4
    ("int3", 16, False, "qdq"): "DequantizeLinear",
    ("int2", 16, True, "qdq"): "DequantizeLinear",
    ("ternary", 16, None, "qdq"): "DequantizeLinear",
    ("nf4", 32, None, "matmulnbits"): "MatMulBnb4",
    ("fp4", 32, None, "matmulnbits"): "MatMulBnb4",
}
DEFAULT = [("int4", 16, True, "matmulnbits"), ("int4", 8, True, "matmulnbits"), ("int8", None, True, "matmulnbits"),
           ("fp8", None, None, "matmulnbits"), ("nf4", 32, None, "matmulnbits"), ("int2", 16, False, "matmulnbits"),
           ("ternary", 16, None, "matmulnbits"), ("int3", 16, True, "matmulnbits")]


def quantized_eagle(target, scheme, group, symmetric):
    from drafters_common import make, randomize

    from specpress.compress.quantize.api import quantize
    from specpress.models.drafter import build_drafter
    from specpress.models.quantized.scheme import config_for

    base = make("eagle", target)  # intermediate 64: every Linear's K is a multiple of 16 and 32
    d = randomize(build_drafter(dataclasses.replace(base.config, intermediate_size=64)), 1).attach_target(target)
    if scheme in ("nf4", "fp4"):
        pytest.importorskip("bitsandbytes")
    return quantize(d, config_for(scheme, group_size=group, symmetric=symmetric))


def run_case(tmp_path, target, key):
    scheme, group, sym, fmt = key
    d = quantized_eagle(target, scheme, group, sym)
    rep = export_onnx(d, tmp_path / "q", ExportOptions(quant_format=fmt), target=target)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "q" / "step.onnx"), load_external_data=False).graph.node}
    assert CASES[key] in ops, ops
    assert rep.quantization["schemes"] == [scheme] and len(rep.quantization["linears"]) == 8
    assert max(e["max_rel"] for e in rep.errors["step"].values()) <= rep.tolerance
    return d, rep


@pytest.mark.parametrize("key", DEFAULT, ids=lambda k: "-".join(map(str, k)))
def test_quantized_export_default(tmp_path, target, key):
    _, rep = run_case(tmp_path, target, key)
    float_rep = export_onnx(_float_eagle(target), tmp_path / "f", target=target)
    assert rep.graphs["step"] < float_rep.graphs["step"]  # the codes are stored, not dequantized floats


def _float_eagle(target):
    from drafters_common import make, randomize

    from specpress.models.drafter import build_drafter

    base = make("eagle", target)
    return randomize(build_drafter(dataclasses.replace(base.config, intermediate_size=64)), 1).attach_target(target)


@pytest.mark.slow
@pytest.mark.parametrize("key", [k for k in CASES if k not in DEFAULT], ids=lambda k: "-".join(map(str, k)))
def test_quantized_export_matrix(tmp_path, target, key):
    run_case(tmp_path, target, key)


@pytest.mark.parametrize("key", [("int4", 16, True, "matmulnbits"), ("fp8", None, None, "matmulnbits"),
                                 ("int4", 32, True, "qdq"), ("int8", None, True, "matmulnbits"),
                                 ("int2", 16, False, "matmulnbits"), ("ternary", 16, None, "matmulnbits"),
                                 ("int3", 16, True, "matmulnbits")],
                         ids=lambda k: "-".join(map(str, k)))
def test_runner_drafts_with_the_quantized_graph(tmp_path, target, key):
    from specpress.runtime.backends.onnxruntime.runner import load_runner

    d, _ = run_case(tmp_path, target, key)  # DequantizeLinear weights are folded at load (fold_dequantize)
    runner = load_runner(tmp_path / "q", target, "cpu")
    ids = torch.randint(0, 61, (1, 6), generator=torch.Generator().manual_seed(2))
    hidden = target(ids).hidden
    with torch.no_grad():
        lt, _ = d(hidden[:, :-1], ids[:, 1:], cache=d.new_cache(16))
    lo, _ = runner.feature_step(hidden[:, :-1], ids[:, 1:], runner.new_cache(16), None, None)
    # int4 in groups of 32+ runs aten's int4 kernel in torch (bf16 activations: IntLinear.forward); the graph
    # computes the exact fp32 dequantization, so those two agree to bf16 precision only. int8 rounds like
    # torch's kernel on both sides, but the two sum in different orders: a product within an ulp of a bf16
    # rounding boundary can land on either side (one bf16 ulp, ~4e-3 relative, in ~1e-4 of the outputs)
    tol = 1e-2 if key[0] == "int8" or key[0] == "int4" and key[1] >= 32 else 1e-4
    torch.testing.assert_close(lo, lt, atol=tol, rtol=tol)


def test_nf4_has_no_qdq_form(tmp_path, target):
    d = quantized_eagle(target, "nf4", 32, None)
    with pytest.raises(RequestError, match="matmulnbits"):
        export_onnx(d, tmp_path / "q", ExportOptions(quant_format="qdq"), target=target)
    assert not (tmp_path / "q").exists()


@pytest.mark.slow
def test_bitsandbytes_int8_rows_become_qdq(tmp_path, target):
    pytest.importorskip("bitsandbytes")
    from specpress.compress.quantize.api import quantize
    from specpress.models.quantized.scheme import config_for

    d = quantize(_float_eagle(target), config_for("int8", "bnb"))
    rep = export_onnx(d, tmp_path / "q", target=target)
    assert all("-> Q/DQ" in note for note in rep.quantization["linears"])
    assert max(e["max_rel"] for e in rep.errors["step"].values()) <= rep.tolerance


def test_integer_codes_are_stored_as_raw_bytes():
    from onnx import TensorProto, numpy_helper

    from specpress.export.quant.common import int_tensor as _int_tensor

    for elem, lo, hi, size in [(TensorProto.INT4, -8, 8, 8), (TensorProto.UINT4, 0, 16, 8),
                               (TensorProto.INT8, -128, 128, 15), (TensorProto.UINT8, 0, 256, 15)]:
        codes = torch.randint(lo, hi, (5, 3), generator=torch.Generator().manual_seed(elem))
        t = _int_tensor(codes, elem, [5, 3])
        assert len(t.raw_data) == size and not t.int32_data  # 4-bit: two a byte (15 values -> 8 bytes)
        assert (numpy_helper.to_array(t).astype(int) == codes.numpy()).all()


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_bf16_floats_of_an_fp32_export_stay_bf16(tmp_path, target, dtype):
    from onnx import TensorProto

    d = _float_eagle(target)
    with torch.no_grad():  # the floats a quantized artifact keeps are bf16 numbers
        for p in d.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    rep = export_onnx(d, tmp_path / "e", ExportOptions(dtype=dtype), target=target)
    inits = onnx.load(str(tmp_path / "e" / "step.onnx"), load_external_data=False).graph.initializer
    from specpress.export.context import BF16_MIN_NUMEL

    big = [t for t in inits if not t.name.startswith("shared.") and len(t.dims) == 2
           and t.dims[0] * t.dims[1] >= BF16_MIN_NUMEL]
    want = TensorProto.BFLOAT16 if dtype == "fp32" else TensorProto.FLOAT16
    assert big and all(t.data_type == want for t in big), [(t.name, t.data_type) for t in big]
    assert max(e["max_rel"] for e in rep.errors["step"].values()) <= rep.tolerance


def test_export_command_names_the_ops_each_scheme_became(tmp_path, target):
    from click.testing import CliRunner

    from specpress.cli import cli
    from specpress.models.drafter_io import save_drafter
    from specpress.models.target import save_target

    tdir = save_target(target, tmp_path / "target")
    for scheme, group, op in (("fp8", None, "8 as DequantizeLinear(float8e4m3fn) + MatMul"),
                              ("int4", 16, "8 as MatMulNBits block 16")):
        ddir = save_drafter(quantized_eagle(target, scheme, group, True), tmp_path / scheme)
        res = CliRunner().invoke(cli, ["export", "onnx", "--drafter", str(ddir), "--target", str(tdir),
                                       "--out", str(tmp_path / f"onnx-{scheme}")])
        assert res.exit_code == 0, res.output
        line = next(x for x in res.output.splitlines() if "quantized Linears" in x)
        assert f"({scheme}, --quant-format matmulnbits): {op}" in line, line
