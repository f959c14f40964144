"""Integer codes: int8 and int4 weights with float32 scales per group (RTN, and GPTQ's codes).

Key scheme in model.safetensors, for a Linear named `<name>` (N = out_features, K = in_features,
G = group size; w ≈ (q - zero) · scale, primitives.py):

    int4  <name>.qweight  uint8 [N, K/2]    two codes per byte: column 2j in the low nibble, 2j+1 in the high
          <name>.scales   float32 [N, K/G]
          <name>.qzeros   uint8 [N, K/G]    asymmetric only (symmetric: zero point 8)
    int8  <name>.qweight  int8 [N, K] (symmetric, zero 0) or uint8 [N, K] + qzeros
          <name>.scales   float32 [N, K/G]  (G = K, one per output channel, by default)

On CPU, per-row symmetric int8 given fp32 inputs and int4 with groups of 32-256 given fp32 / bf16 inputs
multiply the codes with bf16-rounded activations in aten's weight-only kernels (IntLinear.forward,
int4_cpu.py); everything else dequantizes per forward. `kernel_note` names the path.

Configs: IntConfig (round-to-nearest) and GPTQConfig (the same storage, codes chosen by GPTQ
on calibration inputs; its handler lives in specpress/compress/quantize/gptq.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Mapping

import torch
from torch import Tensor, nn

from specpress.errors import ConfigError
from specpress.models.quantized import int4_cpu, primitives as P
from specpress.models.quantized.activations import (DEFAULT_CALIBRATION, INT8_MAX, act_label, check_activations,
                                                   int8_input)
from specpress.models.quantized.configs import GPTQSettings, QuantizeConfig, positive_int
from specpress.models.quantized.modules import QuantizedLinear, check_stored
from specpress.models.quantized.restore import replace_module
from specpress.models.quantized.scheme import Scheme, Words, register_scheme


@dataclass(frozen=True)
class IntConfig(QuantizeConfig):
    """Integer codes by round-to-nearest. bits 8: per-output-channel by default (group_size None); bits 4:
    groups of `group_size` inputs (default 64). Symmetric (no stored zeros) or asymmetric (a zero point
    per group). int8 may quantize its activations too (W8A8: `activations` dynamic per token, or static
    with a calibrated input_scale found by `act_calibration`); int4 is weight-only."""

    name: ClassVar[str] = "int"

    bits: int = 4
    group_size: int | None = 64
    symmetric: bool = True
    activations: str = "none"
    act_calibration: str = DEFAULT_CALIBRATION

    def validate(self) -> None:
        if self.bits not in (4, 8):
            raise ConfigError(f"integer quantization supports bits 4 or 8, found {self.bits!r}")
        if self.group_size is not None:
            positive_int(self.group_size, "group_size")
            if self.bits == 4 and self.group_size % 2:
                raise ConfigError(f"int4 group_size must be even (two codes per byte), found {self.group_size}")
        if not isinstance(self.symmetric, bool):
            raise ConfigError(f"symmetric must be true or false, found {self.symmetric!r}")
        check_activations(self.scheme, self.activations, self.act_calibration,
                          ("none", "dynamic", "static") if self.bits == 8 else ("none",))

    @property
    def scheme(self) -> str:
        return f"int{self.bits}"

    @property
    def method(self) -> str:
        return "rtn"

    def storage_label(self) -> str:
        s = f"int{self.bits}" + (f"-g{self.group_size}" if self.group_size else "")
        s += ("" if self.method == "rtn" else f"-{self.method}") + ("" if self.symmetric else "-asym")
        return s + act_label(self.activations, self.act_calibration)


@dataclass(frozen=True)
class GPTQConfig(GPTQSettings, IntConfig):
    """IntConfig's storage with codes chosen by GPTQ (Frantar et al. 2022): columns are
    quantized in order and each one's error is spread over the not-yet-quantized columns through the
    Cholesky factor of the inverse Hessian H = 2·XᵀX of the layer's calibration inputs X.
    The settings (damp, block_size, sequential) are configs.GPTQSettings'."""

    name: ClassVar[str] = "gptq"

    def sizing_config(self) -> IntConfig:
        return IntConfig(bits=self.bits, group_size=self.group_size, symmetric=self.symmetric,
                         activations=self.activations, act_calibration="fixed:1", include=self.include,
                         exclude=self.exclude)


@dataclass(frozen=True)
class AWQConfig(IntConfig):
    """int4 weight-only codes after AWQ's activation-aware scaling (Lin et al. 2023, the "awq_lite" search
    ModelOpt and TensorRT-LLM use): for each group of Linears reading one input (q/k/v, gate/up), per input
    channel s = mean|x|^α over the calibration inputs; the weight is scaled by s before rounding to
    nearest and the input by 1/s (stored as `pre_quant_scale` [K], ModelOpt's name), with α chosen from
    `grid` points in [0, 1) to minimize the group's output error on the calibration inputs; with `clip`
    (llm-awq's default auto_clip, ModelOpt's awq_clip) each weight group's range is then searched too.
    The stored form is the same either way (int4 groups + pre_quant_scale)."""

    name: ClassVar[str] = "awq"
    needs_calibration: ClassVar[bool] = True
    has_pre_quant_scale: ClassVar[bool] = True

    grid: int = 20
    clip: bool = True

    def validate(self) -> None:
        super().validate()
        positive_int(self.grid, "awq grid")
        if not isinstance(self.clip, bool):
            raise ConfigError(f"awq clip: expected true or false, got {self.clip!r}")
        if self.bits != 4:
            raise ConfigError("awq chooses int4 codes; use --scheme int4")

    @property
    def method(self) -> str:
        return "awq"

    def storage_label(self) -> str:
        return super().storage_label() + ("" if self.clip else "-noclip")

    def sizing_config(self) -> IntConfig:
        return IntConfig(bits=4, group_size=self.group_size, symmetric=self.symmetric, include=self.include,
                         exclude=self.exclude)


@dataclass(frozen=True)
class SmoothQuantConfig(IntConfig):
    """int8 W8A8 after SmoothQuant's migration (Xiao et al. 2023): per input channel s = max|x|^α /
    max|w|^(1-α) over the calibration inputs and every Linear reading that input; the weight is scaled
    by s, the input by 1/s (`pre_quant_scale` [K]), then the weight is rounded per output channel and
    the activations are quantized (`activations`: static per tensor by default, as Model Optimizer's
    INT8_SMOOTHQUANT and TensorRT Edge-LLM's int8_sq deploy it, or dynamic per token)."""

    name: ClassVar[str] = "smoothquant"
    needs_calibration: ClassVar[bool] = True
    has_pre_quant_scale: ClassVar[bool] = True

    bits: int = 8
    group_size: int | None = None
    alpha: float = 0.5
    activations: str = "static"

    def validate(self) -> None:
        super().validate()
        if self.bits != 8 or self.group_size is not None or not self.symmetric:
            raise ConfigError("smoothquant quantizes int8 weights per output channel, symmetric: use --scheme int8 "
                              "without --group-size / --asymmetric")
        if self.activations == "none":
            raise ConfigError("smoothquant moves activation outliers into the weights so that the activations can "
                              "be quantized: use --activations static or dynamic (weight-only int8: --method rtn)")
        if not isinstance(self.alpha, (int, float)) or isinstance(self.alpha, bool) or not 0 <= self.alpha <= 1:
            raise ConfigError(f"smoothquant alpha must be in [0, 1], found {self.alpha!r}")

    @property
    def method(self) -> str:
        return "smoothquant"

    def sizing_config(self) -> IntConfig:
        return IntConfig(bits=8, group_size=None, activations=self.activations, act_calibration="fixed:1",
                         include=self.include, exclude=self.exclude)


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
        bench/int8_linear.py and bench/int4_linear.py time them against float Linears.
        A pre_quant_scale (AWQ) multiplies x first, on every path; quantized activations (int8 W8A8) are
        emulated: fake-quantized inputs times the dequantised weight, no kernel."""
        x = self.prepare_input(x)
        if self.act_mode != "none" or (x.requires_grad and torch.is_grad_enabled()):
            return self.dequantized_product(x)
        if self.int4_packed is not None and x.device.type == "cpu" and x.dtype in int4_cpu.ACTIVATION_DTYPES:
            y = int4_cpu.matmul(x, self.int4_packed, int4_cpu.group_of(self.in_features, self.group_size), self.int4_sz)
            return y if self.bias is None else y + self.bias.to(x.dtype)
        s = self.row_scales
        if s is None or x.dtype != torch.float32 or x.device.type != "cpu":
            return self.dequantized_product(x)
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features).to(torch.bfloat16), self.qweight, s)
        y = y.reshape(*x.shape[:-1], self.out_features).float()
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def quantize_input(self, x: Tensor) -> Tensor:
        """int8 activations (W8A8): symmetric, per token (dynamic) or with the calibrated input_scale (static)."""
        return int8_input(x, self.act_mode, self.input_scale)

    def input_scale_for(self, amax: Tensor) -> Tensor:
        return amax.float() / INT8_MAX

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
                   group_size: int | None, symmetric: bool, act_mode: str = "none",
                   pre_quant_scale: Tensor | None = None) -> "IntLinear":
        """Codes q [N, K] (unsigned range), scales / zeros [N, K/G] (primitives.quantize_int) -> module."""
        if bits == 4:
            qweight = P.pack_int4(q)
        elif symmetric:
            qweight = (q.to(torch.int16) - 128).to(torch.int8)
        else:
            qweight = q.to(torch.uint8)
        w = linear.weight
        mod = cls(linear.in_features, linear.out_features, linear.bias, w.dtype, bits=bits, group_size=group_size,
                  symmetric=symmetric, qweight=qweight.to(w.device), scales=scale.float().to(w.device),
                  qzeros=None if symmetric else zero.to(torch.uint8).to(w.device))
        if act_mode != "none" or pre_quant_scale is not None:
            mod.configure_input(act_mode, pre_quant_scale)
        return mod

    @classmethod
    def empty(cls, linear: nn.Linear, dtype: torch.dtype, *, bits: int, group_size: int | None, symmetric: bool,
              stored: Mapping[str, Tensor], where: str) -> "IntLinear":
        """A module to load stored tensors into (shapes and dtypes checked against the config)."""
        lay = cls.layout(linear.out_features, linear.in_features, bits, group_size, symmetric)
        check_stored(stored, lay, where)
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
# The descriptor
# ----------------------------------------------------------------------------------------------


METHODS: dict[str, type[IntConfig]] = {"rtn": IntConfig, "gptq": GPTQConfig, "awq": AWQConfig,
                                        "smoothquant": SmoothQuantConfig}


def _make(word: str, method: str, w: Words) -> IntConfig:
    bits = 8 if word == "int8" else 4
    kw = w.settings()
    if "group_size" not in kw and method != "smoothquant":
        kw["group_size"] = None if bits == 8 else 64
    return METHODS[method](bits=bits, **kw)


def quantize_rtn(model: nn.Module, names: list[str], config: IntConfig, notes: list[str]) -> None:
    """Round-to-nearest codes for the named Linears (also GPTQ's fallback for Linears it never saw run)."""
    for name in names:
        lin = model.get_submodule(name)
        q, s, z = P.quantize_int(lin.weight.detach(), config.bits, config.group_size, config.symmetric)
        replace_module(model, name, IntLinear.from_codes(lin, q, s, z, bits=config.bits, group_size=config.group_size,
                                                         symmetric=config.symmetric, act_mode=config.activations))


def _suggest_group_size(ks: list[int], wanted: int) -> int:
    g = math.gcd(*ks)
    best = 1
    for cand in range(2, min(g, wanted) + 1, 2):
        if g % cand == 0:
            best = cand
    return best


def _check(model: nn.Module, names: list[str], config: IntConfig) -> None:
    ks = [model.get_submodule(n).in_features for n in names]
    g = config.group_size
    for n, k in zip(names, ks):
        if g is not None and k % g:
            raise ConfigError(f"group size {g} does not divide {n}'s in_features {k}; use --group-size "
                              f"{_suggest_group_size(ks, g)} (divides every quantized layer) or --exclude {n}")
        if config.bits == 4 and k % 2:
            raise ConfigError(f"{n}: in_features {k} is odd; int4 packs two codes per byte ({n} can be excluded)")


def _restore(config: IntConfig, linear: nn.Linear, dtype: torch.dtype, stored: Mapping[str, Tensor],
             where: str) -> IntLinear:
    return IntLinear.empty(linear, dtype, bits=config.bits, group_size=config.group_size, symmetric=config.symmetric,
                           stored=stored, where=where)


SCHEME = register_scheme(Scheme(
    name="integer", words={"int8": ("rtn", "gptq", "smoothquant"), "int4": ("rtn", "gptq", "awq")},
    configs=(IntConfig, GPTQConfig, AWQConfig, SmoothQuantConfig),
    modules=(IntLinear,), make_config=_make, quantize=quantize_rtn, restore=_restore, check=_check, tolerance=2e-2,
    speed="aten's int8 / int4 CPU kernels where they apply (kernel_note), else dequantize per forward"))
