"""What an engine's rules see of one export (`Job`), what they answer (`Rules`), and the checks engines share.

Each engine file (vllm.py, sglang.py, trtllm.py, edgellm.py) builds one `Rules` from its loading code as read
(versions in engines.py). `export_hf(..., engine=...)` asks `refuse` before it writes anything: a message names
the engine's rule (version, file) and the fix, so no file is written that the engine would fail to load, or load
into something else, later on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from specpress.export.hf.facets import Route, ServingFacet, serving_facet
from specpress.models.quantized.fusion import fused_groups

if TYPE_CHECKING:
    from specpress.models.family import Family


@dataclass(frozen=True)
class Job:
    """One export as the rules see it (public names: specpress's checkpoint names before any layout rename)."""

    family: str
    config: Any  # the drafter's config
    layout: str  # "speculators" | "public" | "hf"
    qcfg: Any | None  # the active quantize config (None: float)
    quantized: Mapping[str, Mapping[str, Tensor]]  # quantized Linear -> its stored tensors (modules.py keys)
    linears: Mapping[str, tuple[int, int]]  # every Linear -> (out_features, in_features)
    num_target_layers: int | None
    verifier: str | None  # --target as given: the target the server loads (speculators' verifier)
    out: Path
    tokens: int  # speculative tokens per round
    route: Route | None = None  # how the engine serves the family (its serving facet, export/hf/facets/)

    @property
    def traits(self) -> Family:
        """The family's descriptor (models/family.py): what the drafter is."""
        from specpress.models.drafter import get_family

        return get_family(self.family)

    @property
    def facet(self) -> ServingFacet:
        """The family's serving facet (export/hf/facets/): what the engines do with it."""
        facet = serving_facet(self.family)
        assert facet is not None, f"{self.family}: a job exists only for a family an engine routes"
        return facet

    @property
    def scheme(self) -> str | None:
        return None if self.qcfg is None else self.qcfg.scheme

    @property
    def act_mode(self) -> str:
        return "none" if self.qcfg is None else self.qcfg.act_mode

    @property
    def taps(self) -> tuple[int, ...] | None:
        return getattr(self.config, "target_layer_ids", None)


@dataclass(frozen=True)
class Rules:
    """One engine's answers for a job.

    refuse(job) -> the first rule the job breaks (engine, version, file; the fix), or None
    notes(job) -> what the engine will do differently from what specpress measured
    serve(job) -> the command line that loads the export
    ignore(name, job) -> the float-Linear entry for the quantization config (compressed-tensors `ignore` /
                         ModelOpt `exclude_modules`), in the names the engine matches against
    tensors(job, tensors) -> the written tensors, edited into the engine's form (default: unchanged)
    config(job, cfg) -> config.json edited for the engine (default: unchanged)
    label: the engine as its rules name it ("vLLM 0.34"); a route's rule texts (export/hf/facets/: the head it
           builds for a family, which a low-rank head has no place in) follow it
    shared_head: the engine's rule for a checkpoint without lm_head: which head it then uses, so which
                 shared heads (prune --share-head) it computes
    """

    refuse: Callable[[Job], str | None]
    notes: Callable[[Job], list[str]]
    serve: Callable[[Job], str]
    ignore: Callable[[str, Job], str]
    tensors: Callable[[Job, dict[str, Tensor]], dict[str, Tensor]] = field(default=lambda job, t: t)
    config: Callable[[Job, dict[str, Any]], dict[str, Any]] = field(default=lambda job, c: c)
    label: str = ""
    shared_head: str = ""


def first(*checks: Callable[[Job], str | None]) -> Callable[[Job], str | None]:
    """A refuse() that runs `checks` in order and returns the first refusal."""
    def run(job: Job) -> str | None:
        for check in checks:
            why = check(job)
            if why:
                return why
        return None
    return run


def unquantized_only(label: str) -> Callable[[Job], str | None]:
    """A quantized drafter of a family the engine builds in float only (its route's no_quant rule)."""
    def check(job: Job) -> str | None:
        if job.qcfg is None or job.route is None or not job.route.no_quant:
            return None
        return f"{label} {job.route.no_quant}"
    return check


def mixed_fused(label: str, where: str) -> Callable[[Job], str | None]:
    """A fused group (q/k/v, gate/up) quantized in part: the engine builds one Linear with one scheme."""
    def check(job: Job) -> str | None:
        for group in fused_groups(job.linears):
            q = [n for n in group if n in job.quantized]
            if q and len(q) != len(group):
                return (f"{label} loads {', '.join(group)} into one fused Linear with one quantization scheme "
                        f"({where}); only {', '.join(q)} is quantized here: quantize all of them or none "
                        f"(specpress quantize --exclude / --include)")
        return None
    return check


def fused_scales_differ(job: Job, keys: tuple[str, ...]) -> str | None:
    """The first fused group whose per-tensor `keys` (e.g. weight_scale_2, input_scale) are not all equal."""
    for group in fused_groups(job.quantized):
        for key in keys:
            got = [job.quantized[n].get(key) for n in group]
            vals = [v.float().reshape(()) for v in got if v is not None]
            if len(vals) != len(group):
                continue
            if not all(torch.equal(vals[0], v) for v in vals[1:]):
                shown = ", ".join(f"{n.rpartition('.')[2]} {float(v):.6g}" for n, v in zip(group, vals, strict=True))
                return f"{key} differs across {'/'.join(n.rpartition('.')[2] for n in group)} ({shown})"
    return None


def quantized_named(job: Job, leaf: str) -> list[str]:
    return sorted(n for n in job.quantized if n == leaf or n.endswith("." + leaf))


def last_layer_tap(label: str, where: str) -> Callable[[Job], str | None]:
    """An EAGLE-3 tap on the target's last layer output (a family whose facet has residual_taps): specpress takes
    it after the final norm; the engine captures the residual stream of a layer (before any norm), so it would
    feed the drafter another feature."""
    def check(job: Job) -> str | None:
        if not job.facet.residual_taps or job.taps is None or job.num_target_layers is None:
            return None
        n = job.num_target_layers
        if max(job.taps) < n:
            return None
        return (f"this {job.family} drafter taps hidden_states[{n}], the target's last layer output, which specpress "
                f"takes after the final norm; {label} captures a layer's residual stream before any norm ({where}), so "
                f"it would feed this drafter another feature. Re-distill it with taps below {n}")
    return check


def modelopt_algo(job: Job) -> str | None:
    """The ModelOpt quant_algo this job is written as, or None (float, or refused by the ModelOpt encoding's own
    rule when the export writes it)."""
    from specpress.errors import ConfigError
    from specpress.models.formats.encodings import MODELOPT, encoding

    if job.qcfg is None:
        return None
    try:
        enc = encoding(MODELOPT, job.qcfg)
    except ConfigError:
        return None
    return str(enc.spec(job.qcfg)["quant_algo"])


def speculative_target(job: Job) -> str:
    """The target model argument of a serve command (the verifier as given, or a placeholder)."""
    return job.verifier or "TARGET"
