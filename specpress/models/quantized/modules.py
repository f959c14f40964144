"""Quantized Linear modules: drop-in replacements for nn.Linear that store packed weights.

Key scheme in model.safetensors (for a Linear named `<name>`; `<name>.bias` stays a float tensor):

    int4  (IntLinear, bits 4)   <name>.qweight  uint8 [N, K/2]   two codes per byte: column 2j in the low
                                                                 nibble, 2j+1 in the high one
                                <name>.scales   float32 [N, K/G]
                                <name>.qzeros   uint8 [N, K/G]   asymmetric only (symmetric: zero point 8)
    int8  (IntLinear, bits 8)   <name>.qweight  int8 [N, K] (symmetric, zero 0) or uint8 [N, K] + qzeros
                                <name>.scales   float32 [N, K/G] (G = K, one per output channel, by default)
    fp8   (Fp8Linear)           <name>.weight_fp8  float8_e4m3fn [N, K]
                                <name>.scales      float32 [N]
    nf4 / fp4 (Bnb4bitLinear)   bitsandbytes' own Linear4bit keys: <name>.weight uint8 [N·K/2, 1],
                                <name>.weight.absmax float32 [N·K/blocksize], <name>.weight.quant_map
                                float32 [16], <name>.weight.quant_state.bitsandbytes__{nf4,fp4} (uint8 JSON)
    bnb int8 (Bnb8bitLinear)    bitsandbytes' own Linear8bitLt keys: <name>.weight int8 [N, K],
                                <name>.SCB float32 [N], <name>.weight_format uint8 []

N = out_features, K = in_features, G = group size; w ≈ (q - zero) · scale (primitives.py).

Every module computes y = x · dequantize()ᵀ + bias in the input's dtype (the CPU reference; nf4/fp4 go
through bitsandbytes.matmul_4bit), except on CPU per-row symmetric int8 given fp32 inputs and int4 with
groups of 32-256 given fp32 / bf16 inputs, which multiply the codes with bf16-rounded activations in aten's
weight-only kernels (IntLinear.forward, int4_cpu.py); `kernel_note` on an IntLinear names its path. `module.weight` is the
dequantised weight (for code that reads `.weight.dtype` / `.device`); it is computed on each access.
Quantized tensors keep their stored dtype through `.to(dtype)` / `.half()`: only their device follows
(the float bias converts as usual).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specpress.models.quantized import bnb_cpu, int4_cpu, primitives as P
from specpress.errors import CheckpointError, UsageError


def import_bnb() -> Any:
    """bitsandbytes, or a UsageError that says how to get it."""
    try:
        import bitsandbytes
    except ImportError as exc:
        raise UsageError(f"the nf4 / fp4 / bnb int8 schemes need bitsandbytes ({exc}); "
                         f"pip install bitsandbytes (0.50+ runs on CPU)") from None
    return bitsandbytes


class QuantizedLinear(nn.Module):
    """Base: shapes, bias, compute dtype, the public-key <-> buffer mapping and dtype-stable moves.

    Subclasses set KEYS (public state-dict suffix -> buffer attribute) and implement dequantize().
    """

    is_quantized: ClassVar[bool] = True  # drafter_io / inspect recognise quantized modules by this flag
    scheme: ClassVar[str] = ""
    KEYS: dict[str, str] = {}

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = dtype
        self.register_parameter("bias", None if bias is None else
                                nn.Parameter(bias.detach().to(dtype), requires_grad=False))

    # -- the weight ------------------------------------------------------------------------------

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        """The weight [N, K] as the module computes with it, in `dtype` (default: compute dtype)."""
        raise NotImplementedError

    @property
    def weight(self) -> Tensor:
        return self.dequantize(self.compute_dtype)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N] in x's dtype."""
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantize(x.dtype), bias)

    def to_linear(self) -> nn.Linear:
        """A plain nn.Linear holding the dequantised weight (what --dequantize writes)."""
        dev = self.quant_tensors()[0].device
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device=dev,
                        dtype=self.compute_dtype)
        with torch.no_grad():
            lin.weight.copy_(self.dequantize(self.compute_dtype))
            if self.bias is not None:
                lin.bias.copy_(self.bias)
        return lin

    def quant_tensors(self) -> list[Tensor]:
        return [getattr(self, attr) for attr in self.KEYS.values()]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, " \
               f"scheme={self.scheme}"

    # -- state dict: public keys, stored dtypes ----------------------------------------------------

    def _register_quant(self, tensors: Mapping[str, Tensor]) -> None:
        """Register the quantized tensors as (non-persistent) buffers; the state dict writes them itself."""
        for attr, t in tensors.items():
            self.register_buffer(attr, t, persistent=False)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)  # bias
        for key, attr in self.KEYS.items():
            t = getattr(self, attr)
            destination[prefix + key] = t if keep_vars else t.detach()

    def _load_from_state_dict(self, state_dict: Mapping[str, Tensor], prefix: str, local_metadata: dict,
                              strict: bool, missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        for key, attr in self.KEYS.items():
            full = prefix + key
            if full not in state_dict:
                missing_keys.append(full)
                continue
            given, mine = state_dict[full], getattr(self, attr)
            if tuple(given.shape) != tuple(mine.shape) or given.dtype != mine.dtype:
                error_msgs.append(f"{full}: stored {given.dtype} {tuple(given.shape)}, expected {mine.dtype} "
                                  f"{tuple(mine.shape)}")
                continue
            setattr(self, attr, given.detach())  # assigned as stored: quantized tensors never change dtype
            if full in unexpected_keys:
                unexpected_keys.remove(full)
        self._refresh()

    def _apply(self, fn: Any, recurse: bool = True) -> "QuantizedLinear":
        """Moves keep the quantized tensors' dtypes; a float conversion changes only the compute dtype."""
        before = {attr: getattr(self, attr) for attr in self.KEYS.values()}
        probe = fn(torch.empty(0, dtype=self.compute_dtype, device=next(iter(before.values())).device))
        super()._apply(fn, recurse)
        for attr, old in before.items():
            new = getattr(self, attr)
            if new.dtype != old.dtype:
                setattr(self, attr, old.to(new.device))
        if isinstance(probe, Tensor) and probe.is_floating_point():
            self.compute_dtype = probe.dtype
        self._refresh()
        return self

    def _refresh(self) -> None:
        """Re-derive anything cached from the quantized tensors (after a load or a move)."""


def checked_tensor(stored: Mapping[str, Tensor], key: str, dtype: torch.dtype, shape: tuple[int, ...], where: str,
                   kind: str = "quantized", source: str = "the recorded quantization") -> Tensor:
    """stored[key], or a CheckpointError naming `where` when it is missing or not the `source`'s dtype/shape."""
    t = stored.get(key)
    if t is None:
        raise CheckpointError(f"{where}: missing {kind} tensor {key!r}")
    if t.dtype != dtype or tuple(t.shape) != shape:
        raise CheckpointError(f"{where}.{key}: stored {t.dtype} {tuple(t.shape)}, {source} implies {dtype} {shape}")
    return t


def _check_stored(stored: Mapping[str, Tensor], expected: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
                  where: str) -> None:
    for key, (dt, shape) in expected.items():
        checked_tensor(stored, key, dt, shape, where)


# ----------------------------------------------------------------------------------------------
# Integer codes (RTN and GPTQ)
# ----------------------------------------------------------------------------------------------


class IntLinear(QuantizedLinear):
    """int4 (packed) or int8 codes with float32 scales per group of `group_size` inputs (None = per row)."""

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None, dtype: torch.dtype, *,
                 bits: int, group_size: int | None, symmetric: bool, qweight: Tensor, scales: Tensor,
                 qzeros: Tensor | None = None) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self.bits, self.group_size, self.symmetric = bits, group_size, symmetric
        self.KEYS = {"qweight": "qweight", "scales": "scales"} | ({} if symmetric else {"qzeros": "qzeros"})
        self._register_quant({"qweight": qweight, "scales": scales} | ({} if symmetric else {"qzeros": qzeros}))
        self._refresh()

    def _refresh(self) -> None:
        # Per-row int8 with K a multiple of 16: the scales as a bf16 [N] buffer, which aten's int8 kernel
        # takes as is (converting the scales inside forward fails Inductor's lowering of it under torch.compile).
        # The kernel (torch 2.13, CPU) crashes with SIGSEGV from 16 rows up when K is not a multiple of 16
        # or when the codes or the activations do not start on a 64-byte boundary; codes read from a
        # safetensors file can start mid-cache-line, so they are copied to a fresh (aligned) allocation.
        per_row = self.bits == 8 and self.symmetric and self.scales.shape[1] == 1 and self.in_features % 16 == 0
        if per_row and self.qweight.data_ptr() % 64:
            self.qweight = self.qweight.clone()
        self.register_buffer("row_scales", self.scales[:, 0].to(torch.bfloat16) if per_row else None,
                             persistent=False)
        # int4 on CPU: the codes re-packed once into aten's int4 kernel layout (int4_cpu.py), beside the
        # stored qweight (which the state dict and export read): N·K/2 more bytes in memory, none on disk.
        self.kernel_note = "aten._weight_int8pack_mm on CPU (bf16 activations)" if per_row else "dequantize per forward"
        packed = sz = None
        if self.bits == 4:
            why = "weights not loaded yet" if self.qweight.is_meta else int4_cpu.kernel_unavailable(
                self.out_features, self.in_features, self.group_size, self.qweight.device, self.compute_dtype)
            if why is None:
                packed, sz = int4_cpu.pack(self.codes(), self.scales, self.zeros())
            self.kernel_note = int4_cpu.NAME if why is None else f"dequantize per forward: {why}"
        self.register_buffer("int4_packed", packed, persistent=False)
        self.register_buffer("int4_sz", sz, persistent=False)

    @property
    def scheme(self) -> str:  # type: ignore[override]
        return f"int{self.bits}"

    def forward(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N] in x's dtype.

        Per-row symmetric int8 with fp32 inputs on CPU (how the runtime runs a drafter) multiplies the
        int8 codes directly with aten's weight-only int8 kernel: the activations are rounded to bf16 for
        this product (the kernel wants bf16; given fp32 it is several times slower than an fp32 Linear)
        and the result is returned in fp32. The bf16 copy is a fresh allocation, so it is aligned as the
        kernel needs. int4 with groups of 32-256 and N a multiple of 16, fp32 or bf16 inputs on CPU, goes
        through aten's int4 kernel the same way (int4_cpu.py). Other layouts, dtypes and devices and
        grad-tracking inputs dequantize the weight first (`kernel_note` says which path and why).
        bench/int8_linear.py and bench/int4_linear.py time them against float Linears."""
        if self.int4_packed is not None and x.device.type == "cpu" and x.dtype in int4_cpu.ACTIVATION_DTYPES \
                and not (x.requires_grad and torch.is_grad_enabled()):
            y = int4_cpu.matmul(x, self.int4_packed, int4_cpu.group_of(self.in_features, self.group_size), self.int4_sz)
            return y if self.bias is None else y + self.bias.to(x.dtype)
        s = self.row_scales
        if (s is None or x.dtype != torch.float32 or x.device.type != "cpu"
                or (x.requires_grad and torch.is_grad_enabled())):
            return super().forward(x)
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features).to(torch.bfloat16), self.qweight, s)
        y = y.reshape(*x.shape[:-1], self.out_features).float()
        return y if self.bias is None else y + self.bias.to(x.dtype)

    @staticmethod
    def layout(n: int, k: int, bits: int, group_size: int | None, symmetric: bool
               ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """Stored key -> (dtype, shape) for an [N, K] weight."""
        ng = P.num_groups(k, group_size)
        qdt = torch.uint8 if bits == 4 or not symmetric else torch.int8
        out = {"qweight": (qdt, (n, k // 2 if bits == 4 else k)), "scales": (torch.float32, (n, ng))}
        if not symmetric:
            out["qzeros"] = (torch.uint8, (n, ng))
        return out

    @classmethod
    def from_codes(cls, linear: nn.Linear, q: Tensor, scale: Tensor, zero: Tensor, *, bits: int,
                   group_size: int | None, symmetric: bool) -> "IntLinear":
        """Codes q [N, K] (unsigned range), scales / zeros [N, K/G] (primitives.quantize_int) -> module."""
        if bits == 4:
            qweight = P.pack_int4(q)
        elif symmetric:
            qweight = (q.to(torch.int16) - 128).to(torch.int8)
        else:
            qweight = q.to(torch.uint8)
        w = linear.weight
        return cls(linear.in_features, linear.out_features, linear.bias, w.dtype, bits=bits, group_size=group_size,
                   symmetric=symmetric, qweight=qweight.to(w.device), scales=scale.float().to(w.device),
                   qzeros=None if symmetric else zero.to(torch.uint8).to(w.device))

    @classmethod
    def empty(cls, linear: nn.Linear, dtype: torch.dtype, *, bits: int, group_size: int | None, symmetric: bool,
              stored: Mapping[str, Tensor], where: str) -> "IntLinear":
        """A module to load stored tensors into (shapes and dtypes checked against the config)."""
        lay = cls.layout(linear.out_features, linear.in_features, bits, group_size, symmetric)
        _check_stored(stored, lay, where)
        t = {k: torch.empty(shape, dtype=dt, device="meta") for k, (dt, shape) in lay.items()}
        return cls(linear.in_features, linear.out_features, linear.bias, dtype, bits=bits, group_size=group_size,
                   symmetric=symmetric, qweight=t["qweight"], scales=t["scales"], qzeros=t.get("qzeros"))

    def codes(self) -> Tensor:
        """Unsigned codes [N, K] (int16)."""
        q = self.qweight
        if self.bits == 4:
            return P.unpack_int4(q).to(torch.int16)
        return q.to(torch.int16) + 128 if self.symmetric else q.to(torch.int16)

    def zeros(self) -> Tensor:
        if self.symmetric:
            return torch.full_like(self.scales, 2 ** (self.bits - 1))
        return self.qzeros.float()

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        return P.dequantize_int(self.codes(), self.scales, self.zeros(), dtype or self.compute_dtype)

    def extra_repr(self) -> str:
        g = "per-channel" if self.group_size is None else f"group_size={self.group_size}"
        return f"{super().extra_repr()}, {g}, {'symmetric' if self.symmetric else 'asymmetric'}, {self.kernel_note}"


# ----------------------------------------------------------------------------------------------
# fp8 e4m3
# ----------------------------------------------------------------------------------------------


class Fp8Linear(QuantizedLinear):
    """float8_e4m3fn weights with per-output-channel float32 scales.

    Computed by dequantising to the input's dtype, on every device: no native fp8 matmul is used here
    (torch._scaled_mm on sm89+ GPUs would be the native path; not wired in). On CPU torch 2.13 has no
    weight-only fp8 kernel: its _scaled_mm wants fp8 activations too and is a reference loop (121 ms for
    8 x 256 x 768, against 33 us for an fp32 Linear).
    """

    scheme: ClassVar[str] = "fp8"
    KEYS = {"weight_fp8": "weight_fp8", "scales": "scales"}

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None, dtype: torch.dtype, *,
                 weight_fp8: Tensor, scales: Tensor) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self._register_quant({"weight_fp8": weight_fp8, "scales": scales})

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Fp8Linear":
        w8, s = P.quantize_fp8(linear.weight.detach())
        return cls(linear.in_features, linear.out_features, linear.bias, linear.weight.dtype, weight_fp8=w8,
                   scales=s)

    @classmethod
    def empty(cls, linear: nn.Linear, dtype: torch.dtype, *, stored: Mapping[str, Tensor], where: str) -> "Fp8Linear":
        n, k = linear.out_features, linear.in_features
        _check_stored(stored, {"weight_fp8": (torch.float8_e4m3fn, (n, k)), "scales": (torch.float32, (n,))}, where)
        return cls(k, n, linear.bias, dtype, weight_fp8=torch.empty(n, k, dtype=torch.float8_e4m3fn, device="meta"),
                   scales=torch.empty(n, device="meta"))

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        return P.dequantize_fp8(self.weight_fp8, self.scales, dtype or self.compute_dtype)


# ----------------------------------------------------------------------------------------------
# bitsandbytes
# ----------------------------------------------------------------------------------------------


class Bnb4bitLinear(QuantizedLinear):
    """bitsandbytes nf4 / fp4 (quantize_4bit, no double quantisation), stored under Linear4bit's keys
    and computed with bitsandbytes.matmul_4bit (its CPU kernels here)."""

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None, dtype: torch.dtype, *,
                 quant_type: str, blocksize: int, qs_dtype: torch.dtype, packed: Tensor, absmax: Tensor,
                 quant_map: Tensor, quant_state: Tensor) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self.quant_type, self.blocksize, self.qs_dtype = quant_type, blocksize, qs_dtype
        self.KEYS = {"weight": "packed", "weight.absmax": "absmax", "weight.quant_map": "quant_map",
                     f"weight.quant_state.bitsandbytes__{quant_type}": "quant_state"}
        self._register_quant({"packed": packed, "absmax": absmax, "quant_map": quant_map, "quant_state": quant_state})
        self._refresh()

    def _refresh(self) -> None:
        # On an AVX512-BF16 CPU: the nibbles repacked once for bitsandbytes' fused CPU kernel (bnb_cpu.py),
        # beside the stored ones (which the state dict and export read): N·K/2 more bytes in memory.
        packed, self.cpu_state = None, None
        why = "weights not loaded yet" if self.packed.is_meta else None
        if why is None:
            try:
                bnb = import_bnb()
            except UsageError as exc:
                why = str(exc)
            else:
                why = bnb_cpu.kernel_unavailable(bnb, self.out_features, self.in_features, self.blocksize,
                                                 self.packed.device, self.compute_dtype)
                if why is None:
                    packed, self.cpu_state = bnb_cpu.pack(bnb, self.packed, self.quant_state_obj())
        self.kernel_note = bnb_cpu.NAME if why is None else f"bitsandbytes matmul_4bit (dequantizes): {why}"
        self.register_buffer("cpu_packed", packed, persistent=False)

    @property
    def scheme(self) -> str:  # type: ignore[override]
        return self.quant_type

    @classmethod
    def from_linear(cls, linear: nn.Linear, quant_type: str, blocksize: int) -> "Bnb4bitLinear":
        bnb = import_bnb()
        w = linear.weight.detach().contiguous()
        packed, qs = bnb.functional.quantize_4bit(w, blocksize=blocksize, compress_statistics=False,
                                                  quant_type=quant_type, quant_storage=torch.uint8)
        d = qs.as_dict(packed=True)
        return cls(linear.in_features, linear.out_features, linear.bias, w.dtype, quant_type=quant_type,
                   blocksize=blocksize, qs_dtype=w.dtype, packed=packed, absmax=d["absmax"],
                   quant_map=d["quant_map"], quant_state=d[f"quant_state.bitsandbytes__{quant_type}"])

    @classmethod
    def empty(cls, linear: nn.Linear, dtype: torch.dtype, *, quant_type: str, blocksize: int,
              stored: Mapping[str, Tensor], where: str) -> "Bnb4bitLinear":
        n, k = linear.out_features, linear.in_features
        qkey = f"weight.quant_state.bitsandbytes__{quant_type}"
        blocks = -(-n * k // blocksize)
        _check_stored(stored, {"weight": (torch.uint8, ((n * k + 1) // 2, 1)),
                               "weight.absmax": (torch.float32, (blocks,)),
                               "weight.quant_map": (torch.float32, (16,))}, where)
        if qkey not in stored:
            raise CheckpointError(f"{where}: missing bitsandbytes quant state {qkey!r}")
        try:
            meta = json.loads(bytes(stored[qkey].tolist()).decode())
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{where}.{qkey} is not bitsandbytes' JSON quant state ({exc})") from None
        if meta.get("quant_type") != quant_type or meta.get("blocksize") != blocksize or \
                list(meta.get("shape") or []) != [n, k]:
            raise CheckpointError(f"{where}.{qkey} records {meta}, the recorded quantization implies quant_type "
                                  f"{quant_type}, blocksize {blocksize}, shape [{n}, {k}]")
        qs_dtype = getattr(torch, str(meta.get("dtype")), None)
        if not isinstance(qs_dtype, torch.dtype):
            raise CheckpointError(f"{where}.{qkey}: unknown dtype {meta.get('dtype')!r}")
        e = {key: torch.empty(stored[key].shape, dtype=stored[key].dtype, device="meta")
             for key in ("weight", "weight.absmax", "weight.quant_map", qkey)}
        return cls(k, n, linear.bias, dtype, quant_type=quant_type, blocksize=blocksize, qs_dtype=qs_dtype,
                   packed=e["weight"], absmax=e["weight.absmax"], quant_map=e["weight.quant_map"], quant_state=e[qkey])

    def quant_state_obj(self) -> Any:
        bnb = import_bnb()
        return bnb.functional.QuantState(absmax=self.absmax, shape=torch.Size([self.out_features, self.in_features]),
                                         code=self.quant_map, blocksize=self.blocksize, quant_type=self.quant_type,
                                         dtype=self.qs_dtype)

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        bnb = import_bnb()
        return bnb.functional.dequantize_4bit(self.packed, self.quant_state_obj()).to(dtype or self.compute_dtype)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N] in x's dtype: bitsandbytes' fused CPU kernel on bf16-rounded fp32 / bf16
        inputs where it applies (`kernel_note`), else matmul_4bit in the stored compute dtype."""
        bnb = import_bnb()
        if self.cpu_packed is not None and x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) \
                and not (x.requires_grad and torch.is_grad_enabled()):
            y = bnb_cpu.matmul(bnb, x, self.cpu_packed, self.cpu_state)
            return y if self.bias is None else y + self.bias.to(x.dtype)
        bias = None if self.bias is None else self.bias.to(self.qs_dtype)
        y = bnb.matmul_4bit(x.to(self.qs_dtype), self.packed, quant_state=self.quant_state_obj(), bias=bias)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, blocksize={self.blocksize}, {self.kernel_note}"


class Bnb8bitLinear(QuantizedLinear):
    """bitsandbytes int8 vectorwise (LLM.int8()'s weight format: int8 rows + per-row absmax `SCB`),
    stored under Linear8bitLt's keys. Weight-only: computed by dequantising with bitsandbytes'
    int8_vectorwise_dequant (Linear8bitLt's int8 x int8 matmul, which also quantises activations, is not used)."""

    scheme: ClassVar[str] = "int8"
    KEYS = {"weight": "packed", "SCB": "scb", "weight_format": "weight_format"}

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None, dtype: torch.dtype, *,
                 packed: Tensor, scb: Tensor, weight_format: Tensor) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self._register_quant({"packed": packed, "scb": scb, "weight_format": weight_format})

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Bnb8bitLinear":
        bnb = import_bnb()
        w = linear.weight.detach().contiguous()
        # exactly what Linear8bitLt does on .to(device): quantize the fp16 copy of the weight
        cb, scb, _ = bnb.functional.int8_vectorwise_quant(w.to(torch.float16))
        return cls(linear.in_features, linear.out_features, linear.bias, w.dtype, packed=cb, scb=scb.float(),
                   weight_format=torch.tensor(0, dtype=torch.uint8, device=w.device))

    @classmethod
    def empty(cls, linear: nn.Linear, dtype: torch.dtype, *, stored: Mapping[str, Tensor],
              where: str) -> "Bnb8bitLinear":
        n, k = linear.out_features, linear.in_features
        lay = {"weight": (torch.int8, (n, k)), "SCB": (torch.float32, (n,)), "weight_format": (torch.uint8, ())}
        _check_stored(stored, lay, where)
        e = {key: torch.empty(shape, dtype=dt, device="meta") for key, (dt, shape) in lay.items()}
        return cls(k, n, linear.bias, dtype, packed=e["weight"], scb=e["SCB"], weight_format=e["weight_format"])

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        bnb = import_bnb()
        return bnb.functional.int8_vectorwise_dequant(self.packed, self.scb).to(dtype or self.compute_dtype)


def quantized_modules(model: nn.Module) -> dict[str, QuantizedLinear]:
    """Name -> quantized module, in module order."""
    return {name: m for name, m in model.named_modules() if getattr(m, "is_quantized", False)}
