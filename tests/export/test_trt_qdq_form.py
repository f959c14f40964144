"""The form of the int8 Q/DQ weights that TensorRT for RTX compiles: one scale per output channel is written
as a per-axis DequantizeLinear (scale [N], axis 1), not as a one-block blocked one (scale [1, N], block_size
K), which TensorRT for RTX 1.7.1's Myelin fails on (CHECK(is_value())) once such a MatMul feeds another;
grouped scales stay blocked. Needs onnxruntime (the export validates against torch)."""

from __future__ import annotations

import dataclasses

import onnx
import pytest
from onnx import numpy_helper

pytest.importorskip("onnxruntime")

from specpress.export.onnx import ExportOptions, export_onnx


def _dequantize_nodes(path):
    graph = onnx.load(str(path)).graph  # the weights from the external data beside the graph
    nodes = [n for n in graph.node if n.op_type == "DequantizeLinear"]
    used = {i for n in nodes for i in n.input}
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name in used}
    return [(n, {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}, [inits[i] for i in n.input])
            for n in nodes]


@pytest.mark.parametrize("scheme,group,symmetric", [("int8", None, True), ("int8", None, False), ("int4", 16, True)])
def test_per_row_scales_are_per_axis_and_groups_blocked(tmp_path, target, scheme, group, symmetric):
    from drafters_common import make, randomize

    from specpress.compress.quantize.api import quantize
    from specpress.models.drafter import build_drafter
    from specpress.models.quantized.scheme import config_for

    base = make("eagle", target)  # intermediate 64: every Linear's K is a multiple of 16
    d = randomize(build_drafter(dataclasses.replace(base.config, intermediate_size=64)), 1).attach_target(target)
    d = quantize(d, config_for(scheme, group_size=group, symmetric=symmetric))
    rep = export_onnx(d, tmp_path / "q", ExportOptions(quant_format="qdq"), target=target)
    assert max(e["max_rel"] for e in rep.errors["step"].values()) <= rep.tolerance
    nodes = _dequantize_nodes(tmp_path / "q" / "step.onnx")
    assert len(nodes) == 8
    for node, attrs, (w, s, *z) in nodes:
        k, n = w.shape
        if group is None:
            assert attrs.get("axis") == 1 and "block_size" not in attrs and s.shape == (n,), node.name
            assert all(zp.shape == (n,) for zp in z) and len(z) == (0 if symmetric else 1)
        else:
            assert attrs == {"axis": 0, "block_size": group} and s.shape == (k // group, n), node.name
