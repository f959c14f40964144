"""Sweep recipes: YAML (yaml.safe_load) validated strictly into frozen dataclasses.

    target: zoo                      # zoo | zoo:<size> (built on first use) | smollm2-135m (converted from its
                                     # wheel) | a local HF-format directory | a .gguf file (converted, cached)
    drafter:                         # a drafter directory, or one distilled once and cached:
      distill: {family: eagle3, steps: 1500, data: zoo-train}     # + any DistillConfig field, and
        # regenerate: {sequences: 18432}  (RegenConfig fields): train on `data`'s prompts continued by the
        # target itself (`specpress regenerate`), regenerated once and cached; recipes/dflash.yaml. Or
        # regenerate: {self_instruct: 1024, new_tokens: 160}: chat conversations the target writes itself
        # (`regenerate --self-instruct`); recipes/smollm2.yaml
    grid:                            # see grid.py; the base drafter is always measured too
      - quantize: {scheme: [int8, fp8]}
      - prune: {ffn: 384, recover_steps: 100}   # what stays: 384 FFN channels (PruneConfig)
    policies: [chain:4]              # default: the drafter family's default policy
    prompts: {heldout: {n: 100, tokens: 64}}   # or a .jsonl file ({"prompt"} / {"input_ids"} per line), or
                                               # {questions: mt_bench/question.jsonl, n: 80}: first turns in the
                                               # target's chat template (specpress prompts --questions)
    temperatures: [0]                # default [0]
    backends: [torch]                # default [torch]; any name of runtime/backends' registry
    target_quant: [fp8, nvfp4:activations=static]   # compressed copies of the target to measure every point
                                     # against too (`--target-quant` specs; the float target is always measured,
                                     # first); calibrated specs calibrate on `calibration`
    max_new_tokens: 64
    seed: 0
    dtype: fp32                      # the target's (and drafter's compute) dtype: fp32 | bf16 | fp16
    float_dtype: auto                # dtype of the floats a compressed point stores (norms, unquantized
                                     # Linears): auto (the base's dtype when 16-bit, else bf16), fp32, bf16, fp16
    calibration: zoo-train           # data for gptq, prune importance / vocab, recovery: zoo-train | PATH
    agreement_batches: 4             # batches of [8, 128] windows for acc@k; 0 = off
    agreement_data: zoo-val          # zoo-val (held-out stdlib files) | PATH
    executor: {kind: ray, resources: {cpus: 4, gpus: 1, memory_gb: 16}, retries: 2}   # or local (default);
                                     # how points run, not part of the hash (executors.py)
    search:                          # only for --find-smallest: knob ranges searched beyond the grid (knobs.py)
      knobs: [{chain: [{prune: {head_rank: [16, 32]}}, {quantize: {scheme: [int8, int4], recover_steps: [0, 200]}}]}]
      margin: 0.05                   # skip, unbenched, candidates whose τ proxy is this far under the threshold
      proxy_batches: 2               # calibration windows of the proxy (teacher-forced acc@k, no decoding)
      objective: bytes               # or speed: the fastest benched candidate keeping τ

Data (`calibration`, `agreement_data`, `distill.data`): `zoo-train` / `zoo-val` (or `zoo:train` / `zoo:val`,
as the CLI's --data spells them) are the splits of the
zoo corpus (this interpreter's stdlib), tokenized with the target's tokenizer; a PATH is a text file, a
directory of text/code files, a .jsonl of {"text"} / {"messages"}, or a .jsonl of {"input_ids"} (already
tokenized; needs no tokenizer). Relative paths resolve against the recipe file's directory; existence is
checked when the sweep runs, not when the recipe loads. An unknown key is an error naming it and the
allowed ones; `name` and `description` are free text and do not enter the recipe hash.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from specpress.compress.data import ZOO_WORDS, DataSource
from specpress.errors import ConfigError, UsageError
from specpress.runtime import backends
from specpress.sweep.executors import parse_executor
from specpress.sweep.grid import Point, expand_grid

RECIPE_VERSION = 1
TOP_KEYS = ("version", "name", "description", "target", "drafter", "grid", "policies", "prompts", "temperatures",
            "backends", "max_new_tokens", "seed", "dtype", "float_dtype", "calibration", "agreement_batches",
            "agreement_data", "tolerate_failures", "executor", "target_quant", "search")
REQUIRED = ("target", "drafter", "grid", "prompts")
DTYPES = ("fp32", "bf16", "fp16")
BUNDLED = Path(__file__).resolve().parent.parent / "recipes"  # package data: `specpress sweep quickstart`


@dataclass(frozen=True)
class TargetSpec:
    zoo: str | None = None  # zoo preset name
    path: Path | None = None

    def to_json(self) -> str:
        return f"zoo:{self.zoo}" if self.zoo else str(self.path)


@dataclass(frozen=True)
class DistillSpec:
    config: Any  # DistillConfig
    data: DataSource
    regenerate: Any = None  # RegenConfig: train on `data`'s prompts continued by the target, or None

    def to_json(self) -> dict[str, Any]:
        out = {"config": self.config.to_dict(), "data": self.data.to_json()}
        if self.regenerate is not None:
            out["regenerate"] = asdict(self.regenerate)
        return out


@dataclass(frozen=True)
class DrafterSpec:
    path: Path | None = None
    distill: DistillSpec | None = None

    def to_json(self) -> Any:
        return {"distill": self.distill.to_json()} if self.distill else str(self.path)


@dataclass(frozen=True)
class PromptSpec:
    path: Path | None = None
    heldout_n: int = 0
    heldout_tokens: int = 64
    heldout_seed: int = 0
    questions: Path | None = None    # a FastChat / Spec-Bench question file: first turns in the chat template
    questions_n: int | None = None
    system: str | None = None

    def to_json(self) -> Any:
        if self.questions is not None:
            return {"questions": str(self.questions), "n": self.questions_n, "system": self.system}
        if self.path is not None:
            return str(self.path)
        return {"heldout": {"n": self.heldout_n, "tokens": self.heldout_tokens, "seed": self.heldout_seed}}


@dataclass(frozen=True)
class Recipe:
    target: TargetSpec
    drafter: DrafterSpec
    points: tuple[Point, ...]  # the base first
    prompts: PromptSpec
    policies: tuple[str, ...] = ()  # () = the drafter family's default
    temperatures: tuple[float, ...] = (0.0,)
    backends: tuple[str, ...] = ("torch",)
    max_new_tokens: int = 64
    seed: int = 0
    dtype: str = "fp32"
    float_dtype: str = "auto"
    calibration: DataSource = DataSource(zoo_split="train")
    agreement_batches: int = 4
    agreement_data: DataSource = DataSource(zoo_split="val")
    skipped: tuple[str, ...] = ()  # product combinations that do not exist
    name: str = ""
    description: str = ""
    source: Path | None = None
    tolerate_failures: bool = False  # a failed point still lets the sweep exit 0 (not in the hash: measures nothing)
    executor: Any = None  # executors.ExecutorSpec; how points run, kept out of to_dict and so of the hash
    target_quant: tuple[Any, ...] = ()  # TargetQuant specs besides the float target (compress/quantize/target.py)
    search: Any = None  # knobs.SearchSpec: candidates beyond the grid for --find-smallest, or None

    @property
    def targets(self) -> tuple[Any, ...]:
        """Every target the points are measured against: the float one first, then `target_quant`."""
        from specpress.compress.quantize.target import parse_target_quant

        return (parse_target_quant("none"), *self.target_quant)

    def target_spec(self, label: str) -> Any:
        from specpress.compress.quantize.target import find_target

        return find_target(self.targets, label)

    def point(self, pid: str) -> Point:
        """A grid point, or a candidate of the `search:` block, by id."""
        for p in (*self.points, *(self.search.points if self.search else ())):
            if p.id == pid:
                return p
        raise ConfigError(f"no grid point {pid!r}; points: {', '.join(p.id for p in self.points)}")

    def to_dict(self) -> dict[str, Any]:
        """Canonical JSON form (paths resolved); what the hash is taken of, plus name / description."""
        return {"version": RECIPE_VERSION, "name": self.name, "description": self.description,
                "target": self.target.to_json(), "drafter": self.drafter.to_json(),
                "points": [p.to_dict() for p in self.points], "policies": list(self.policies),
                "prompts": self.prompts.to_json(), "temperatures": list(self.temperatures),
                "backends": list(self.backends), "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                "dtype": self.dtype, "float_dtype": self.float_dtype, "calibration": self.calibration.to_json(),
                "agreement_batches": self.agreement_batches, "agreement_data": self.agreement_data.to_json(),
                **({"target_quant": [t.text for t in self.target_quant]} if self.target_quant else {}),
                **({"search": self.search.to_dict()} if self.search else {})}

    def hash(self) -> str:
        d = self.to_dict()
        d.pop("name")
        d.pop("description")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# Strict field readers: each error says where, what was expected and what was found
# ----------------------------------------------------------------------------------------------


def _found(v: Any) -> str:
    return f"{v!r} ({type(v).__name__})"


def _int(v: Any, where: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{where} must be an integer >= {lo}, found {_found(v)}")
    return v


def _flag(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{where} must be true or false, found {_found(v)}")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"{where} must be a non-empty string, found {_found(v)}")
    return v.strip()


def _list(v: Any, where: str, example: str) -> list[Any]:
    if not isinstance(v, list):
        raise ConfigError(f"{where} must be a list, e.g. {example}; found {_found(v)}")
    if not v:
        raise ConfigError(f"{where} is an empty list; give at least one, e.g. {example}")
    return v


def _keys(v: Any, where: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(v, Mapping):
        raise ConfigError(f"{where} must be a mapping, found {_found(v)}")
    for k in v:
        if k not in allowed:
            raise ConfigError(f"unknown key {k!r} in {where}; allowed: {', '.join(allowed)}")
    for k in required:
        if k not in v:
            raise ConfigError(f"{where} needs {k!r} (allowed: {', '.join(allowed)})")
    return dict(v)


def _path(v: Any, where: str, base: Path) -> Path:
    p = Path(_str(v, where)).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def _data(v: Any, where: str, base: Path) -> DataSource:
    s = _str(v, where)
    if s in ZOO_WORDS:
        return DataSource(zoo_split=ZOO_WORDS[s])
    if s == "drafter-data":
        if where == "drafter.distill.data":
            raise ConfigError(f"{where}: 'drafter-data' names the data the base drafter is distilled on, so it cannot "
                              f"be that data; give zoo-train, a path, or regenerate: {{self_instruct: N}}")
        return DataSource(drafter_data=True)
    if s.startswith("zoo"):
        raise ConfigError(f"{where}: {s!r} is not a zoo split; use zoo-train, zoo-val (or zoo:train, zoo:val) "
                          "or a path")
    return DataSource(path=_path(s, where, base))


def _target(v: Any, base: Path) -> TargetSpec:
    s = _str(v, "target")
    from specpress.zoo.real import REAL_TARGETS

    if s in REAL_TARGETS:  # `target: smollm2-135m`: the real target that installs from PyPI (zoo/real.py)
        return TargetSpec(zoo=s)
    if s == "zoo" or s.startswith("zoo:"):
        from specpress.zoo import PRESETS

        size = s.partition(":")[2] or "small"
        if size not in PRESETS and size not in REAL_TARGETS:
            raise ConfigError(f"target {s!r}: unknown zoo size {size!r}; sizes: {', '.join([*PRESETS, *REAL_TARGETS])}")
        return TargetSpec(zoo=size)
    return TargetSpec(path=_path(s, "target", base))


def _drafter(v: Any, base: Path) -> DrafterSpec:
    if isinstance(v, str):
        return DrafterSpec(path=_path(v, "drafter", base))
    from dataclasses import fields

    from specpress.compress.config import DistillConfig, record_keys
    from specpress.compress.regen import RegenConfig

    body = _keys(v, "drafter", ("distill",), ("distill",))["distill"]
    allowed = ("data", "regenerate", *record_keys(), "version")  # the family options flat, as in a record
    d = _keys(body, "drafter.distill", allowed, ("family",))
    data = _data(d.pop("data", "zoo-train"), "drafter.distill.data", base)
    regen = d.pop("regenerate", None)
    try:
        config = DistillConfig.from_dict(d)
        if isinstance(regen, dict) and "self_instruct" in regen:  # chat data the target writes (self_instruct.py)
            from specpress.compress.self_instruct import ChatRegenConfig

            names = {"self_instruct": "conversations", "new_tokens": "answer_tokens"}
            given = _keys(regen, "drafter.distill.regenerate", (*names, "query_tokens", "batch", "temperature",
                                                                "query_temperature", "query_top_p", "seed", "system"))
            regen = ChatRegenConfig(**{names.get(k, k): v for k, v in given.items()})
        elif regen is not None:
            regen = RegenConfig(**_keys(regen, "drafter.distill.regenerate", tuple(f.name for f in fields(RegenConfig))))
    except ConfigError as exc:
        raise ConfigError(f"drafter.distill: {exc}") from None
    return DrafterSpec(distill=DistillSpec(config, data, regen))


def _prompts(v: Any, base: Path) -> PromptSpec:
    if isinstance(v, str):
        return PromptSpec(path=_path(v, "prompts", base))
    if isinstance(v, dict) and "questions" in v:
        q = _keys(v, "prompts", ("questions", "n", "system"), ("questions",))
        system = q.get("system")
        if system is not None and not isinstance(system, str):
            raise ConfigError(f"prompts.system must be a string, found {system!r}")
        return PromptSpec(questions=_path(_str(q["questions"], "prompts.questions"), "prompts.questions", base),
                          questions_n=_int(q["n"], "prompts.n", 1) if q.get("n") is not None else None, system=system)
    h = _keys(_keys(v, "prompts", ("heldout", "questions"), ("heldout",))["heldout"], "prompts.heldout", ("n", "tokens", "seed"),
              ("n",))
    return PromptSpec(heldout_n=_int(h["n"], "prompts.heldout.n", 1),
                      heldout_tokens=_int(h.get("tokens", 64), "prompts.heldout.tokens", 1),
                      heldout_seed=_int(h.get("seed", 0), "prompts.heldout.seed", 0))


def _warn_legacy(points: tuple[Point, ...], where: str) -> None:
    """One deprecation warning per old spelling the grid's prune steps use (they still run, for one release)."""
    from specpress.errors import deprecated

    seen = set()
    for step in (s for p in points for s in p.steps if s.kind == "prune"):
        for old, new in step.config().legacy():
            if old not in seen:
                seen.add(old)
                deprecated(f"{where}: prune {old}", new)


def _policies(v: Any) -> tuple[str, ...]:
    from specpress.runtime.policy import parse_policy

    out = []
    for i, p in enumerate(_list(v, "policies", "[chain:4, 'dynamic:depth=5,topk=8,budget=32']")):
        try:
            out.append(str(parse_policy(_str(p, f"policies[{i}]"))))
        except UsageError as exc:
            raise ConfigError(f"policies[{i}]: {exc}") from None
    if len(set(out)) != len(out):
        raise ConfigError(f"policies lists a policy twice: {out}")
    return tuple(out)


def _temperatures(v: Any) -> tuple[float, ...]:
    out = []
    for i, t in enumerate(_list(v, "temperatures", "[0, 0.7]")):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
            raise ConfigError(f"temperatures[{i}] must be a number >= 0, found {_found(t)}")
        out.append(float(t))
    if len(set(out)) != len(out):
        raise ConfigError(f"temperatures lists a value twice: {out}")
    return tuple(out)


def _backends(v: Any) -> tuple[str, ...]:
    out = []
    for i, b in enumerate(_list(v, "backends", "[torch]")):
        b = _str(b, f"backends[{i}]")
        if b not in backends.names():
            raise ConfigError(f"backends[{i}]: {b!r} is not a backend sweeps can run; backends: "
                              f"{', '.join(backends.names())}")
        if b not in out:
            out.append(b)
    return tuple(out)


def parse_recipe(obj: Any, base_dir: Path, source: Path | None = None) -> Recipe:
    """Validate a recipe object (what yaml.safe_load returned); relative paths resolve against base_dir."""
    from specpress.compress.quantize.target import parse_target_list

    where = str(source) if source else "recipe"
    try:
        d = _keys(obj, "the recipe (top level)", TOP_KEYS, REQUIRED)
        ver = d.get("version", RECIPE_VERSION)
        if ver != RECIPE_VERSION:
            raise ConfigError(f"version {ver!r} is not readable; this specpress reads recipe version {RECIPE_VERSION}")
        points, skipped = expand_grid(d["grid"])
        search = None
        if "search" in d:
            from specpress.sweep.knobs import parse_search

            search, more = parse_search(d["search"], points)
            skipped += more
        _warn_legacy((*points, *(search.points if search else ())), where)
        dtype = _str(d.get("dtype", "fp32"), "dtype")
        if dtype not in DTYPES:
            raise ConfigError(f"dtype {dtype!r} is not known; choose one of {', '.join(DTYPES)}")
        float_dtype = _str(d.get("float_dtype", "auto"), "float_dtype")
        if float_dtype not in ("auto", *DTYPES):
            raise ConfigError(f"float_dtype {float_dtype!r} is not known; choose one of auto, {', '.join(DTYPES)}")
        return Recipe(
            target=_target(d["target"], base_dir), drafter=_drafter(d["drafter"], base_dir), points=points,
            prompts=_prompts(d["prompts"], base_dir),
            policies=_policies(d["policies"]) if "policies" in d else (),
            temperatures=_temperatures(d["temperatures"]) if "temperatures" in d else (0.0,),
            backends=_backends(d["backends"]) if "backends" in d else ("torch",),
            max_new_tokens=_int(d.get("max_new_tokens", 64), "max_new_tokens", 1),
            seed=_int(d.get("seed", 0), "seed", 0), dtype=dtype, float_dtype=float_dtype,
            calibration=_data(d.get("calibration", "zoo-train"), "calibration", base_dir),
            agreement_batches=_int(d.get("agreement_batches", 4), "agreement_batches", 0),
            agreement_data=_data(d.get("agreement_data", "zoo-val"), "agreement_data", base_dir),
            skipped=skipped, name=str(d.get("name") or (source.stem if source else "")),
            description=str(d.get("description") or ""), source=source,
            tolerate_failures=_flag(d.get("tolerate_failures", False), "tolerate_failures"),
            executor=parse_executor(d["executor"]) if "executor" in d else None,
            target_quant=() if "target_quant" not in d else parse_target_list(
                _list(d["target_quant"], "target_quant", "[fp8, int4, 'nvfp4:activations=static']"), "target_quant"),
            search=search)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def resolve_recipe_path(arg: str | Path) -> Path:
    """A recipe file, or the name of a bundled recipe (`quickstart`)."""
    p = Path(arg).expanduser()
    if p.is_file():
        return p.resolve()
    bundled = sorted(f.stem for f in BUNDLED.glob("*.yaml"))
    if str(arg) in bundled:
        return BUNDLED / f"{arg}.yaml"
    raise ConfigError(f"recipe {str(arg)!r} is neither a file nor a bundled recipe (bundled: {', '.join(bundled)})")


def load_recipe(arg: str | Path) -> Recipe:
    """Read and validate a recipe file (or a bundled recipe's name); its YAML is read safely first
    (recipe_yaml.read_recipe_yaml: size, aliases, depth, duplicate keys)."""
    from specpress.sweep.recipe_yaml import read_recipe_yaml

    path = resolve_recipe_path(arg)
    obj = read_recipe_yaml(path)
    if obj is None:
        raise ConfigError(f"{path}: the file is empty; a recipe needs {', '.join(REQUIRED)}")
    return parse_recipe(obj, path.parent, path)
