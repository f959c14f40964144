"""Planning a sweep recipe: one Plan per point (the base drafter, then each grid point), as the sweep runs it
in one process: the target loaded once in the recipe's dtype, each point's drafter built from the base by its
steps (each step planned as its command is), then acc@k and a bench per policy x temperature x backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specpress.errors import RequestError
from specpress.plan import ORT_SESSIONS, DrafterFacts, Plan, base_bytes, drafter_facts, kv_bytes, target_facts
from specpress.plan.commands import plan_distill, plan_prune, plan_quantize
from specpress.runtime.backends import get_backend
from specpress.sweep.size import bench_work


def _target_dir(recipe: Any) -> Path:
    spec = recipe.target
    if spec.zoo is None:
        return Path(spec.path)
    from specpress.zoo import default_zoo_dir, is_zoo_dir

    cached = default_zoo_dir(spec.zoo)
    if not is_zoo_dir(cached):
        raise RequestError(f"the recipe's zoo target ({spec.zoo}) is not built yet; `specpress zoo build --size "
                         f"{spec.zoo}` makes it (minutes), then plan again")
    return cached


def _data(source: Any) -> str:
    return f"zoo:{source.zoo_split}" if source.zoo_split else str(source.path)


def _distilled(recipe: Any, target_dir: Path) -> tuple[DrafterFacts, Plan]:
    """The facts of a drafter the recipe distills first (its student on the meta device), and its plan."""
    from specpress.compress.students import student_config
    from specpress.models.drafter import build_drafter
    from specpress.models.target import TargetModel

    spec = recipe.drafter.distill
    cfg = spec.config
    params = {**cfg.to_dict(), "target_dir": target_dir, "data_path": _data(spec.data), "target_dtype": recipe.dtype}
    t = target_facts(target_dir, recipe.dtype)
    with torch.device("meta"):
        target = TargetModel(t.cfg)
        target.stored_weights_sha256 = "meta"
        student = build_drafter(student_config(cfg, t.cfg), target)
    n = sum(p.numel() for p in student.parameters())
    return DrafterFacts(cfg.family, student, n, 4 * n, 4 * n), plan_distill(params)


def plan_sweep(arg: str | Path) -> list[Plan]:
    """A plan per point of the recipe `arg` (a path or a bundled recipe's name); a drafter the recipe distills
    first comes first, as its own plan."""
    from specpress.sweep.recipe import load_recipe

    recipe = load_recipe(arg)
    tdir = _target_dir(recipe)
    t = target_facts(tdir, recipe.dtype)
    plans: list[Plan] = []
    if recipe.drafter.distill is not None:
        d, distill = _distilled(recipe, tdir)
        distill.command = "sweep: distill the base drafter"
        plans.append(distill)
        ddir = None
    else:
        ddir = recipe.drafter.path
        d = drafter_facts(ddir)
    runs, bench_tokens = bench_work(recipe)
    onnx = any(get_backend(b).reads != "drafter" for b in recipe.backends)
    calib = _data(recipe.calibration)
    for point in recipe.points:
        phases: dict[str, dict[str, int]] = {}
        work: dict[str, Any] = {"target_forwards": 0, "target_tokens": 0}
        holds = {"target": t.bytes, "drafter": d.held}
        for i, step in enumerate(point.steps):
            opts = dict(step.options)
            p = {**opts, "drafter_dir": ddir, "_drafter": d, "_config": step.config(), "target_dir": tdir,
                 "data_path": calib, "target_dtype": recipe.dtype}
            if step.kind == "quantize":
                p.setdefault("batch", 4)
                p.setdefault("seq_len", 128)
                p["eval_batches"] = 0
                sub = plan_quantize(p)
            else:
                sub = plan_prune({**p, **step.config().to_dict()})
            for name, parts in sub.phases.items():
                phases[f"{i + 1}. {step.kind} {name}"] = {**parts, "target": t.bytes}
            holds.update({k: v for k, v in sub.holds.items() if k not in holds})
            for k in ("target_forwards", "target_tokens"):
                v = sub.work.get(k)
                work[k] += v if isinstance(v, int) else 0
        ort = d.params * 4 if onnx else 0
        phases["acc@k and bench"] = {"target": t.bytes, "drafter": d.held,
                                     "kv caches": 2 * kv_bytes(t.cfg, recipe.max_new_tokens + 512, t.es),
                                     **({"onnxruntime drafter (packed + mapped)": 2 * ort + ORT_SESSIONS}
                                        if onnx else {})}
        work["target_forwards"] += recipe.agreement_batches + bench_tokens
        work["target_tokens"] += recipe.agreement_batches * 8 * 128 + bench_tokens
        work["bench_runs"] = runs
        plans.append(Plan(f"sweep point {point.id}", base_bytes(onnx=onnx), phases, holds, work,
                          [f"target held in {t.dtype} (the recipe's dtype)"]))
    return plans
