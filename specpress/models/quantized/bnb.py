"""bitsandbytes formats through bitsandbytes' own functions: nf4 / fp4 blocks and int8 rows (LLM.int8()).

Key scheme in model.safetensors, for a Linear named `<name>` (N = out_features, K = in_features):

    nf4 / fp4 (Bnb4bitLinear)   bitsandbytes' own Linear4bit keys: <name>.weight uint8 [N·K/2, 1],
                                <name>.weight.absmax float32 [N·K/blocksize], <name>.weight.quant_map
                                float32 [16], <name>.weight.quant_state.bitsandbytes__{nf4,fp4} (uint8 JSON)
    int8 (Bnb8bitLinear)        bitsandbytes' own Linear8bitLt keys: <name>.weight int8 [N, K],
                                <name>.SCB float32 [N], <name>.weight_format uint8 []

nf4 / fp4 run bitsandbytes' fused CPU kernel on bf16-rounded activations where it applies (bnb_cpu.py),
else bitsandbytes.matmul_4bit; bnb int8 dequantizes per forward.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch
from torch import Tensor, nn

from specpress.errors import CheckpointError, ConfigError, RequestError
from specpress.models.quantized import bnb_cpu
from specpress.models.quantized.configs import QuantizeConfig
from specpress.models.quantized.modules import QuantizedLinear, check_stored
from specpress.models.quantized.restore import replace_module
from specpress.models.quantized.scheme import Scheme, Words, register_scheme

BNB_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # what bitsandbytes' quantize_4bit accepts


IMPORT_NOTES: list[str] = []  # what bitsandbytes logged or warned while it was imported (kept, not printed)
IMPORT_LOGGERS = ("bitsandbytes", "kernels", "huggingface_hub")  # bitsandbytes' import fetches a hub kernel


class _Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        IMPORT_NOTES.append(f"{record.name}: {record.getMessage()}")


def import_bnb() -> Any:
    """bitsandbytes, or a RequestError that says how to get it. What its import logs or warns goes to
    IMPORT_NOTES, not to stderr, so that the user's first stderr line is specpress's: on an AVX512-BF16 CPU
    without the `kernels` package (or without network) bitsandbytes 0.50 logs "Failed to load CPU
    gemm_4bit_forward from kernels-community ... trust_remote_code" (offline, `kernels` logs "Skipping
    publisher trust check") - a kernel specpress does not use (bnb_cpu.py runs bitsandbytes' own gemv_4bit)."""
    if "bitsandbytes" in sys.modules:
        return sys.modules["bitsandbytes"]
    keep, loggers = _Keep(), [logging.getLogger(name) for name in IMPORT_LOGGERS]
    propagate = [lg.propagate for lg in loggers]
    for lg in loggers:
        lg.addHandler(keep)
        lg.propagate = False  # neither the root's handlers nor logging's last resort print it
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import bitsandbytes
    except ImportError as exc:
        raise RequestError(f"the nf4 / fp4 / bnb int8 schemes need bitsandbytes ({exc}); "
                           f"pip install bitsandbytes (0.50+ runs on CPU)") from None
    finally:
        for lg, was in zip(loggers, propagate):
            lg.removeHandler(keep)
            lg.propagate = was
    IMPORT_NOTES.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    return bitsandbytes


@dataclass(frozen=True)
class BnbConfig(QuantizeConfig):
    """bitsandbytes formats through bitsandbytes' own functions: nf4 / fp4 (quantize_4bit with
    `blocksize` over the row-major weight, no double quantisation) or int8 (int8_vectorwise_quant:
    per-row absmax, LLM.int8()'s weight format; blocksize does not apply)."""

    name: ClassVar[str] = "bnb"

    quant_type: str = "nf4"
    blocksize: int | None = 64

    def validate(self) -> None:
        if self.quant_type not in ("nf4", "fp4", "int8"):
            raise ConfigError(f"bitsandbytes quant_type must be nf4, fp4 or int8, found {self.quant_type!r}")
        if self.quant_type == "int8":
            if self.blocksize is not None:
                raise ConfigError("bitsandbytes int8 is per-row (vectorwise): a group/block size does not apply; "
                                  "drop --group-size")
        elif self.blocksize not in BNB_BLOCKSIZES:
            raise ConfigError(f"bitsandbytes {self.quant_type} blocksize must be one of "
                              f"{', '.join(map(str, BNB_BLOCKSIZES))}, found {self.blocksize!r}")

    @property
    def scheme(self) -> str:
        return self.quant_type

    @property
    def method(self) -> str:
        return "bnb"

    def storage_label(self) -> str:
        return self.quant_type + (f"-g{self.blocksize}" if self.blocksize else "") + \
            ("-bnb" if self.quant_type == "int8" else "")


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
            except RequestError as exc:
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
        check_stored(stored, {"weight": (torch.uint8, ((n * k + 1) // 2, 1)),
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
        check_stored(stored, lay, where)
        e = {key: torch.empty(shape, dtype=dt, device="meta") for key, (dt, shape) in lay.items()}
        return cls(k, n, linear.bias, dtype, packed=e["weight"], scb=e["SCB"], weight_format=e["weight_format"])

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        bnb = import_bnb()
        return bnb.functional.int8_vectorwise_dequant(self.packed, self.scb).to(dtype or self.compute_dtype)


def _make(word: str, method: str, w: Words) -> BnbConfig:
    if w.symmetric is False:
        raise ConfigError(f"bitsandbytes {word} has no asymmetric variant; drop --asymmetric")
    if w.activations not in (None, "none") or w.act_calibration is not None:
        raise ConfigError(f"bitsandbytes {word} is weight-only here: --activations / --act-calibration do not apply")
    default = None if word == "int8" else 64
    return BnbConfig(quant_type=word, blocksize=default if w.group_size is None else w.group_size,
                     **w.settings(drop=("group_size", "symmetric", "activations", "act_calibration")))


def _quantize(model: nn.Module, names: list[str], config: BnbConfig, notes: list[str]) -> None:
    for name in names:
        lin = model.get_submodule(name)
        new = Bnb8bitLinear.from_linear(lin) if config.quant_type == "int8" else \
            Bnb4bitLinear.from_linear(lin, config.quant_type, config.blocksize)  # type: ignore[arg-type]
        replace_module(model, name, new)
    if config.quant_type == "int8":
        notes.append("bnb int8 is weight-only here: computed by dequantising (bitsandbytes int8_vectorwise_dequant)")


def _check(model: nn.Module, names: list[str], config: BnbConfig) -> None:
    if config.blocksize is not None:
        # bitsandbytes 0.50's CPU dequantize_4bit kernel walks blocks row by row: a block that crosses a
        # row end decodes wrongly (SQNR ~10 dB instead of ~20), so blocks must tile each row.
        ks = [model.get_submodule(n).in_features for n in names]
        for n, k in zip(names, ks):
            if k % config.blocksize:
                ok = [b for b in BNB_BLOCKSIZES if all(kk % b == 0 for kk in ks)]
                fix = f"use --group-size {ok[-1]} or --exclude {n}" if ok else \
                    f"no bitsandbytes block size divides every layer: --exclude {n}"
                raise ConfigError(f"bitsandbytes block size {config.blocksize} does not divide {n}'s in_features "
                                  f"{k} (blocks must tile each row); {fix}")
    if names:
        bnb = import_bnb()
        w = model.get_submodule(names[0]).weight
        probe = torch.randn(4, 64, dtype=w.dtype, device=w.device)
        try:
            if config.quant_type == "int8":
                bnb.functional.int8_vectorwise_quant(probe)
            else:
                bnb.functional.quantize_4bit(probe, blocksize=config.blocksize, quant_type=config.quant_type)
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            raise RequestError(f"bitsandbytes {config.quant_type} cannot run on {w.device} with {w.dtype} weights here "
                               f"({exc}); try --scheme int4/int8 (torch-only) or another dtype/device") from None


def _restore(config: BnbConfig, linear: nn.Linear, dtype: torch.dtype, stored: Mapping[str, Tensor],
             where: str) -> QuantizedLinear:
    if config.quant_type == "int8":
        return Bnb8bitLinear.empty(linear, dtype, stored=stored, where=where)
    assert config.blocksize is not None
    return Bnb4bitLinear.empty(linear, dtype, quant_type=config.quant_type, blocksize=config.blocksize, stored=stored,
                               where=where)


SCHEME = register_scheme(Scheme(
    name="bnb", words={"nf4": ("bnb",), "fp4": ("bnb",), "int8": ("bnb",)}, configs=(BnbConfig,),
    modules=(Bnb4bitLinear, Bnb8bitLinear), make_config=_make, quantize=_quantize, restore=_restore, check=_check,
    # bitsandbytes' fused CPU kernel (gemv_4bit, bf16) rounds otherwise than onnxruntime's MatMulBnb4 fed the
    # same bf16 roundings: 0.3-0.6 % per Linear (64-192 inputs, measured), 4.4 % on the logits of a random
    # EAGLE-3 drafter after its real rounds (tests/compress/test_schemes.py); the other schemes stay at 2 %.
    tolerance=5e-2,
    speed="bitsandbytes' fused CPU kernel for nf4 / fp4 where it applies (kernel_note); bnb int8 dequantizes"))
