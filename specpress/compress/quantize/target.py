"""Compressing the target itself: `--target-quant SPEC` turns a loaded TargetModel into the model a
deployment would serve, with the drafters' own quantization schemes (the scheme registry, the `quantize`
verb and its calibrated methods), so that acceptance can be measured against a compressed target.

    tq = parse_target_quant("fp8")                         # W8A8: e4m3 weights, per-token activations
    summary = quantize_target(target, tq)                  # in place; returns what was done
    tq = parse_target_quant("nvfp4:activations=static")    # W4A4: needs calibration windows
    quantize_target(target, tq, TargetCalibration(WindowSampler(stream, 128, 4, 0)))

SPEC grammar (spaces not allowed; keys in any order, each at most once):

    SPEC    := WORD [":" OPTION ("," OPTION)*]
    WORD    := none | int8 | int4 | fp8 | nvfp4 | mxfp8 | mxfp4 | nf4 | fp4   (names.py; `none`: float weights)
    OPTION  := method=rtn|gptq|awq|smoothquant|bnb      how codes are chosen (the word's default: its first)
             | group=G                                  inputs per scale (int4 / nf4 / fp4; int8: per channel)
             | symmetric=true|false                     integer zero points
             | activations=none|dynamic|static          the scheme's activation quantizer (default: the word's)
             | calibration=max|mse|percentile:P|fixed:V|weights   how static input scales are chosen
             | kv=none|fp8                              the target's KV cache rounded to e4m3 per token and head
             | include=NAME[+NAME...]                   also quantize these (lm_head)
             | exclude=NAME[+NAME...]                   keep these in full precision

    `none:kv=fp8` keeps the weights in float and rounds only the KV cache.

Which Linears: every Linear of the decoder layers (q/k/v/o, gate/up/down); the embeddings always and the
lm_head unless `include=lm_head` stay in full precision, as vLLM's and llm-compressor's defaults keep them.
Methods that run the model (gptq, awq, smoothquant) and static activation scales found from data need
calibration windows: `TargetCalibration` runs the target itself over them (the same forward loop the
drafters' calibrated methods take); `fixed:V` and `weights` need none.

How the compressed target computes: every quantized Linear is wrapped in a `ReferenceLinear`, which
dequantizes its weight once and then computes the CPU reference of its scheme (the scheme's input
quantizer, then a float matmul with the dequantized weight, in the target's dtype). It never takes the
CPU int8 / int4 kernels the drafters use (they round activations to bf16, which is not the scheme), so
plain decoding and tree verification of the compressed target stay as exactly comparable as the float
target's (fp32 accumulation: lossless at temperature 0).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specpress.errors import ConfigError, UsageError, command_line
from specpress.models.quantized import names as N
from specpress.models.quantized.configs import QuantizeConfig

FLOAT = "none"  # the spec word of the float target
FLOAT_LABEL = "float"  # ... and its label in tables and run keys
OPTIONS = ("method", "group", "symmetric", "activations", "calibration", "kv", "include", "exclude")
GRAMMAR = ("SCHEME[:key=value,...] with SCHEME none or " + ", ".join(N.SCHEME_WORDS) + " and keys "
           + ", ".join(OPTIONS) + " (include / exclude: module names joined by +)")
CALIB_BATCHES, CALIB_BATCH, CALIB_SEQ_LEN = 8, 4, 128  # as `specpress quantize`'s defaults


@dataclass(frozen=True)
class TargetQuant:
    """A parsed --target-quant: the canonical text, the drafters' quantize config (None: float weights) and
    the KV cache format."""

    text: str
    config: QuantizeConfig | None = None
    kv: str = "none"

    @property
    def kv_cache(self) -> str:
        return self.config.kv_cache if self.config is not None else self.kv

    @property
    def is_float(self) -> bool:
        return self.config is None and self.kv_cache == "none"

    @property
    def label(self) -> str:
        """Its name in tables, point ids and run keys: `float`, `int4-g64`, `fp8-dyn`, `nvfp4-static`, `float-kv8`."""
        if self.config is not None:
            return str(self.config.label())
        return FLOAT_LABEL + ("-kv8" if self.kv_cache == "fp8" else "")

    def needs_data(self) -> bool:
        return self.config is not None and self.config.needs_data()

    @property
    def rounds_activations(self) -> bool:
        """Whether values computed at run time are rounded to a coarse grid (activation quantizers, the fp8
        KV cache): then a rounding-sized difference between two kernel shapes can move a value a whole grid
        step, and the lossless check needs `exact_emulation`."""
        return self.kv_cache == "fp8" or (self.config is not None and self.config.act_mode != "none")

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.text, "label": self.label, "kv_cache": self.kv_cache,
                "config": None if self.config is None else self.config.to_dict()}


def _flag(text: str, key: str, value: str) -> bool:
    if value.lower() in ("true", "yes", "1"):
        return True
    if value.lower() in ("false", "no", "0"):
        return False
    raise ConfigError(f"--target-quant {text!r}: {key}={value!r} must be true or false")


def parse_target_quant(text: Any) -> TargetQuant:
    """'int4:group=64,method=rtn' -> TargetQuant; a ConfigError naming the bad part and what exists."""
    from specpress.models.quantized.scheme import config_for

    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"--target-quant {text!r}: give {GRAMMAR}")
    text = text.strip()
    word, sep, rest = text.partition(":")
    if word != FLOAT and word not in N.BY_WORD:
        raise ConfigError(f"--target-quant {text!r}: unknown scheme {word!r}; choose none (float weights) or one of "
                          f"{', '.join(N.SCHEME_WORDS)}")
    opts: dict[str, str] = {}
    for part in rest.split(",") if sep else ():
        key, eq, value = part.partition("=")
        if not eq or not key or not value:
            raise ConfigError(f"--target-quant {text!r}: {part!r} is not key=value; the form is {GRAMMAR}")
        if key not in OPTIONS:
            raise ConfigError(f"--target-quant {text!r}: unknown option {key!r}; options: {', '.join(OPTIONS)}")
        if key in opts:
            raise ConfigError(f"--target-quant {text!r}: option {key!r} is given twice")
        opts[key] = value
    canonical = word + ("" if not opts else ":" + ",".join(f"{k}={opts[k]}" for k in OPTIONS if k in opts))
    kv = opts.get("kv")
    if kv is not None and kv not in ("none", "fp8"):
        raise ConfigError(f"--target-quant {text!r}: kv={kv!r}; choose none or fp8")
    if word == FLOAT:
        extra = [k for k in opts if k != "kv"]
        if extra:
            raise ConfigError(f"--target-quant {text!r}: none keeps the weights in float and takes only kv=fp8, "
                              f"not {', '.join(extra)}")
        return TargetQuant(canonical, None, kv or "none")
    group = opts.get("group")
    if group is not None and not group.isdigit():
        raise ConfigError(f"--target-quant {text!r}: group={group!r} must be a positive integer")
    names = {k: tuple(s for s in opts.get(k, "").split("+") if s) for k in ("include", "exclude")}
    symmetric = None if "symmetric" not in opts else _flag(text, "symmetric", opts["symmetric"])
    try:
        config = config_for(word, opts.get("method"), group_size=None if group is None else int(group),
                            symmetric=symmetric,
                            include=names["include"], exclude=names["exclude"], activations=opts.get("activations"),
                            act_calibration=opts.get("calibration"), kv_cache=kv)
    except ConfigError as exc:  # the scheme's own rule, in the CLI's words: say which spec it came from
        raise ConfigError(f"--target-quant {text!r}: {spec_words(str(exc))}") from None
    return TargetQuant(canonical, config)


_FLAGS = {"--method": "method", "--group-size": "group", "--activations": "activations",
          "--act-calibration": "calibration", "--kv-cache": "kv", "--include": "include", "--exclude": "exclude"}


def spec_words(message: str) -> str:
    """A scheme's error message (written in `specpress quantize`'s flags) in --target-quant's option words:
    `--group-size 8` -> `group=8`, a bare `--group-size` -> `group`, `--scheme int4` -> `int4`."""
    import re

    message = re.sub(r"--scheme (\S+)", r"\1", message).replace("--asymmetric", "symmetric=false")
    message = message.replace("of this drafter", "of the target")
    for flag, key in _FLAGS.items():
        value = r" (?!(?:and|or|with|do|does|not|is|only|goes)\b)('[^']*'|[\w.:*+-]+)"  # a flag's value, not prose
        message = re.sub(re.escape(flag) + value, key + r"=\1", message)
        message = message.replace(flag, key)
    return message


def parse_target_list(values: list[Any], where: str) -> tuple[TargetQuant, ...]:
    """A recipe's list of specs -> the compressed targets (`none` may be listed: the float target is always
    measured, so it is dropped); a duplicate label or a non-string is an error naming `where[i]`."""
    out: dict[str, TargetQuant] = {}
    for i, spec in enumerate(values):
        if isinstance(spec, bool) or not isinstance(spec, (str, int)):
            raise ConfigError(f"{where}[{i}] must be a --target-quant spec string, found {spec!r} "
                              f"({type(spec).__name__})")
        try:
            tq = parse_target_quant(str(spec))
        except ConfigError as exc:
            raise ConfigError(f"{where}[{i}]: {exc}") from None
        if tq.label in out:
            raise ConfigError(f"{where} lists {tq.label!r} twice ({out[tq.label].text!r} and {tq.text!r})")
        out[tq.label] = tq
    return tuple(tq for tq in out.values() if not tq.is_float)


def find_target(targets: tuple[TargetQuant, ...], label: str) -> TargetQuant:
    for tq in targets:
        if tq.label == label:
            return tq
    raise ConfigError(f"no target {label!r}; targets: {', '.join(t.label for t in targets)}")


def parse_spec(spec: str | None, data: str | None, data_default: str | None = None) -> TargetQuant | None:
    """The parsed --target-quant (None without it); refuses, before anything loads, a bad spec, a spec that
    needs data without any, and data without a spec that uses it. `data_default`: what a command calibrates
    on when --target-quant-data is not given (None: nothing, so a spec that needs data is refused)."""
    if spec is None:
        if data is not None:
            raise UsageError("--target-quant-data calibrates a --target-quant; pass --target-quant too")
        return None
    with command_line():  # --target-quant's value, wrong on its own: exit 2 (in a recipe it stays a ConfigError)
        tq = parse_target_quant(spec)
    if data is not None and tq.needs_data():
        from specpress.compress.data import check_data

        check_data(data)  # a missing path, a device or more text than memory: refused before the target loads
    if data is not None and not tq.needs_data():
        raise UsageError(f"--target-quant {tq.text!r} needs no calibration data (only method=gptq / awq / smoothquant "
                         f"and static activation scales found from data do): drop --target-quant-data")
    if tq.needs_data() and data is None and data_default is None:
        raise UsageError(needs_data_message(tq))
    return tq


# ----------------------------------------------------------------------------------------------
# Calibration: the target run over windows of data
# ----------------------------------------------------------------------------------------------


class TargetCalibration:
    """The forward loop calibrated methods take (ModelOpt's convention), for the target itself: every call
    runs the model given (the target being quantized) over `batches` sampler batches, no logits."""

    def __init__(self, sampler: Any, batches: int = CALIB_BATCHES) -> None:
        self.sampler, self.batches = sampler, batches
        self.windows = batches * sampler.batch
        self.tokens = self.windows * sampler.seq_len

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> None:
        dev = model.lm_head.weight.device
        for i in range(self.batches):
            model(self.sampler.batch_at(i).to(dev), logits="none")

    def describe(self) -> dict[str, Any]:
        s = self.sampler
        return {"windows": self.windows, "tokens": self.tokens, "seq_len": s.seq_len, "seed": s.seed}


# ----------------------------------------------------------------------------------------------
# Applying it
# ----------------------------------------------------------------------------------------------


class ReferenceLinear(nn.Module):
    """One quantized Linear of a compressed target, computed as its scheme's CPU reference with the weight
    dequantized once: y = F.linear(prepare_input(x), W_deq) + bias, where prepare_input is the scheme's own
    (pre_quant_scale, then its activation fake quantizer) and W_deq its own dequantize(). The quantized
    module stays inside (`quantized`) for its codes, scales and input quantizer."""

    def __init__(self, quantized: nn.Module) -> None:
        super().__init__()
        self.quantized = quantized
        self.in_features, self.out_features = quantized.in_features, quantized.out_features
        with torch.no_grad():
            self.register_buffer("weight", quantized.dequantize(quantized.compute_dtype), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N] in x's dtype. A float64 x (`exact_emulation`) is rounded to fp32 first: the
        input quantizer sees the fp32 activations a deployment computes, and two kernel shapes whose float64
        results differ in the last bits give it the same fp32 input."""
        wide = x.dtype == torch.float64
        x = self.quantized.prepare_input(x.float() if wide else x)
        if wide:
            x = x.double()
        bias = self.quantized.bias
        return F.linear(x, self.weight.to(x.dtype), None if bias is None else bias.to(x.dtype))


def exact_emulation(target: nn.Module) -> None:
    """Compute a compressed target in float64 (in place), its quantized Linears as fp32-input `ReferenceLinear`s.

    Why: in fp32, one-token cached steps (plain decoding) and a many-token forward (a verify pass) round
    differently in the last bits (1.6e-5 in the zoo target's logits), and an activation quantizer can turn that
    into a whole grid step (up to 0.36 in the logits for fp8 W8A8, 1.02 for NVFP4 W4A4: bench/target_invariance.py),
    so a correct speculative loop would differ from plain decoding on a few tokens. In float64 the two shapes
    agree to ~1e-16, and every value a quantizer or the fp8 KV cache rounds is first rounded to fp32, where they
    are equal. The codes and scales stay as quantized (in fp32); only the float arithmetic around them widens.
    Costs about 2x the fp32 forward on CPU."""
    quantized = [m.quantized for m in target.modules() if isinstance(m, ReferenceLinear)]
    target.to(torch.float64)
    for q in quantized:  # the codes' scales and the input quantizer as the scheme defines them
        q.to(torch.float32)


def quantize_target(target: nn.Module, tq: TargetQuant, calibration: Callable[[nn.Module], None] | None = None
                    ) -> dict[str, Any]:
    """Quantize `target`'s Linears in place per `tq` (the `quantize` verb, then every quantized module wrapped
    in a ReferenceLinear) and set its KV cache format; returns what was done (recorded beside results)."""
    from specpress.compress.quantize.api import quantize
    from specpress.models.quantized.modules import quantized_modules
    from specpress.models.quantized.restore import replace_module

    if getattr(target, "target_quant", None) is not None:
        raise UsageError("this target is already compressed; quantize a float copy of it")
    if tq.needs_data() and calibration is None:
        raise UsageError(needs_data_message(tq))
    summary: dict[str, Any] = {**tq.to_dict(), "quantized": 0}
    if tq.config is not None:
        try:
            quantize(target, tq.config, calibration if tq.needs_data() else None)
        except ConfigError as exc:  # a module selection or layer shape this spec cannot handle
            raise ConfigError(f"--target-quant {tq.text!r}: {spec_words(str(exc))}") from None
        step = dict(target.provenance[-1])
        for name, mod in quantized_modules(target).items():
            replace_module(target, name, ReferenceLinear(mod))
        sq = [v for v in step["weight_sqnr_db"].values() if v is not None]
        size = target.model.embed_tokens.weight.element_size()
        summary.update(quantized=len(step["quantized"]), kept=[s["module"] for s in step["skipped"]],
                       linear_bytes_before=int(step["quantized_params"]) * size,
                       linear_bytes_after=int(step["quantized_bytes"]), weight_sqnr_db_min=min(sq) if sq else None,
                       weight_sqnr_db_mean=round(sum(sq) / len(sq), 2) if sq else None, notes=list(step["notes"]),
                       **({"input_amax": step["input_amax"]} if step.get("input_amax") else {}))
        if tq.needs_data() and hasattr(calibration, "describe"):
            summary["calibration"] = calibration.describe()
    target.kv_cache_format = tq.kv_cache  # read by TargetModel.new_cache (models/kv.py Fp8KVCache)
    target.target_quant = tq
    return summary


def needs_data_message(tq: TargetQuant) -> str:
    cfg = tq.config
    assert cfg is not None
    what = f"method={cfg.method}" if cfg.needs_calibration else "activations=static"
    return (f"--target-quant {tq.text!r} ({what}) calibrates on the target's own activations: pass "
            f"--target-quant-data zoo:train (or a text / .jsonl path)" +
            ("" if cfg.needs_calibration else ", or choose scales without data with calibration=weights or "
             "calibration=fixed:V"))


def target_label(target: nn.Module) -> str:
    """The label of the compression a loaded target carries (`float` when none)."""
    tq = getattr(target, "target_quant", None)
    return FLOAT_LABEL if tq is None else tq.label


def compressed_copy(target: Any, tq: TargetQuant, stream: np.ndarray | None = None, *, seed: int = 0,
                    batches: int = CALIB_BATCHES) -> tuple[Any, dict[str, Any]]:
    """(a compressed copy of `target`, what was done); the float target is left as it is. `stream`: the
    calibration token stream a spec that needs data is calibrated on ([batches, 4, 128] windows). A spec that
    rounds activations or the KV cache is computed in float64 around its quantizers (`exact_emulation`), so
    that speculative decoding against it is checked exactly against its own plain decoding."""
    q = copy.deepcopy(target)
    summary = compress_in_place(q, tq, stream, seed=seed, batches=batches)
    if tq.rounds_activations:
        exact_emulation(q)
        summary["compute_dtype"] = "float64"
    return q.eval(), summary


def compress_in_place(target: Any, tq: TargetQuant, stream: np.ndarray | None = None, *, seed: int = 0,
                      batches: int = CALIB_BATCHES) -> dict[str, Any]:
    """compressed_copy without the copy (a command that needs no float target: distill, quantize)."""
    from specpress.compress.data import WindowSampler

    calibration = None
    if tq.needs_data():
        if stream is None:
            raise UsageError(needs_data_message(tq))
        seq = min(CALIB_SEQ_LEN, target.config.max_position_embeddings - 1, len(stream) - 1)
        calibration = TargetCalibration(WindowSampler(stream, seq, CALIB_BATCH, seed), batches)
    return quantize_target(target, tq, calibration)


def calibration_stream(data: str | Path, target_dir: str | Path, target: Any) -> np.ndarray:
    """--target-quant-data (zoo:train, zoo:val, a text file or directory, a .jsonl of text or of input_ids)
    -> the target's token stream, read the way sweeps read their calibration data."""
    from specpress.compress.data import DataSource, token_stream
    from specpress.models.tokenizer import load_tokenizer

    target_dir = Path(target_dir).expanduser()
    source = DataSource.parse(str(data))
    tok = load_tokenizer(target_dir) if (target_dir / "tokenizer.json").is_file() else None
    eos = target.config.eos_ids[0] if target.config.eos_ids else None
    return token_stream(source, tok, eos, target.config.vocab_size, target=target_dir)
