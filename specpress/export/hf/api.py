"""`export_hf(drafter_dir, out, fmt=..., engine=...)`: a drafter artifact -> a directory a serving engine loads.

Works on the stored tensors, not on a rebuilt model: every quantized code and scale is moved, re-laid
out or renamed, never recomputed, so the export is what specpress measured.

    --format speculators  eagle3 / dflash in the speculators layout (speculators.py); lm as a plain HF Llama dir;
                          quantized Linears as compressed-tensors
    --format modelopt     the family's public layout + hf_quant_config.json (modelopt.py)
    --for ENGINE          what that engine loads for the family (engines.py: vLLM, SGLang, TensorRT-LLM, Edge-LLM): its
                          layout and quantized-Linear format, config fields and float-Linear names in its own
                          terms, refused first by its rules (rules.py; vllm.py, sglang.py, trtllm.py, edgellm.py)

Each quantized Linear is written by its scheme's encoding in the format (a facet registered per scheme,
models/formats/encodings.py; ct_encodings.py, modelopt_encodings.py), which also holds the format's rule
when a scheme, activation mode or method has no form there: the export refuses it with that rule rather
than write a file that drops a tensor (an input_scale, a pre_quant_scale) or means something else.

A draft head that is not one dense Linear (a low-rank or a shared head, models/heads.py) follows the engines'
rules in export/hf/heads.py: written without lm_head when the engines share the target's, else refused
by name, or written dense with `materialize_head`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from specpress.artifacts import atomic_dir, write_json
from specpress.errors import CheckpointError, ConfigError, RequestError, UsageError
from specpress.export.hf import heads
from specpress.export.hf.engines import Engine, engine
from specpress.export.hf.rules import Job
from specpress.models.drafter import get_family
from specpress.models.formats import compressed_tensors as ct
from specpress.models.formats import modelopt as mo
from specpress.models.formats import speculators as sp
from specpress.models.formats.encodings import CT, MODELOPT, encoding
from specpress.models.io import read_config, read_weights, save_weights
from specpress.models.quantized.fusion import fused_groups

FORMATS = ("speculators", "modelopt")


@dataclass(frozen=True)
class ExportSummary:
    """What was written: where, in which layout, and what a server will do differently."""

    out: Path
    format: str
    family: str
    layout: str  # "speculators eagle3", "hf llama", "public eagle3"
    scheme: str | None  # quantization scheme, None for a float drafter
    speculative_tokens: int | None
    tensors: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    engine: str | None = None  # "vLLM 0.34.0": the engine (and version) whose rules it was written by
    serve: str | None = None  # the command that loads it

    def lines(self) -> list[str]:
        label = "compressed-tensors" if self.format in ("speculators", CT) else "ModelOpt"
        q = f", {self.scheme} as {label}" if self.scheme else ""
        head = f"wrote {self.out} ({self.layout}{q}; {self.tensors} tensors"
        head += f"; speculative_tokens {self.speculative_tokens})" if self.speculative_tokens else ")"
        lines = [head]
        if self.engine:
            lines.append(f"for {self.engine}: {self.serve}")
        return lines + [f"note: {n}" for n in self.notes]


def chain_tokens(policy: str | None, family: str, config: Any) -> tuple[int, list[str]]:
    """speculative_tokens for `policy` (default: 3, or block_size - 1 for a family that drafts a block in one
    pass: session "block") + notes on approximations."""
    from specpress.runtime.policy import BlockPolicy, ChainPolicy, DynamicPolicy, MTPPolicy, TreePolicy, parse_policy

    if policy is None:
        return (config.block_size - 1 if get_family(family).session == "block" else 3), []
    p = parse_policy(policy)
    if isinstance(p, (ChainPolicy, MTPPolicy)):
        return p.k, []
    if isinstance(p, BlockPolicy):
        return p.block_size - 1, []
    if isinstance(p, (TreePolicy, DynamicPolicy)):
        d = p.max_depth
        return d, [f"policy {p} has no speculators equivalent (speculators' only proposal method is a greedy "
                   f"chain): wrote the nearest chain, speculative_tokens {d} (its depth); vLLM can still be given "
                   f"a static tree with speculative_config's speculative_token_tree"]
    raise ConfigError(f"policy {policy!r} cannot be written as a speculators proposal method")


def linear_names(family: str, config: Any) -> dict[str, tuple[int, int]]:
    """Every Linear of the drafter (public names) -> (out_features, in_features), built on the meta device."""
    with torch.device("meta"):
        model = get_family(family).model_cls(config)  # type: ignore[call-arg]
    return {n: (m.out_features, m.in_features) for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def resolve_verifier(verifier: str | None, block: dict[str, Any]) -> tuple[dict[str, Any], Path | None]:
    """speculators' verifier block, and the verifier's local dir (checked against the drafter's target)."""
    fp = block.get("target") or {}
    if verifier is None:
        raise UsageError("--target NAME_OR_PATH is required: the model id or path the server loads as the "
                         "target (speculators records it as the verifier; vLLM checks the drafter against it)")
    local = Path(verifier).expanduser()
    if not local.is_dir():
        arch = fp.get("architecture")
        return sp.verifier_block(verifier, [arch] if arch else []), None
    from specpress.models.drafter import target_fingerprint
    from specpress.models.drafter_io import fingerprint_diff
    from specpress.models.target import TargetConfig

    raw = read_config(local)
    tcfg = TargetConfig.from_hf(raw, source=str(local / "config.json"))
    bad = fingerprint_diff(fp, target_fingerprint(tcfg))
    if bad:
        raise CheckpointError(f"--target {local} does not match the target this drafter was built for "
                              f"(differs in {', '.join(bad)}: drafter {({k: fp[k] for k in bad})}); pass the "
                              f"target the drafter was distilled against")
    return sp.verifier_block(verifier, list(raw.get("architectures") or [])), local


def precision_notes(precision: dict[str, Any] | None, eng: Engine | None, verifier: str | None) -> list[str]:
    """What an export says of the target precision its drafter was aligned with (specpress.target_precision,
    written whatever the engine). No engine reads that field: each loads the drafter as any other and takes
    the target's precision from the target checkpoint it serves, so the alignment holds only beside a target
    quantized that way, which the user brings (specpress emulates the scheme; it writes no target checkpoint)."""
    if not precision or precision["label"] == "float":
        return []
    what = (f"aligned with the target compressed as {precision['label']} (--target-quant {precision['spec']}, "
            f"recorded as specpress.target_precision)")
    if eng is None:
        return [f"{what}: serve it beside a target quantized that way"]
    notes = [f"{what}: {eng.label} loads the drafter as any other and reads no such field; the target's precision "
             f"is that of the target checkpoint you serve, so serve one quantized as {precision['label']} (specpress "
             f"measured the scheme's reference numerics, not {eng.label}'s kernels, and writes no target checkpoint)"]
    local = Path(verifier).expanduser() if verifier else None
    if local is not None and (local / "config.json").is_file() and "quantization_config" not in read_config(local):
        notes.append(f"the serve line names --target {verifier}, a float target (its config.json has no "
                     f"quantization_config): beside it the drafter meets the float target it was not aligned with; "
                     f"serve the {precision['label']} copy of the target there instead")
    return notes


def fused_notes(quantized: set[str], linears: dict[str, tuple[int, int]]) -> list[str]:
    """Servers fuse q/k/v and gate/up into one Linear with one scheme: flag a group quantized in part."""
    notes = []
    for group in fused_groups(linears):
        q = [m for m in group if m in quantized]
        if q and len(q) != len(group):
            notes.append(f"{', '.join(group)} are one fused Linear in vLLM / SGLang / TensorRT-LLM but only "
                         f"{', '.join(q)} is quantized: the server refuses mixed schemes in a fused layer; quantize "
                         f"all of them or none")
    return notes


def _quantized(step: dict[str, Any] | None, weights: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
    """Quantized Linear name -> its stored tensors (its scheme's keys, bias excluded)."""
    if step is None:
        return {}
    out = {}
    for name in step.get("quantized") or ():
        out[name] = {k[len(name) + 1:]: v for k, v in weights.items()
                     if k.startswith(name + ".") and k != name + ".bias"}
    return out


def _route(fmt: str | None, engine_name: str | None, family: str) -> tuple[str, str, Engine | None]:
    """(layout, quantized-Linear format, engine) for --format / --for."""
    if engine_name is None:
        if fmt not in FORMATS:
            raise ConfigError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
        if fmt == "speculators":
            return ("hf" if get_family(family).session == "lm" else "speculators"), CT, None  # an LM: plain HF
        return "public", MODELOPT, None
    eng = engine(engine_name)
    route = eng.route(family)  # the family's serving facet (export/hf/facets/)
    if route is None:
        raise RequestError(eng.no_route.get(family) or f"{eng.read_from} has no route for {family!r} drafters")
    lay = route.layout
    if fmt is not None and fmt != _format_of(eng, lay):  # right for another family: the drafter makes it wrong
        raise RequestError(f"--for {eng.name} writes {eng.label}'s own form of a {family} drafter ({lay} layout, "
                           f"{eng.quant}); drop --format {fmt}, or drop --for to write that layout alone")
    return lay, (CT if eng.quant == CT else MODELOPT), eng


def check_flags(fmt: str | None, engine_name: str | None) -> None:
    """The command-line errors, whatever the drafter (UsageError, exit 2): neither --for nor --format, or a
    --format that --for's engine writes for no family."""
    if fmt is None and engine_name is None:
        raise UsageError("export hf needs --for ENGINE (vllm, sglang, trtllm, edgellm) or --format LAYOUT ("
                         "speculators, modelopt)")
    if fmt is not None and engine_name is not None:
        eng = engine(engine_name)
        if fmt not in {_format_of(eng, lay) for lay in eng.layouts.values()}:
            raise UsageError(f"--for {eng.name} never writes the --format {fmt} layout ({eng.label} reads "
                             f"{eng.quant}); drop --format {fmt}, or drop --for to write that layout alone")


def _format_of(eng: Engine, lay: str) -> str | None:
    """The --format whose layout `eng` writes for a family of layout `lay` (None: none of them)."""
    if lay == "speculators" or (lay == "hf" and eng.quant == CT):
        return "speculators"
    return "modelopt" if eng.quant == MODELOPT else None


def export_hf(drafter: str | Path, out: str | Path, fmt: str | None = None, *, engine: str | None = None,
              verifier: str | None = None, policy: str | None = None, force: bool = False,
              materialize_head: bool = False) -> ExportSummary:
    """Write `drafter` to `out` in serving format `fmt` (speculators | modelopt), or as `engine` (vllm | sglang |
    trtllm | edgellm) loads it (its layout, its quantized-Linear format, refused by its rules); return the summary.
    materialize_head: write a low-rank or shared head as a dense lm_head where the engines load no other."""
    from specpress.models import serving_io
    from specpress.models.drafter_io import active_quantize_step, read_drafter_config
    from specpress.models.quantized.scheme import config_from_dict

    check_flags(fmt, engine)
    drafter = Path(drafter).expanduser()
    family, config, raw = read_drafter_config(drafter)
    lay, qfmt, eng = _route(fmt, engine, family)
    block = dict(raw.get("specpress") or {})
    weights = serving_io.to_specpress_weights(drafter, read_weights(drafter))
    rules = eng.rules() if eng is not None else None
    notes: list[str] = []
    if heads.head_kind(config) != "dense":
        heads.check(family, config, materialize_head, rules, eng)
        if heads.refusal(family, config, rules, eng):
            local = Path(verifier).expanduser() if verifier is not None else None
            config, weights, block, note = heads.materialize(drafter, family, config, weights, block,
                                                             local if local is not None and local.is_dir() else None,
                                                             raw.get("torch_dtype") or "float32")
            notes.append(note)
        else:
            notes.append("no lm_head written: the engines then share the target's whole lm_head, which is this "
                         "drafter's shared head (its draft vocabulary is the target's)")
    step = active_quantize_step(block.get("steps"))
    if step is not None and step.get("module_configs"):
        kinds = sorted({config_from_dict(c).storage_label() for c in step["module_configs"].values()})
        raise RequestError(f"{drafter} mixes quantization schemes per Linear ({', '.join(kinds)}, quantize --budget); "
                           f"export hf writes one quantization_config per checkpoint: export it to ONNX, or quantize "
                           f"with one --scheme (or --budget with candidates that end up uniform)")
    qcfg = config_from_dict(step.get("config") or {}) if step else None
    if qfmt == MODELOPT and step is None and eng is None:
        raise RequestError("--format modelopt writes ModelOpt's quantized layout; this drafter is not quantized "
                           "(its public layout is what ModelOpt, TensorRT-LLM and SGLang read already)")
    linears = linear_names(family, config)
    quantized = _quantized(step, weights)
    public = get_family(family).writer(config)
    dtype = raw.get("torch_dtype") or "float32"
    n_target = getattr(config, "num_target_layers", None) or (block.get("target") or {}).get("num_hidden_layers")
    speculative_tokens, more = chain_tokens(policy, family, config) if lay == "speculators" or eng is not None \
        else (None, [])
    notes += more
    job = Job(family, config, lay, qcfg, quantized, linears, n_target, verifier, Path(out).expanduser(),
              speculative_tokens or 0, eng.route(family)) if eng is not None else None
    if rules is not None:
        why = rules.refuse(job)
        if why:
            raise RequestError(why)
    enc = encoding(qfmt, qcfg) if qcfg is not None else None
    if lay == "speculators":
        weights, cfg_out, rename = _speculators(family, config, public, dtype, weights, block, verifier, policy,
                                                speculative_tokens)
    else:
        rename, cfg_out = (lambda n: n), dict(public)
    layout_name = {"speculators": f"speculators {family}", "hf": f"hf {public.get('model_type', 'llama')}",
                   "public": f"public {family}"}[lay]
    tensors: dict[str, Tensor] = {}
    for k, v in weights.items():
        owner = next((n for n in quantized if k.startswith(n + ".") and k != n + ".bias"), None)
        if owner is None and not (lay == "speculators" and sp.drop_on_write(family, config, k)):
            tensors[rename(k)] = v
    for name, stored in quantized.items():
        assert enc is not None
        tensors.update({f"{rename(name)}.{s}": t for s, t in enc.encode(stored, qcfg).items()})
    extra_files: dict[str, Any] = {}
    if enc is not None:
        spec = enc.spec(qcfg)
        floats = [rename(n) for n in linears if n not in quantized]
        if qfmt == CT:
            ignore = [rules.ignore(n, job) for n in floats] if rules is not None else None
            if lay == "speculators":  # Linears of speculators' own model that no checkpoint holds
                extra = [ct.name_pattern(n) for n in sp.model_only_linears(family)]
                ignore = None if ignore is None else ignore + extra
                floats += list(sp.model_only_linears(family))
            cfg_out["quantization_config"] = ct.quantization_config(spec, [rename(n) for n in quantized], floats,
                                                                    ignore=ignore)
        else:
            excluded = [rules.ignore(n, job) for n in floats] if rules is not None else floats
            cfg_out["quantization_config"] = mo.quantization_config(spec, excluded)
            extra_files["hf_quant_config.json"] = mo.hf_quant_config(spec, excluded)
        notes += enc.notes(qcfg, {rename(n): linears[n] for n in quantized})
        notes += fused_notes(set(quantized), linears)
    if rules is not None:
        tensors = rules.tensors(job, tensors)
        cfg_out = rules.config(job, cfg_out)
        notes += rules.notes(job)
    cfg_out["torch_dtype"] = dtype
    from specpress.models.inspect import target_precision

    precision = target_precision(block.get("steps"))  # which target it was aligned with (float or compressed)
    notes += precision_notes(precision, eng, verifier)
    cfg_out["specpress"] = {**block, "exported_as": fmt if eng is None else f"{eng.name} ({eng.read_from})",
                            **({"target_precision": precision} if precision else {})}
    out = Path(out).expanduser()
    with atomic_dir(out, force=force) as tmp:
        write_json(tmp / "config.json", cfg_out)
        for fname, obj in extra_files.items():
            write_json(tmp / fname, obj)
        save_weights(tensors, tmp / "model.safetensors")
    return ExportSummary(out, fmt or qfmt, family, layout_name,
                         step.get("scheme") if step else None, speculative_tokens, len(tensors), tuple(notes),
                         engine=None if eng is None else eng.read_from,
                         serve=None if rules is None else rules.serve(job))


def _speculators(family: str, config: Any, public: dict[str, Any], dtype: str, weights: dict[str, Tensor],
                 block: dict[str, Any], verifier: str | None, policy: str | None,
                 tokens: int | None) -> tuple[dict[str, Tensor], dict[str, Any], Callable[[str], str]]:
    """(tensors, config.json, rename) of the speculators layout (the family's speculators form: eagle3 / dflash)."""
    why = sp.cannot_hold(family, config)
    if why:
        raise ConfigError(why)
    form = sp.form_of(family)
    assert form is not None  # cannot_hold refused the others
    verifier_cfg, local = resolve_verifier(verifier, block)
    assert tokens is not None
    if get_family(family).session == "block" and tokens > config.block_size - 1:
        raise ConfigError(f"policy {policy} drafts {tokens} tokens; this {family} drafter's block holds "
                          f"{config.block_size - 1}")
    sp.check_taps(family, config, (block.get("target") or {}).get("num_hidden_layers"))
    cfg_out = sp.build_config(family, config, {**public, "torch_dtype": dtype}, verifier_cfg, tokens)
    if form.verifier_tensor == "lm_head":
        weights = {**weights, "lm_head.weight": _verifier_head(local, dtype, form.model_type)}
    elif "embed_tokens.weight" not in weights:
        weights = {**weights, "embed_tokens.weight": _verifier_embedding(local, dtype, form.model_type)}
    return weights, cfg_out, form.rename_out


def _verifier_embedding(local: Path | None, dtype: str, layout: str) -> Tensor:
    """The verifier's embed_tokens [V, H]: speculators' eagle3 checkpoints store it and its Eagle3DraftModel
    reads it (left out, transformers allocates it uninitialised)."""
    if local is None:
        raise RequestError(f"speculators' {layout} layout stores the verifier's embed_tokens (its Eagle3DraftModel "
                           f"reads it from the checkpoint): pass --target as the local target directory, or save the "
                           f"drafter with the target's embedding (save_drafter(..., include_shared=True))")
    w = read_weights(local)
    emb = w.get("model.embed_tokens.weight")
    if emb is None:
        raise CheckpointError(f"{local}: model.embed_tokens.weight is not stored")
    return emb.to(getattr(torch, dtype))


def _verifier_head(local: Path | None, dtype: str, layout: str) -> Tensor:
    """The verifier's lm_head [V, H] (speculators' DFlash stores it); tied heads come from embed_tokens."""
    if local is None:
        raise RequestError(f"speculators' {layout} layout stores the verifier's lm_head: pass --target as the local "
                           f"target directory (the server can still load the model id you serve)")
    w = read_weights(local)
    head = w.get("lm_head.weight", w.get("model.embed_tokens.weight"))
    if head is None:
        raise CheckpointError(f"{local}: neither lm_head.weight nor model.embed_tokens.weight is stored")
    return head.to(getattr(torch, dtype))
