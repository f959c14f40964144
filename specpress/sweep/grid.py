"""The grid of a recipe: compression chains, expanded from product specs, each point an ordered list of steps.

A grid entry is one of

    {quantize: {scheme: int4, group_size: [32, 64], method: [rtn, gptq]}}    a stage; list values expand
    {prune: {ffn: [576, 384], recover_steps: 100}}                           (a product over every list)
    {chain: [{prune: {ffn: 384}}, {quantize: {scheme: [int8, int4]}}]}       stages in order; products chain
    [{prune: {ffn: 384}}, {quantize: {scheme: int4}}]                        the same, written as a list
    {quantize: {budget: [1MiB, 1.2MiB], candidates: [int8, int4:g64]}}       a scheme per Linear (quantize --budget)

with an optional `id` for an entry that expands to a single point. Every stage's fields are validated by
building its config (quantize: `config_for`, prune: `PruneConfig`); a combination of a product that does
not exist (nf4 with gptq, fp8 with a group size) is skipped and reported, an explicit one is an error.
`include` / `exclude` (quantize) are lists of module names and `candidates` a list of scheme words (or
one comma-separated string): they never expand; `budget` replaces `scheme` (with `candidates` and
`sensitivity`: kl, on the recipe's calibration windows, or weight). A calibrating quantize stage's
`target_quant` (a `--target-quant` spec) calibrates it against that compressed target instead of the float one
(`-on-<label>` in the point id): the drafter re-calibrated for a deployment beside that target. Quantization comes
last in a chain: prune refuses quantized drafters. Point ids are built from the settings (`int4-g64-gptq`,
`ffn384-r100`, `ffn384+int4-g64`, `kv2`; the deprecated prune shares keep their old ids, `ffn50` for
`ffn: 0.5`); `base` (no steps) is reserved and always measured.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from specpress.errors import ConfigError

BASE_ID = "base"
STAGES = ("quantize", "prune")
QUANTIZE_FIELDS = ("scheme", "method", "group_size", "symmetric", "activations", "act_calibration", "kv_cache",
                   "include", "exclude", "calib_batches", "batch", "seq_len", "calib_inputs", "recover_steps",
                   "recover_lr", "recover_scales", "recover_batch", "budget", "candidates", "sensitivity",
                   "target_quant")
RECOVER_KEYS = {"recover_steps": "steps", "recover_lr": "lr", "recover_scales": "scales", "recover_batch": "batch"}
BUDGET_ONLY = ("candidates", "sensitivity")  # quantize keys that go with `budget` (which replaces `scheme`)
BUDGET_DEFAULTS = {"candidates": "int8,int4", "sensitivity": "kl"}  # as `specpress quantize --budget` with data
NAME_LISTS = ("include", "exclude", "candidates")  # quantize fields whose list value is one setting, not a product axis
CALIB_DEFAULTS = {"calib_batches": 8, "batch": 4, "seq_len": 128}  # as `specpress quantize` (GPTQ: more, run.py)
CALIB_INPUTS = "rounds"  # as `specpress quantize --calib-inputs`
ENTRY_KEYS = ("id", "quantize", "prune", "chain")
_ID_OK = re.compile(r"[^A-Za-z0-9._+-]")


def _freeze(v: Any) -> Any:
    return tuple(_freeze(x) for x in v) if isinstance(v, (list, tuple)) else v


def _thaw(v: Any) -> Any:
    return [_thaw(x) for x in v] if isinstance(v, tuple) else v


@dataclass(frozen=True)
class Step:
    """One compression step: kind "quantize" or "prune" and its options (as written, hashable)."""

    kind: str
    options: tuple[tuple[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {self.kind: {k: _thaw(v) for k, v in self.options}}

    @property
    def is_budget(self) -> bool:
        """A quantize step that allocates a scheme per Linear (`budget`, as `quantize --budget`)."""
        return self.kind == "quantize" and "budget" in dict(self.options)

    def budget(self) -> tuple[Any, Any, str]:
        """(Budget, candidates, sensitivity) of a budget step, validated."""
        from specpress.compress.quantize.budget import MEASURES, parse_budget, parse_candidates

        opts = {**BUDGET_DEFAULTS, **dict(self.options)}
        cands = opts["candidates"]
        if opts["sensitivity"] not in MEASURES:
            raise ConfigError(f"sensitivity {opts['sensitivity']!r}: choose one of {', '.join(MEASURES)}")
        return (parse_budget(str(opts["budget"])),
                parse_candidates(",".join(cands) if isinstance(cands, tuple) else str(cands)), str(opts["sensitivity"]))

    def config(self) -> Any:
        """The step's compress config (QuantizeConfig or PruneConfig); ConfigError if it does not exist. A budget
        step's config only selects the Linears (include / exclude); `budget()` holds the rest."""
        opts = dict(self.options)
        if self.is_budget:
            from specpress.models.quantized.scheme import config_for

            self.budget()
            return config_for("int8", include=tuple(opts.get("include", ())), exclude=tuple(opts.get("exclude", ())))
        if self.kind == "quantize":
            from specpress.models.quantized.scheme import config_for

            return config_for(opts["scheme"], opts.get("method"), group_size=opts.get("group_size"),
                              symmetric=opts.get("symmetric"), include=tuple(opts.get("include", ())),
                              exclude=tuple(opts.get("exclude", ())), activations=opts.get("activations"),
                              act_calibration=_str_or_none(opts.get("act_calibration")),
                              kv_cache=opts.get("kv_cache"))
        from specpress.compress.prune import PruneConfig

        return PruneConfig.from_dict(opts)

    def recovery(self) -> Any:
        """A quantize step's RecoverConfig (quantize --recover-steps; windows of its seq_len, the recipe's seed
        given by the caller), or None when it asks for no recovery (recover_steps absent or 0: the other
        recover_* keys then do nothing, so that a product over recover_steps [0, N] shares them)."""
        opts = dict(self.options)
        if self.kind != "quantize" or not opts.get("recover_steps"):
            return None
        from specpress.compress.quantize.recover import RecoverConfig

        return RecoverConfig(**{v: opts[k] for k, v in RECOVER_KEYS.items() if k in opts},
                             seq_len=int(opts.get("seq_len", CALIB_DEFAULTS["seq_len"])))

    def calibration(self) -> dict[str, int]:
        """Calibration windows of a quantize step (used by configs that need data: gptq, static scales)."""
        opts = dict(self.options)
        return {k: int(opts.get(k, v)) for k, v in CALIB_DEFAULTS.items()}

    def calib_inputs(self) -> str:
        """What a quantize step calibrates on (`rounds[:POLICY]` or `first-step`, as `quantize --calib-inputs`)."""
        return str(dict(self.options).get("calib_inputs", CALIB_INPUTS))

    def target_quant(self) -> Any:
        """The compressed target a quantize step calibrates against (`quantize --target-quant`), or None: the
        float target. Only a step that calibrates (gptq / awq / smoothquant, static scales from data) takes it."""
        spec = dict(self.options).get("target_quant")
        if spec is None:
            return None
        from specpress.compress.quantize.target import parse_target_quant

        tq = parse_target_quant(str(spec))
        if not self.config().needs_data():
            raise ConfigError(f"target_quant {spec!r} sets the target a quantize step calibrates on, and "
                              f"{self.config().label()} does not calibrate (only method gptq / awq / smoothquant "
                              f"and static activation scales from data do)")
        return None if tq.is_float else tq

    def label(self) -> str:
        if self.kind == "prune":
            return prune_label(self.config())
        if self.is_budget:
            budget, cands, measure = self.budget()
            cfg = self.config()
            s = f"budget{budget.text}-" + "_".join(c.label for c in cands) + ("" if measure == "kl" else f"-{measure}")
            opts = dict(self.options)
            if measure == "kl":  # the sensitivity windows, when not the defaults
                s += "".join(f"-{tag}{opts[k]}" for k, tag in (("calib_batches", "cb"), ("seq_len", "sl"),
                                                               ("batch", "bt")) if opts.get(k, CALIB_DEFAULTS[k])
                             != CALIB_DEFAULTS[k])
            return s + "".join(f"-{k[:3]}_" + "_".join(getattr(cfg, k)) for k in ("include", "exclude")
                               if getattr(cfg, k))
        cfg, s = self.config(), str(self.config().label())
        rec = self.recovery()
        if cfg.needs_data() or rec is not None:  # calibration settings that change the result, when not the defaults
            opts = dict(self.options)
            s += "".join(f"-{tag}{opts[k]}" for k, tag in (("calib_batches", "cb"), ("seq_len", "sl"), ("batch", "bt"))
                         if k in opts and opts[k] != CALIB_DEFAULTS[k])
            if cfg.needs_data() and self.calib_inputs() != CALIB_INPUTS:
                s += "-" + ("fs" if self.calib_inputs() == "first-step" else self.calib_inputs().replace(":", "_"))
            tq = self.target_quant()
            if tq is not None:
                s += f"-on-{tq.label}"
        if rec is not None:
            from specpress.compress.quantize.recover import RecoverConfig

            d = RecoverConfig()
            s += f"-r{rec.steps}" + (f"-rlr{rec.lr:g}" if rec.lr != d.lr else "") + \
                ("-rederived" if rec.scales != d.scales else "") + (f"-rb{rec.batch}" if rec.batch != d.batch else "")
        return s


@dataclass(frozen=True)
class Point:
    """A grid point: an id and the ordered steps applied to the base drafter (none: the base itself)."""

    id: str
    steps: tuple[Step, ...] = ()

    @property
    def is_base(self) -> bool:
        return not self.steps

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "steps": [s.to_dict() for s in self.steps]}


BASE = Point(BASE_ID)


def _str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)


def _pct(r: float) -> str:
    return f"{r * 100:g}"


def prune_label(cfg: Any) -> str:
    from specpress.compress.prune import VOCAB_TOKENS

    parts = [f"{name}{_pct(getattr(cfg, name))}" for name in ("ffn", "heads")  # deprecated: shares removed
             if isinstance(getattr(cfg, name), float)]
    counts = (("ffn", "ffn"), ("kv_heads", "kv"), ("layers", "layers"), ("vocab", "vocab"))  # what stays
    parts += [f"{label}{getattr(cfg, name)}" for name, label in counts if isinstance(getattr(cfg, name), int)]
    if cfg.head_rank is not None:
        parts.append(f"headrank{cfg.head_rank}" + ("-actinit" if cfg.head_init == "activation" else ""))
    if cfg.share_head:
        parts.append("sharedhead")
    s = "-".join(parts)
    if cfg.structural and cfg.importance != "magnitude":
        s += f"-{cfg.importance}"
    if cfg.vocab is not None and cfg.vocab_source != "target":
        s += f"-v{cfg.vocab_source}"
    if cfg.vocab is not None and cfg.vocab_tokens != VOCAB_TOKENS:
        s += f"-vt{cfg.vocab_tokens}"
    if cfg.recover_steps:
        s += f"-r{cfg.recover_steps}"
    return s


def _stage_options(kind: str, body: Any, where: str) -> list[tuple[tuple[str, Any], ...]]:
    """Every option tuple a stage spec expands to (product over its list values)."""
    if not isinstance(body, Mapping):
        raise ConfigError(f"{where}: a {kind} stage is a mapping of its settings, found {type(body).__name__}")
    if kind == "quantize":
        allowed: Sequence[str] = QUANTIZE_FIELDS
        if "budget" in body:
            if any(k in body for k in RECOVER_KEYS):
                raise ConfigError(f"{where}: recovery (recover_*) trains one scheme's codes and `budget` writes a "
                                  f"scheme per Linear; recovery of a mixed drafter is not supported: drop one")
            mixed = [k for k in body if k not in ("budget", *BUDGET_ONLY, *NAME_LISTS, *CALIB_DEFAULTS)]
            if mixed:
                raise ConfigError(f"{where}: `budget` picks a scheme per Linear from `candidates`; drop "
                                  f"{', '.join(mixed)} (group sizes go in the candidates, e.g. int4:g128)")
        elif "scheme" not in body:
            from specpress.models.quantized.names import SCHEME_WORDS

            raise ConfigError(f"{where}: a quantize stage needs `scheme` ({', '.join(SCHEME_WORDS)}) or `budget` "
                              f"(a scheme per Linear)")
        elif any(k in body for k in BUDGET_ONLY):
            raise ConfigError(f"{where}: {', '.join(k for k in BUDGET_ONLY if k in body)} go with `budget`")
    else:
        from dataclasses import fields

        from specpress.compress.prune import PruneConfig

        allowed = [f.name for f in fields(PruneConfig)]
    unknown = [k for k in body if k not in allowed]
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} in a {kind} stage; allowed: {', '.join(allowed)}")
    axes: list[list[tuple[str, Any]]] = []
    for key, value in body.items():
        if key == "candidates" and isinstance(value, str):  # "int8,int4:g64": one setting
            axes.append([(key, value)])
        elif key in NAME_LISTS:
            if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                what = "scheme words" if key == "candidates" else "module names"
                raise ConfigError(f"{where}.{key}: a list of {what}, found {value!r}")
            axes.append([(key, tuple(value))])
        elif isinstance(value, list):
            if not value:
                raise ConfigError(f"{where}.{key}: an empty list expands to no points")
            if any(isinstance(x, (list, dict)) for x in value):
                raise ConfigError(f"{where}.{key}: list values must be scalars, found {value!r}")
            axes.append([(key, v) for v in value])
        elif isinstance(value, dict):
            raise ConfigError(f"{where}.{key}: a scalar or a list of scalars, found a mapping")
        else:
            axes.append([(key, value)])
    return [tuple(combo) for combo in itertools.product(*axes)]


def _check_calibration(step: Step, where: str) -> None:
    if step.kind == "quantize":
        step.target_quant()  # a bad spec, or one on a step that does not calibrate
    for k in CALIB_DEFAULTS:
        v = dict(step.options).get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"{where}.{k} must be a positive integer, found {v!r}")


def _stages(entry: Any, where: str) -> list[tuple[str, Any, str]]:
    """(kind, body, where) of each stage of an entry."""
    if isinstance(entry, list):
        chain, cwhere = entry, where
    elif isinstance(entry, Mapping):
        unknown = [k for k in entry if k not in ENTRY_KEYS]
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r} in a grid entry; allowed: {', '.join(ENTRY_KEYS)}")
        kinds = [k for k in ("quantize", "prune", "chain") if k in entry]
        if len(kinds) != 1:
            raise ConfigError(f"{where}: a grid entry holds exactly one of quantize, prune or chain, found "
                              f"{', '.join(kinds) or 'none'}")
        if kinds[0] != "chain":
            return [(kinds[0], entry[kinds[0]], f"{where}.{kinds[0]}")]
        chain, cwhere = entry["chain"], f"{where}.chain"
        if not isinstance(chain, list):
            raise ConfigError(f"{cwhere}: a list of stages, found {type(chain).__name__}")
    else:
        raise ConfigError(f"{where}: a grid entry is a mapping (quantize / prune / chain) or a list of stages, found "
                          f"{type(entry).__name__}")
    if not chain:
        raise ConfigError(f"{cwhere}: an empty chain; list at least one stage")
    out = []
    for i, stage in enumerate(chain):
        swhere = f"{cwhere}[{i}]"
        if not isinstance(stage, Mapping) or len(stage) != 1 or next(iter(stage)) not in STAGES:
            raise ConfigError(f"{swhere}: a stage is a mapping with one key, quantize or prune, found {stage!r}")
        kind = next(iter(stage))
        out.append((kind, stage[kind], f"{swhere}.{kind}"))
    return out


MAX_POINTS = 10_000  # a point is built and benched in minutes: more is weeks, or a typo


def _product_size(kind: str, body: Any) -> int:
    """How many option tuples a stage spec expands to, counted before expanding it."""
    if not isinstance(body, Mapping):
        return 1
    return math.prod(len(v) if isinstance(v, list) and k not in NAME_LISTS else 1 for k, v in body.items())


def check_grid_size(grid: Any, where: str = "grid", limit: int = MAX_POINTS, what: str = "a grid holds") -> None:
    """Refuse a grid that expands to more than `limit` points, with its size, before expanding it."""
    total = 0
    for i, entry in enumerate(grid if isinstance(grid, list) else []):
        try:
            stages = _stages(entry, f"{where}[{i}]")
        except ConfigError:
            continue  # expand_entry says what is wrong with it
        n = math.prod(_product_size(kind, body) for kind, body, _ in stages)
        total += n
        if total > limit:
            before = f" ({total:,} with the entries before it)" if total != n else ""
            raise ConfigError(f"{where}[{i}] expands to {n:,} points{before}; {what} at most {limit:,} "
                              f"(each point is built and measured): list fewer values")


def expand_entry(entry: Any, where: str) -> tuple[list[Point], list[str]]:
    """(points, skipped combinations with the reason) of one grid entry."""
    stages = _stages(entry, where)
    per_stage = [[Step(kind, opts) for opts in _stage_options(kind, body, w)] for kind, body, w in stages]
    product = any(len(s) > 1 for s in per_stage)
    points: list[Point] = []
    skipped: list[str] = []
    for steps in itertools.product(*per_stage):
        desc = " + ".join(f"{s.kind} {dict(s.options)}" for s in steps)
        try:
            labels = []
            for step, (_, _, w) in zip(steps, stages):
                _check_calibration(step, w)
                labels.append(step.label())
        except ConfigError as exc:
            if not product:
                raise ConfigError(f"{where}: {exc}") from None
            skipped.append(f"{where}: {desc}: {exc}")
            continue
        kinds = [s.kind for s in steps]
        if "quantize" in kinds and (kinds.count("quantize") > 1 or kinds[-1] != "quantize"):
            raise ConfigError(f"{where}: quantization must be the last step of a chain, and come once (prune refuses "
                              f"a quantized drafter); found {' -> '.join(kinds)}")
        points.append(Point(_ID_OK.sub("_", "+".join(labels)), tuple(steps)))
    if not points:
        raise ConfigError(f"{where}: no combination of this product exists:\n  " + "\n  ".join(skipped))
    if isinstance(entry, Mapping) and "id" in entry:
        pid = entry["id"]
        if not isinstance(pid, str) or not pid or _ID_OK.search(pid):
            raise ConfigError(f"{where}.id: a non-empty name of letters, digits and . _ + -, found {pid!r}")
        if len(points) != 1:
            raise ConfigError(f"{where}.id: names one point, but this entry expands to {len(points)}; drop `id`")
        points = [Point(pid, points[0].steps)]
    return points, skipped


def expand_grid(grid: Any, where: str = "grid") -> tuple[tuple[Point, ...], tuple[str, ...]]:
    """(points, skipped): the base first, then every entry's points in order; ids are unique."""
    if grid is None or (isinstance(grid, list) and not grid):
        raise ConfigError(f"{where} is empty: list at least one compression point (the base drafter is always "
                          f"measured too), e.g. `grid: [{{quantize: {{scheme: int8}}}}]`")
    if not isinstance(grid, list):
        raise ConfigError(f"{where} must be a list of entries, found {type(grid).__name__}")
    check_grid_size(grid, where)
    points: list[Point] = [BASE]
    skipped: list[str] = []
    seen: dict[str, Point] = {BASE_ID: BASE}
    for i, entry in enumerate(grid):
        pts, sk = expand_entry(entry, f"{where}[{i}]")
        skipped += sk
        for p in pts:
            if p.id in seen:
                same = seen[p.id].steps == p.steps
                raise ConfigError(f"{where}[{i}]: point {p.id!r} " + ("appears twice" if same else
                                  "has the same id as another point; give one of them an `id`")
                                  + ("" if p.id != BASE_ID else " (`base` is reserved for the uncompressed drafter)"))
            seen[p.id] = p
            points.append(p)
    return tuple(points), tuple(skipped)
