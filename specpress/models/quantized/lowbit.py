"""Low-bit integer codes: int3, int2 and ternary (1.58-bit) weights with an fp16 scale per group of inputs.

Key scheme in model.safetensors, for a Linear named `<name>` (N = out_features, K = in_features, G = group
size; w = (q - zero) · scale, primitives.py):

    int3     <name>.qweight  uint8 [N, 3K/8]      codes 0..7, 8 in 3 bytes (primitives.pack_bits, LSB first)
    int2     <name>.qweight  uint8 [N, K/4]       codes 0..3, 4 per byte
    ternary  <name>.qweight  uint8 [N, ceil(K/5)]  codes 0..2 (-1, 0, +1), 5 per byte in base 3 (pack_trits):
                                                  1.6 bits per code (a row of K = 512 takes 103 bytes)
    all      <name>.scales   float16 [N, K/G]
             <name>.qzeros   uint8 [N, K/G]       int3 / int2 with --asymmetric only (symmetric: zero 2^(b-1))

Scales are fp16, not the float32 of int4 / int8: at 2 bits a float32 scale per 64 weights would be a fifth
of the bytes (2.5 bits per weight instead of 2.25). Round to nearest under the scale: symmetric int3 / int2
take llama.cpp's signed-max rule (the group's largest-magnitude weight maps exactly to the most negative
code), asymmetric ones min / max; ternary's scale is the group's mean |w| (BitNet b1.58's absmean: an
absmax scale would round most weights to 0); `--method gptq` chooses the codes by GPTQ under the same rules.
These schemes lose much of a drafter's acceptance as rounded;
`quantize --recover-steps` (compress/quantize/recover.py) trains the codes back.

Computed on the CPU by aten's int4 kernel (int4_cpu.py): a b-bit code shifted to q - zero + 8 is an int4
code (1..15 for b <= 3) whose kernel weight (q - zero + 8 - 8) · scale is the stored one, so the codes are
re-packed once at load into its layout (N·K/2 bytes in memory beside the stored codes, none on disk) and
multiplied on bf16-rounded activations, as int4 is. Where the kernel does not apply (group sizes other than
32-256, N not a multiple of 16, other devices, grad-tracking inputs) the weight is dequantized per forward;
`kernel_note` says which path and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from specpress.errors import ConfigError
from specpress.models.quantized import int4_cpu
from specpress.models.quantized import primitives as P
from specpress.models.quantized.configs import GPTQSettings, QuantizeConfig, positive_int
from specpress.models.quantized.modules import QuantizedLinear, check_stored, replace_module
from specpress.models.quantized.scheme import Scheme, Words, register_scheme

FORMATS = ("int3", "int2", "ternary")
BITS = {"int3": 3, "int2": 2, "ternary": 2}  # the code width in a power-of-two-free bit stream (ternary: its
# container when written as 2-bit codes: ONNX MatMulNBits, compressed-tensors)
PACK_MULTIPLE = {"int3": 8, "int2": 4, "ternary": 1}  # K must be a multiple of this (whole bytes per row)
SCALE_DTYPE = torch.float16
NOTE = "dequantize per forward (no 2-/3-bit or ternary matmul of its own): saves bytes, not time"
KERNEL_NOTE = f"{int4_cpu.NAME}, its b-bit codes held as int4 codes"


@dataclass(frozen=True)
class LowBitConfig(QuantizeConfig):
    """int3 / int2 / ternary codes in groups of `group_size` inputs with fp16 scales, round-to-nearest (see the
    module docstring for each format's scale rule); weight-only. Ternary is symmetric by definition."""

    name: ClassVar[str] = "lowbit"

    format: str = "int2"
    group_size: int = 64
    symmetric: bool = True

    def validate(self) -> None:
        if self.format not in FORMATS:
            raise ConfigError(f"low-bit format must be one of {', '.join(FORMATS)}, found {self.format!r}")
        positive_int(self.group_size, "group_size")
        if not isinstance(self.symmetric, bool):
            raise ConfigError(f"symmetric must be true or false, found {self.symmetric!r}")
        if self.format == "ternary" and not self.symmetric:
            raise ConfigError("ternary codes are {-1, 0, +1} times a scale: --asymmetric does not apply")

    @property
    def scheme(self) -> str:
        return self.format

    @property
    def method(self) -> str:
        return "rtn"

    def storage_label(self) -> str:
        return f"{self.format}-g{self.group_size}" + ("" if self.symmetric else "-asym")


@dataclass(frozen=True)
class LowBitGPTQConfig(GPTQSettings, LowBitConfig):
    """LowBitConfig's storage with codes chosen by GPTQ (integer.GPTQConfig's column loop, each group's scale by
    the format's rule on the error-compensated weights; compress/quantize/gptq.py). The settings (damp,
    block_size, sequential) are configs.GPTQSettings'."""

    name: ClassVar[str] = "lowbit-gptq"

    def storage_label(self) -> str:
        return super().storage_label() + "-gptq"

    def sizing_config(self) -> LowBitConfig:
        return LowBitConfig(format=self.format, group_size=self.group_size, symmetric=self.symmetric,
                            include=self.include, exclude=self.exclude)


def code_range(fmt: str, symmetric: bool) -> tuple[int, int]:
    """The unsigned codes a format uses: ternary 0..2, int-b 0..2^b - 1."""
    return (0, 2) if fmt == "ternary" else P.code_range(BITS[fmt], symmetric)


def packed_width(fmt: str, k: int) -> int:
    """Bytes per row of K codes."""
    return -(-k // P.TRITS_PER_BYTE) if fmt == "ternary" else k * BITS[fmt] // 8


def rtn_params(w: Tensor, fmt: str, group_size: int, symmetric: bool) -> tuple[Tensor, Tensor]:
    """Scales (fp16-representable float32) and zero points [N, K/G] of W [N, K] by the format's rule."""
    if fmt != "ternary":
        return P.int_params(w, BITS[fmt], group_size, symmetric, SCALE_DTYPE)
    n, k = w.shape
    mean = w.float().reshape(n, k // group_size, group_size).abs().mean(-1)
    scale = P.round_scale(torch.where(mean == 0, torch.ones_like(mean), mean), SCALE_DTYPE)
    return scale, torch.ones_like(scale)


def quantize_lowbit(w: Tensor, fmt: str, group_size: int, symmetric: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Round-to-nearest: W [N, K] -> (codes [N, K] int16, scales, zeros [N, K/G] float32)."""
    s, z = rtn_params(w, fmt, group_size, symmetric)
    return P.quantize_with(w, s, z, BITS[fmt], symmetric, code_range(fmt, symmetric)), s, z


class LowBitLinear(QuantizedLinear):
    """int3 / int2 / ternary codes with fp16 scales per group of `group_size` inputs, computed by aten's int4
    kernel on the CPU where it applies (the module docstring), else by dequantising."""

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None, dtype: torch.dtype, *,
                 format: str, group_size: int, symmetric: bool, qweight: Tensor, scales: Tensor,
                 qzeros: Tensor | None = None) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self.format, self.group_size, self.symmetric = format, group_size, symmetric
        self.KEYS = {"qweight": "qweight", "scales": "scales"} | ({} if symmetric else {"qzeros": "qzeros"})
        self._register_quant({"qweight": qweight, "scales": scales} | ({} if symmetric else {"qzeros": qzeros}))
        self._refresh()

    def _refresh(self) -> None:
        # The codes re-packed once (at load, after a move) into aten's int4 kernel layout, shifted so that their
        # zero point is the kernel's own 8: q - z + 8 lies in 1..15 for every b <= 3, and the kernel's
        # (q' - 8)·s + (8 - 8)·s is (q - z)·s with no zero term to round (passing z instead puts a bf16-rounded
        # (8 - z)·s on every weight of the group: 1.5 % output error for ternary against 0.3 % this way).
        why = "weights not loaded yet" if self.qweight.is_meta else int4_cpu.kernel_unavailable(
            self.out_features, self.in_features, self.group_size, self.qweight.device, self.compute_dtype)
        packed = sz = None
        if why is None:
            z = self.zeros().to(torch.int16).repeat_interleave(self.group_size, dim=1)
            packed, sz = int4_cpu.pack(self.codes() - z + 8, self.scales, torch.full_like(self.scales, 8.0))
        self.kernel_note = KERNEL_NOTE if why is None else f"{NOTE}: {why}"
        self.register_buffer("int4_packed", packed, persistent=False)
        self.register_buffer("int4_sz", sz, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N] in x's dtype: through the int4 kernel on bf16-rounded activations where it
        applies (fp32 / bf16 inputs on the CPU, no grad), else the dequantized product."""
        x = self.prepare_input(x)
        if self.int4_packed is None or x.device.type != "cpu" or x.dtype not in int4_cpu.ACTIVATION_DTYPES \
                or (x.requires_grad and torch.is_grad_enabled()):
            return self.dequantized_product(x)
        y = int4_cpu.matmul(x, self.int4_packed, self.group_size, self.int4_sz)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    @property
    def scheme(self) -> str:  # type: ignore[override]
        return self.format

    @staticmethod
    def layout(n: int, k: int, fmt: str, group_size: int, symmetric: bool
               ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """Stored key -> (dtype, shape) for an [N, K] weight."""
        ng = k // group_size
        out = {"qweight": (torch.uint8, (n, packed_width(fmt, k))), "scales": (SCALE_DTYPE, (n, ng))}
        if not symmetric:
            out["qzeros"] = (torch.uint8, (n, ng))
        return out

    @classmethod
    def from_codes(cls, linear: nn.Linear, q: Tensor, scale: Tensor, zero: Tensor, *, format: str, group_size: int,
                   symmetric: bool) -> LowBitLinear:
        """Codes q [N, K] (unsigned range), fp16-representable scales / zeros [N, K/G] -> module."""
        qweight = P.pack_trits(q) if format == "ternary" else P.pack_bits(q, BITS[format])
        dev = linear.weight.device
        return cls(linear.in_features, linear.out_features, linear.bias, linear.weight.dtype, format=format,
                   group_size=group_size, symmetric=symmetric, qweight=qweight.to(dev),
                   scales=scale.to(SCALE_DTYPE).to(dev), qzeros=None if symmetric else zero.to(torch.uint8).to(dev))

    @classmethod
    def empty(cls, linear: nn.Linear, dtype: torch.dtype, *, format: str, group_size: int, symmetric: bool,
              stored: Mapping[str, Tensor], where: str) -> LowBitLinear:
        lay = cls.layout(linear.out_features, linear.in_features, format, group_size, symmetric)
        check_stored(stored, lay, where)
        t = {k: torch.empty(shape, dtype=dt, device="meta") for k, (dt, shape) in lay.items()}
        return cls(linear.in_features, linear.out_features, linear.bias, dtype, format=format, group_size=group_size,
                   symmetric=symmetric, qweight=t["qweight"], scales=t["scales"], qzeros=t.get("qzeros"))

    def codes(self) -> Tensor:
        """Unsigned codes [N, K] (int16): ternary 0..2, int-b 0..2^b - 1."""
        if self.format == "ternary":
            return P.unpack_trits(self.qweight, self.in_features).to(torch.int16)
        return P.unpack_bits(self.qweight, BITS[self.format], self.in_features).to(torch.int16)

    def zeros(self) -> Tensor:
        if not self.symmetric:
            return self.qzeros.float()
        return torch.full(self.scales.shape, 1.0 if self.format == "ternary" else 2.0 ** (BITS[self.format] - 1),
                          device=self.scales.device)

    def container_codes(self) -> tuple[Tensor, Tensor, int]:
        """(codes, zeros, bits) as plain b-bit codes with the symmetric zero 2^(b-1): ternary's 0..2 with zero 1
        become 2-bit codes 1..3 with zero 2 (the same weights), which ONNX MatMulNBits and compressed-tensors'
        2-bit pack-quantized hold."""
        if self.format == "ternary":
            return self.codes() + 1, self.zeros() + 1, 2
        return self.codes(), self.zeros(), BITS[self.format]

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        return P.dequantize_int(self.codes(), self.scales.float(), self.zeros(), dtype or self.compute_dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}, " \
               f"{'symmetric' if self.symmetric else 'asymmetric'}, {self.kernel_note}"


# ----------------------------------------------------------------------------------------------
# The descriptor
# ----------------------------------------------------------------------------------------------


def _make(word: str, method: str, w: Words) -> LowBitConfig:
    if w.activations not in (None, "none") or w.act_calibration is not None:
        raise ConfigError(f"{word} is weight-only: --activations / --act-calibration do not apply")
    if word == "ternary" and w.symmetric is False:
        raise ConfigError("ternary codes are {-1, 0, +1} times a scale: --asymmetric does not apply")
    kw = w.settings(drop=("activations", "act_calibration"))
    return (LowBitGPTQConfig if method == "gptq" else LowBitConfig)(format=word, **kw)


def quantize_rtn(model: nn.Module, names: list[str], config: LowBitConfig, notes: list[str]) -> None:
    for name in names:
        lin = model.get_submodule(name)
        q, s, z = quantize_lowbit(lin.weight.detach(), config.format, config.group_size, config.symmetric)
        replace_module(model, name, LowBitLinear.from_codes(lin, q, s, z, format=config.format,
                                                            group_size=config.group_size, symmetric=config.symmetric))


def _check(model: nn.Module, names: list[str], config: LowBitConfig) -> None:
    g, m = config.group_size, PACK_MULTIPLE[config.format]
    for n in names:
        k = model.get_submodule(n).in_features
        if k % g:
            raise ConfigError(f"group size {g} does not divide {n}'s in_features {k}; choose a --group-size that "
                              f"divides every quantized Linear's in_features, or --exclude {n}")
        if k % m:
            raise ConfigError(f"{n}: in_features {k} is not a multiple of {m}; {config.format} packs {m} codes into "
                              f"whole bytes (--exclude {n})")


def _restore(config: LowBitConfig, linear: nn.Linear, dtype: torch.dtype, stored: Mapping[str, Tensor],
             where: str) -> LowBitLinear:
    return LowBitLinear.empty(linear, dtype, format=config.format, group_size=config.group_size,
                              symmetric=config.symmetric, stored=stored, where=where)


SCHEME = register_scheme(Scheme(
    name="lowbit", words={"int3": ("rtn", "gptq"), "int2": ("rtn", "gptq"), "ternary": ("rtn", "gptq")},
    configs=(LowBitConfig, LowBitGPTQConfig),
    modules=(LowBitLinear,), make_config=_make, quantize=quantize_rtn, restore=_restore, check=_check,
    tolerance=2e-2, speed="aten's int4 CPU kernel where it applies (kernel_note), else dequantize per forward"))
