"""A small ONNX graph builder: named inputs/outputs, initializers, nodes and model-local functions.

specpress writes its drafter graphs directly from the modules' weights rather than tracing them:
every node is chosen (the tree-attention forms, MatMulNBits / Q/DQ from the stored codes), export
takes milliseconds, and the same builder serves every family. The torch modules stay the reference:
export validates each graph against them (`export/validate.py`).

Weights stream to disk as they are made: given an `ExternalData` file, every initializer of at least
EXTERNAL_MIN_BYTES is written there at once (a torch weight converted a block of rows at a time) and the
graph keeps only its location, so a graph of any size stays far below protobuf's 2 GB limit and no
second copy of the weights is ever held. onnxruntime maps such a file rather than reading it (a session
without prepacking then holds a graph's weights once, as file pages touched when first used).
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT_TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}
NP_TYPES = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}
Dim = int | str
EXTERNAL_MIN_BYTES = 1024  # smaller initializers (constants, norms of tiny models) stay inside the graph
ALIGN = 64  # offsets aligned for any element type (onnxruntime maps the file either way: measured, 1.32)
ROW_BLOCK_BYTES = 1 << 26  # a torch weight is converted and written 64 MiB of rows at a time
BF16 = "bfloat16"  # as an np_dtype: bf16 values, carried as their int16 bits (numpy has no bfloat16)


class ExternalData:
    """One external-data file that initializers stream into as they are made (see the module docstring).
    `written`: name -> (offset, length) of what it holds, so a tensor several graphs share is written once."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._f = open(self.path, "wb")
        self.written: dict[str, tuple[int, int]] = {}

    def write(self, name: str, blocks: Iterable[Any]) -> tuple[int, int]:
        """Append the bytes of `blocks` (numpy arrays or bytes) page-aligned under `name`."""
        f = self._f
        f.write(b"\0" * ((-f.tell()) % ALIGN))
        start = f.tell()
        for b in blocks:
            f.write(memoryview(np.ascontiguousarray(b)).cast("B") if isinstance(b, np.ndarray) else b)
        self.written[name] = (start, f.tell() - start)
        return self.written[name]

    def reference(self, t: TensorProto, name: str) -> TensorProto:
        """Point `t` (no data of its own) at what was written under `name`."""
        offset, length = self.written[name]
        del t.external_data[:]
        for key, value in (("location", self.path.name), ("offset", str(offset)), ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        t.data_location = TensorProto.EXTERNAL
        return t

    def close(self) -> None:
        self._f.close()


def row_blocks(t: Any, np_dtype: Any, transpose: bool = False) -> Iterable[np.ndarray]:
    """A torch tensor (transposed first when asked) as numpy arrays of `np_dtype` (or BF16), ROW_BLOCK_BYTES
    of rows at a time: what is written never exists whole in a second dtype."""
    t = t.detach().cpu()
    if transpose:
        t = t.t()
    if t.dim() == 0:
        yield _np(t, np_dtype)
        return
    row = max(1, t[0].numel() * _itemsize(np_dtype))
    step = max(1, ROW_BLOCK_BYTES // row)
    for r in range(0, t.shape[0], step):
        yield _np(t[r:r + step], np_dtype)


def _np(t: Any, np_dtype: Any) -> np.ndarray:
    """A (CPU) torch tensor as a contiguous numpy array of `np_dtype` (or BF16)."""
    import torch

    t = t.contiguous()
    if np_dtype == BF16:
        return t.to(torch.bfloat16).view(torch.int16).numpy()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy().astype(np_dtype, copy=False)


def _elem(np_dtype: Any) -> int:
    return TensorProto.BFLOAT16 if np_dtype == BF16 else helper.np_dtype_to_tensor_dtype(np.dtype(np_dtype))


def _itemsize(np_dtype: Any) -> int:
    return 2 if np_dtype == BF16 else np.dtype(np_dtype).itemsize


def _proto(name: str, elem: int, shape: Sequence[int]) -> TensorProto:
    t = TensorProto()
    t.name, t.data_type = name, elem
    t.dims.extend(int(d) for d in shape)
    return t


class Graph:
    """Nodes, initializers, inputs and outputs of one ONNX graph; `model()` assembles them.

    dtype: the graph's float type name ("fp32" | "fp16"); `self.ft` is its TensorProto type.
    """

    def __init__(self, name: str, opset: int, dtype: str = "fp32", data: ExternalData | None = None,
                 shared_data: ExternalData | None = None) -> None:
        self.name, self.opset, self.dtype = name, opset, dtype
        self.data, self.shared_data = data, shared_data  # where weights stream (None: inside the graph)
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
        self._exposed: list[tuple[str, str]] = []  # (value, graph output name), in output order

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    # -- interface ---------------------------------------------------------------------------------

    def input(self, name: str, elem: int, shape: Sequence[Dim]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def output(self, name: str, value: str, elem: int, shape: Sequence[Dim]) -> None:
        """Expose `value` as graph output `name`. model() renames the node output `value` to `name`; an input,
        an initializer or a value exposed twice goes through an Identity instead (which copies it on every
        call in onnxruntime: an 8-layer target graph's 16 presents were each a copy of its cache, per call)."""
        self._exposed.append((value, name))
        self.outputs.append(helper.make_tensor_value_info(name, elem, list(shape)))

    # -- values ------------------------------------------------------------------------------------

    def init(self, array: np.ndarray | TensorProto, hint: str) -> str:
        """Add an initializer (a weight) under a fresh name derived from `hint`; streamed to the external
        data file when there is one and it is large enough."""
        name = self.fresh(hint)
        if isinstance(array, TensorProto):
            t = array
            t.name = name
            if self.data is not None and len(t.raw_data) >= EXTERNAL_MIN_BYTES:
                self.data.write(name, [t.raw_data])
                t.ClearField("raw_data")
                self.data.reference(t, name)
        else:
            arr = np.asarray(array)
            if self.data is not None and arr.nbytes >= EXTERNAL_MIN_BYTES:
                self.data.write(name, [arr])
                t = self.data.reference(_proto(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape), name)
            else:
                t = numpy_helper.from_array(arr, name)
        self.inits.append(t)
        return name

    def init_tensor(self, tensor: Any, hint: str, np_dtype: Any, *, transpose: bool = False) -> str:
        """A torch tensor as an initializer of `np_dtype` (transposed when asked), converted block by block
        straight into the external data file when there is one (no whole copy in the new dtype)."""
        shape = tuple(tensor.shape[::-1] if transpose else tensor.shape)
        nbytes = int(np.prod(shape)) * _itemsize(np_dtype)
        if self.data is None or nbytes < EXTERNAL_MIN_BYTES:
            t = tensor.detach().cpu()
            arr = _np(t.t() if transpose else t, np_dtype)
            if np_dtype == BF16:
                return self.init(helper.make_tensor("w", TensorProto.BFLOAT16, list(shape), arr.tobytes(), raw=True),
                                 hint)
            return self.init(arr, hint)
        name = self.fresh(hint)
        self.data.write(name, row_blocks(tensor, np_dtype, transpose))
        self.inits.append(self.data.reference(_proto(name, _elem(np_dtype), shape), name))
        return name

    def shared_init(self, tensor: Any, key: str, np_dtype: Any, *, transpose: bool = False) -> str:
        """An initializer shared with the target (embeddings, head): a stable name, written once into the
        export's shared file (`shared_data`) and referenced by every graph that uses it; with no shared
        file (a graph built alone), an ordinary initializer."""
        name = f"shared.{key}"
        if name in self.shared:
            return name
        self.shared.add(name)
        elem = _elem(np_dtype)
        shape = tuple(tensor.shape[::-1] if transpose else tensor.shape)
        if self.shared_data is None:
            t = tensor.detach().cpu()
            self.inits.append(numpy_helper.from_array(_np(t.t() if transpose else t, np_dtype), name))
            return name
        if name not in self.shared_data.written:
            self.shared_data.write(name, row_blocks(tensor, np_dtype, transpose))
        self.inits.append(self.shared_data.reference(_proto(name, elem, shape), name))
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

    def _named_outputs(self) -> list[onnx.NodeProto]:
        """The nodes with each exposed value renamed to its output name where that is safe (see output())."""
        produced = {v for n in self.nodes for v in n.output}
        times = collections.Counter(v for v, _ in self._exposed)
        rename = {v: name for v, name in self._exposed if v != name and v in produced and times[v] == 1}
        nodes = []
        for n in self.nodes:
            if rename and any(v in rename for v in (*n.input, *n.output)):
                n = copy.deepcopy(n)
                n.input[:] = [rename.get(v, v) for v in n.input]
                n.output[:] = [rename.get(v, v) for v in n.output]
            nodes.append(n)
        return nodes + [helper.make_node("Identity", [v], [name]) for v, name in self._exposed
                        if v != name and v not in rename]

    def model(self, producer: str = "specpress") -> onnx.ModelProto:
        graph = helper.make_graph(self._named_outputs(), self.name, self.inputs, self.outputs,
                                  initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in self.domains.items()],
                                  functions=list(self.functions.values()), producer_name=producer)
        model.ir_version = min(model.ir_version, 11)  # onnxruntime 1.2x reads IR <= 11
        return model
