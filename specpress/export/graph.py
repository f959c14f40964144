"""A small ONNX graph builder: named inputs/outputs, initializers, nodes and model-local functions.

specpress writes its drafter graphs directly from the modules' weights rather than tracing them:
every node is chosen (the tree-attention forms, MatMulNBits / Q/DQ from the stored codes), export
takes milliseconds, and the same builder serves every family. The torch modules stay the reference:
export validates each graph against them (`export/validate.py`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT_TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}
NP_TYPES = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}
Dim = int | str


class Graph:
    """Nodes, initializers, inputs and outputs of one ONNX graph; `model()` assembles them.

    dtype: the graph's float type name ("fp32" | "fp16"); `self.ft` is its TensorProto type.
    """

    def __init__(self, name: str, opset: int, dtype: str = "fp32") -> None:
        self.name, self.opset, self.dtype = name, opset, dtype
        self.ft = FLOAT_TYPES[dtype]
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.functions: dict[tuple[str, str], onnx.FunctionProto] = {}
        self.domains: dict[str, int] = {"": opset}
        self.shared: set[str] = set()  # initializers borrowed from the target (written once, beside the graphs)
        self._n = 0
        self._consts: dict[tuple, str] = {}

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    # -- interface ---------------------------------------------------------------------------------

    def input(self, name: str, elem: int, shape: Sequence[Dim]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def output(self, name: str, value: str, elem: int, shape: Sequence[Dim]) -> None:
        """Expose `value` as graph output `name` (an Identity when the names differ)."""
        if value != name:
            self.nodes.append(helper.make_node("Identity", [value], [name]))
        self.outputs.append(helper.make_tensor_value_info(name, elem, list(shape)))

    # -- values ------------------------------------------------------------------------------------

    def init(self, array: np.ndarray | TensorProto, hint: str) -> str:
        """Add an initializer (a weight) under a fresh name derived from `hint`."""
        name = self.fresh(hint)
        t = array if isinstance(array, TensorProto) else numpy_helper.from_array(np.asarray(array), name)
        t.name = name
        self.inits.append(t)
        return name

    def shared_init(self, array: np.ndarray, key: str) -> str:
        """An initializer shared with the target (embeddings, head): a stable name, stored beside the
        graphs in one file that every graph of the export references (see `_write_shared` in export/onnx.py)."""
        name = f"shared.{key}"
        if name not in self.shared:
            t = numpy_helper.from_array(np.ascontiguousarray(array), name)
            self.inits.append(t)
            self.shared.add(name)
        return name

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        """A small constant (shape ints, scalars), shared between uses."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(arr, "c")
        return self._consts[key]

    def fconst(self, value: Any) -> str:
        """A constant in the graph's float type."""
        return self.const(value, NP_TYPES[self.ft])

    def op(self, op_type: str, *inputs: str, domain: str = "", outputs: int = 1, **attrs: Any) -> Any:
        """Append a node; returns its output name (a tuple when outputs > 1). Empty input names ("")
        mark omitted optional inputs."""
        outs = [self.fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, domain=domain or None,
                                           **{k: v for k, v in attrs.items() if v is not None}))
        return outs[0] if outputs == 1 else tuple(outs)

    def use_domain(self, domain: str, version: int) -> None:
        self.domains[domain] = version

    def add_function(self, fn: onnx.FunctionProto) -> None:
        self.functions[(fn.domain, fn.name)] = fn

    # -- assembly ----------------------------------------------------------------------------------

    def model(self, producer: str = "specpress") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in self.domains.items()],
                                  functions=list(self.functions.values()), producer_name=producer)
        model.ir_version = min(model.ir_version, 11)  # onnxruntime 1.2x reads IR <= 11
        return model
