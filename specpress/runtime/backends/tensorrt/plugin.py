"""`specpress::TreeAttention` as a Python IPluginV3 (contract §3), for standard TensorRT and TensorRT for RTX.

The plugin and creator classes derive from the imported flavour's bindings, so they are made per module
(`plugin_classes`). `register_tree_attention` puts one creator into the flavour's plugin registry and keeps
it referenced for the life of the process (the registry holds a raw pointer). Plugin objects returned to
TensorRT (`create_plugin`, `clone`, `attach_to_context`) are released by the bindings to TensorRT, which
owns them from then on.

Fields = the node's attributes (`FIELDS`). Inputs: q, k, v (fp16 / bf16 / fp32, one type), committed and
tree_mask (int32); output like q. `enqueue` wraps TensorRT's device pointers as torch tensors and calls
`kernel.tree_attention` on TensorRT's stream: the same function the CPU tests check against the reference.

Scope: a Python plugin runs only in a Python process that registered it (specpress's own runtime). An engine
for trtexec / TensorRT-LLM / Edge-LLM needs an ahead-of-time implementation (a compiled C++/CUDA plugin
library, or `tensorrt.plugin.aot_impl` with a Triton kernel) — not built here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

NAME = "TreeAttention"
VERSION = "1"
NAMESPACE = "specpress"
# (attribute, kind) in the node's order; kind: "int" | "float" | "str"
FIELDS: tuple[tuple[str, str], ...] = (
    ("num_heads", "int"), ("num_kv_heads", "int"), ("head_size", "int"), ("scale", "float"),
    ("plugin_version", "str"), ("plugin_namespace", "str"),
)
N_INPUTS = 5


@dataclass(frozen=True)
class TreeAttentionFields:
    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    plugin_version: str = VERSION
    plugin_namespace: str = NAMESPACE

    def __post_init__(self) -> None:
        if min(self.num_heads, self.num_kv_heads, self.head_size) <= 0 or self.num_heads % self.num_kv_heads:
            raise ValueError(f"TreeAttention needs num_heads a positive multiple of num_kv_heads and head_size > 0, "
                             f"got num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                             f"head_size={self.head_size}")


def _field_type(trt: ModuleType, kind: str) -> Any:
    return {"int": trt.PluginFieldType.INT32, "float": trt.PluginFieldType.FLOAT32,
            "str": trt.PluginFieldType.CHAR}[kind]


def _encode(trt: ModuleType, fields: TreeAttentionFields) -> Any:
    out = []
    for name, kind in FIELDS:
        value = getattr(fields, name)
        data = {"int": lambda v: np.array([v], dtype=np.int32), "float": lambda v: np.array([v], dtype=np.float32),
                "str": lambda v: np.frombuffer(v.encode(), dtype=np.int8).copy()}[kind](value)
        out.append(trt.PluginField(name, data, _field_type(trt, kind)))
    return trt.PluginFieldCollection(out)


def decode_fields(fc: Any) -> TreeAttentionFields:
    """A PluginFieldCollection (what the parser or the engine hands the creator) -> TreeAttentionFields."""
    kinds = dict(FIELDS)
    values: dict[str, Any] = {}
    for f in fc:
        kind = kinds.get(f.name)
        if kind is None:
            continue
        data = np.asarray(f.data)
        if kind == "str":
            values[f.name] = bytes(data.astype(np.int8).tobytes()).rstrip(b"\0").decode()
        else:
            values[f.name] = int(data.reshape(-1)[0]) if kind == "int" else float(data.reshape(-1)[0])
    missing = [n for n, _ in FIELDS[:4] if n not in values]
    if missing:
        raise ValueError(f"TreeAttention node lacks attribute(s) {missing}; contract §3 requires "
                         f"{[n for n, _ in FIELDS]}")
    return TreeAttentionFields(**values)


def _torch_view(trt: ModuleType, desc: Any, ptr: int):
    """A TensorRT device buffer as a torch CUDA tensor (no copy)."""
    import torch

    typestr, dtype = {trt.DataType.HALF: ("<f2", None), trt.DataType.FLOAT: ("<f4", None),
                      trt.DataType.BF16: ("<i2", torch.bfloat16), trt.DataType.INT32: ("<i4", None)}[desc.type]

    class _Buffer:
        __cuda_array_interface__ = {"shape": tuple(desc.dims), "typestr": typestr, "data": (ptr, False),
                                    "version": 3, "strides": None}

    t = torch.as_tensor(_Buffer(), device="cuda")
    return t.view(dtype) if dtype is not None else t


_CLASSES: dict[str, tuple[type, type]] = {}
_REGISTERED: dict[str, Any] = {}


def plugin_classes(trt: ModuleType) -> tuple[type, type]:
    """(TreeAttentionPlugin, TreeAttentionCreator) deriving from `trt`'s IPluginV3 / IPluginCreatorV3One."""
    if trt.__name__ in _CLASSES:
        return _CLASSES[trt.__name__]
    # the bases come from whichever flavour was imported (tensorrt or tensorrt_rtx): dynamic for the checker
    plugin_v3: Any = trt.IPluginV3
    core: Any = trt.IPluginV3OneCore
    build: Any = trt.IPluginV3OneBuild
    runtime: Any = trt.IPluginV3OneRuntime
    creator_v3: Any = trt.IPluginCreatorV3One

    class TreeAttentionPlugin(plugin_v3, core, build, runtime):
        def __init__(self, fields: TreeAttentionFields, phase: Any = None):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.fields = fields
            self.phase = phase
            self.num_outputs = 1
            self.plugin_name = NAME
            self.plugin_version = VERSION
            self.plugin_namespace = NAMESPACE
            self.timing_cache_id = ""

        def get_capability_interface(self, type):  # noqa: A002 (TensorRT's argument name)
            return self

        def clone(self):
            return TreeAttentionPlugin(self.fields, self.phase)

        def get_output_data_types(self, input_types):
            return [input_types[0]]

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            return [trt.DimsExprs(inputs[0])]

        def supports_format_combination(self, pos, in_out, num_inputs):
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR:
                return False
            if pos in (3, 4):
                return desc.type == trt.DataType.INT32
            floats = (trt.DataType.HALF, trt.DataType.BF16, trt.DataType.FLOAT)
            return desc.type in floats and (pos == 0 or desc.type == in_out[0].desc.type)

        def configure_plugin(self, inputs, outputs):
            pass

        def on_shape_change(self, inputs, outputs):
            pass

        def get_workspace_size(self, inputs, outputs):
            return 0

        def get_valid_tactics(self):
            return []

        def set_tactic(self, tactic):
            pass

        def get_fields_to_serialize(self):
            return _encode(trt, self.fields)

        def attach_to_context(self, context):
            return self.clone()

        def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
            import torch

            from specpress.runtime.backends.tensorrt.kernel import tree_attention

            q, k, v, committed, tree_mask = (_torch_view(trt, d, p) for d, p in zip(input_desc, inputs))
            out = _torch_view(trt, output_desc[0], outputs[0])
            with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
                out.copy_(tree_attention(q, k, v, committed, tree_mask, self.fields.scale))
            return 0

    class TreeAttentionCreator(creator_v3):
        def __init__(self):
            trt.IPluginCreatorV3One.__init__(self)
            self.name = NAME
            self.plugin_version = VERSION
            self.plugin_namespace = NAMESPACE
            self.field_names = trt.PluginFieldCollection(
                [trt.PluginField(n, np.array([]), _field_type(trt, kind)) for n, kind in FIELDS])

        def create_plugin(self, name, fc, phase):
            return TreeAttentionPlugin(decode_fields(fc), phase)

    _CLASSES[trt.__name__] = (TreeAttentionPlugin, TreeAttentionCreator)
    return _CLASSES[trt.__name__]


def register_tree_attention(trt: ModuleType) -> Any:
    """Register (once per process) the TreeAttention creator in `trt`'s plugin registry; returns it."""
    if trt.__name__ not in _REGISTERED:
        creator = plugin_classes(trt)[1]()
        if not trt.get_plugin_registry().register_creator(creator, NAMESPACE):
            raise RuntimeError(f"{trt.__name__} refused to register the {NAMESPACE}::{NAME} plugin creator")
        _REGISTERED[trt.__name__] = creator
    return _REGISTERED[trt.__name__]
