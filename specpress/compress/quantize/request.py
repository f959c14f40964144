"""What one quantize run is asked to do, checked and built without Click: `quantize_request(...)`.

The CLI's options map one to one onto its keywords (`specpress quantize --scheme int4` is
`quantize_request(scheme="int4")`); the combinations the CLI refuses are refused here, with the same
UsageError messages in the same order. The QuantizeRequest it returns holds what quantize_from_dirs takes:

    req = quantize_request(scheme="int4", group_size=64)
    rep = quantize_from_dirs(drafter_dir, req.config, out, **req.run_kwargs())
    print("\\n".join(report_lines(rep)))
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from specpress.errors import UsageError, command_line


DEFAULT_CANDIDATES = "int8,int4"  # --budget without --candidates


@dataclass(frozen=True)
class QuantizeRequest:
    config: Any  # QuantizeConfig: the uniform scheme, or with `budget` only the Linears it selects
    float_dtype: str  # --dtype: auto / fp32 / bf16 / fp16
    budget: Any = None  # Budget (budget.parse_budget) or None
    candidates: tuple[Any, ...] = ()  # Candidate (budget.parse_candidates); () without a budget
    sensitivity: str | None = None  # kl / weight / None (kl with a target, else weight)
    recovery: Any = None  # RecoverConfig (recover.py) or None
    resume: bool = False
    target_quant: Any = None  # TargetQuant (target.py) or None
    target_quant_data: str | None = None

    def run_kwargs(self) -> dict[str, Any]:
        """The keywords of quantize_from_dirs this request decides."""
        return {"float_dtype": self.float_dtype, "budget": self.budget, "candidates": self.candidates,
                "sensitivity": self.sensitivity, "recovery": self.recovery, "resume": self.resume,
                "target_quant": self.target_quant, "target_quant_data": self.target_quant_data}


def module_names(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """--include / --exclude as names: "fc, lm_head" or ["fc", "lm_head"] -> ("fc", "lm_head")."""
    items = (value or "").split(",") if isinstance(value, str) or value is None else value
    return tuple(s.strip() for s in items if s.strip())


def quantize_request(scheme: str | None = None, method: str | None = None, *, group_size: int | None = None,
                     symmetric: bool | None = None, activations: str | None = None,
                     act_calibration: str | None = None, kv_cache: str | None = None,
                     include: str | Iterable[str] | None = None, exclude: str | Iterable[str] | None = None,
                     budget: str | None = None, candidates: str | None = None, sensitivity: str | None = None,
                     dtype: str = "auto", legacy_float_dtype: str | None = None, recover_steps: int = 0,
                     recover_lr: float = 1e-4, recover_scales: str = "learned", recover_batch: int = 8,
                     seq_len: int = 128, seed: int = 0, target_quant: str | None = None,
                     target_quant_data: str | None = None, resume: bool = False) -> QuantizeRequest:
    """Check one combination of quantize's options and build what it asks for (defaults are the CLI's).

    Exactly one of `scheme` (one format for every Linear) and `budget` (a size: a scheme per Linear from
    `candidates`, DEFAULT_CANDIDATES when None); method / group size / symmetry / activations / KV cache only
    with `scheme`, `sensitivity` and `candidates` only with `budget`; `recover_steps` > 0 only with `scheme`;
    `resume` only with `recover_steps`.
    include / exclude: module names, comma-separated or a sequence. legacy_float_dtype: the deprecated
    --float-dtype spelling of `dtype` (warns, then replaces it). Raises UsageError naming the options to change.
    """
    from specpress.compress.quantize.recover import RecoverConfig
    from specpress.compress.quantize.target import parse_spec
    from specpress.errors import deprecated
    from specpress.models.quantized.scheme import config_for

    if legacy_float_dtype is not None:
        short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(legacy_float_dtype, legacy_float_dtype)
        deprecated(f"--float-dtype {legacy_float_dtype}", f"use --dtype {short}")
        dtype = short
    parsed_budget = cands = None
    if budget is not None:
        from specpress.compress.quantize.budget import parse_budget, parse_candidates

        given = [f for f, v in (("--scheme", scheme), ("--method", method), ("--group-size", group_size),
                                ("--symmetric/--asymmetric", symmetric), ("--activations", activations),
                                ("--act-calibration", act_calibration), ("--kv-cache", kv_cache)) if v is not None]
        if given:
            raise UsageError(f"--budget picks a scheme per Linear from --candidates: drop {', '.join(given)} (group "
                             f"sizes and methods go in the candidates, e.g. int4:g128)")
        if recover_steps:
            raise UsageError("--recover-steps trains one scheme's codes; --budget writes a scheme per Linear, whose "
                             "recovery is not supported: drop one")
        parsed_budget, cands = parse_budget(budget), parse_candidates(candidates or DEFAULT_CANDIDATES)
        scheme = "int8"  # only selects the Linears (--include / --exclude); the allocation picks their schemes
    elif scheme is None:
        raise UsageError("give --scheme WORD (one format for every Linear) or --budget SIZE (one per Linear)")
    elif sensitivity is not None:
        raise UsageError("--sensitivity scores the candidates of --budget; give --budget SIZE or drop it")
    elif candidates is not None:
        raise UsageError(f"--candidates lists the schemes --budget picks from; without --budget every Linear gets "
                         f"--scheme {scheme} and --candidates {candidates} would be ignored: give --budget SIZE or "
                         f"drop --candidates")
    with command_line():  # a combination no scheme defines: the command line is wrong (exit 2)
        config = config_for(scheme, method, group_size=group_size, symmetric=symmetric,
                            include=module_names(include), exclude=module_names(exclude), activations=activations,
                            act_calibration=act_calibration, kv_cache=kv_cache)
    tq = parse_spec(target_quant, target_quant_data, data_default="--data")
    recovery = RecoverConfig(steps=recover_steps, lr=recover_lr, scales=recover_scales, batch=recover_batch,
                             seq_len=seq_len, seed=seed) if recover_steps else None
    if resume and recovery is None:
        raise UsageError("--resume continues an interrupted recovery: give --recover-steps N as before")
    return QuantizeRequest(config=config, float_dtype=dtype, budget=parsed_budget, candidates=tuple(cands or ()),
                           sensitivity=sensitivity, recovery=recovery, resume=resume, target_quant=tq,
                           target_quant_data=target_quant_data)
