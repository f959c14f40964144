"""`export_hf(drafter_dir, out, fmt=...)`: a drafter artifact -> a directory a serving engine loads.

Works on the stored tensors, not on a rebuilt model: every quantized code and scale is moved, re-laid
out or renamed, never recomputed, so the export is bit-identical to what specpress measured.

    speculators   eagle3 / dflash in the speculators layout (speculators.py); lm as a plain HF Llama dir;
                  quantized Linears as compressed-tensors: for vLLM
    modelopt      the family's public layout + hf_quant_config.json (modelopt.py): for TensorRT-LLM

Each quantized Linear is written by its scheme's encoding in the format (a facet registered per scheme,
models/formats/encodings.py; ct_encodings.py, modelopt_encodings.py), which also holds the format's rule
when a scheme, activation mode or method has no form there: the export refuses it with that rule rather
than write a file that drops a tensor (an input_scale, a pre_quant_scale) or means something else.

SGLang (0.5.x) has no route for a quantized drafter from here: it reads the EAGLE layout, not speculators;
its ModelOpt FP8 config reads every FP8 quant_algo as static per-tensor FP8 (one scale per shard and an
input_scale; python/sglang/srt/layers/quantization/modelopt_quant.py), not per-channel; and its EAGLE-3
`fc` is a plain Linear that would drop an fp8 scale. A float drafter's own directory is what it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from specpress.artifacts import atomic_dir, write_json
from specpress.errors import CheckpointError, ConfigError, UsageError
from specpress.models.formats import compressed_tensors as ct
from specpress.models.formats import modelopt as mo
from specpress.models.formats.encodings import CT, MODELOPT, encoding
from specpress.models.formats import speculators as sp
from specpress.models.drafter import get_family
from specpress.models.io import read_config, read_weights, save_weights

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

    def lines(self) -> list[str]:
        q = f", {self.scheme} as {'compressed-tensors' if self.format == 'speculators' else 'ModelOpt'}" \
            if self.scheme else ""
        head = f"wrote {self.out} ({self.layout}{q}; {self.tensors} tensors"
        head += f"; speculative_tokens {self.speculative_tokens})" if self.speculative_tokens else ")"
        return [head] + [f"note: {n}" for n in self.notes]


def chain_tokens(policy: str | None, family: str, config: Any) -> tuple[int, list[str]]:
    """speculative_tokens for `policy` (default: 3, or block_size - 1 for dflash) + notes on approximations."""
    from specpress.runtime.policy import BlockPolicy, ChainPolicy, DynamicPolicy, MTPPolicy, TreePolicy, parse_policy

    if policy is None:
        return (config.block_size - 1 if family == "dflash" else 3), []
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
        raise UsageError("--verifier NAME_OR_PATH is required: the model id or path the server loads as the "
                         "target (speculators records it; vLLM checks the drafter against it)")
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
        raise CheckpointError(f"--verifier {local} does not match the target this drafter was built for "
                              f"(differs in {', '.join(bad)}: drafter {({k: fp[k] for k in bad})}); pass the "
                              f"target the drafter was distilled against")
    return sp.verifier_block(verifier, list(raw.get("architectures") or [])), local


FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # what vLLM / SGLang fuse into one Linear


def fused_notes(quantized: set[str], linears: dict[str, tuple[int, int]]) -> list[str]:
    """Servers fuse q/k/v and gate/up into one Linear with one scheme: flag a group quantized in part."""
    notes = []
    for parent in sorted({n.rpartition(".")[0] for n in linears}):
        for group in FUSED:
            members = [f"{parent}.{m}" if parent else m for m in group]
            have = [m for m in members if m in linears]
            q = [m for m in have if m in quantized]
            if q and len(q) != len(have):
                notes.append(f"{', '.join(have)} are one fused Linear in vLLM / SGLang but only {', '.join(q)} "
                             f"is quantized: the server refuses mixed schemes in a fused layer; quantize all of "
                             f"them or none")
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


def export_hf(drafter: str | Path, out: str | Path, fmt: str, *, verifier: str | None = None,
              policy: str | None = None, force: bool = False) -> ExportSummary:
    """Write `drafter` to `out` in serving format `fmt` (speculators | modelopt); return the summary."""
    from specpress.models import serving_io
    from specpress.models.drafter_io import active_quantize_step, read_drafter_config
    from specpress.models.quantized.scheme import config_from_dict

    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    drafter = Path(drafter).expanduser()
    family, config, raw = read_drafter_config(drafter)
    block = dict(raw.get("specpress") or {})
    weights = serving_io.to_specpress_weights(drafter, read_weights(drafter))
    step = active_quantize_step(block.get("steps"))
    qcfg = config_from_dict(step.get("config") or {}) if step else None
    enc = encoding(CT if fmt == "speculators" else MODELOPT, qcfg) if qcfg is not None else None
    if fmt == "modelopt" and step is None:
        raise UsageError("--format modelopt writes ModelOpt's quantized layout; this drafter is not quantized "
                         "(its public layout is what ModelOpt, TensorRT-LLM and SGLang read already)")
    linears = linear_names(family, config)
    quantized = _quantized(step, weights)
    notes: list[str] = []
    public = get_family(family).writer(config)
    dtype = raw.get("torch_dtype") or "float32"
    speculative_tokens = None
    if fmt == "speculators":
        why = sp.cannot_hold(family, config)
        if why:
            raise ConfigError(why)
        if family == "lm":
            rename, cfg_out, layout = (lambda n: n), dict(public), f"hf {public.get('model_type', 'llama')}"
        else:
            verifier_cfg, local = resolve_verifier(verifier, block)
            speculative_tokens, more = chain_tokens(policy, family, config)
            notes += more
            if family == "dflash" and speculative_tokens > config.block_size - 1:
                raise ConfigError(f"policy {policy} drafts {speculative_tokens} tokens; this dflash drafter's block "
                                  f"holds {config.block_size - 1}")
            sp.check_taps(family, config, (block.get("target") or {}).get("num_hidden_layers"))
            cfg_out = sp.build_config(family, config, {**public, "torch_dtype": dtype}, verifier_cfg,
                                      speculative_tokens)
            rename, layout = (lambda n: sp.rename_out(family, n)), f"speculators {family}"
            if family == "dflash":
                weights = {**weights, "lm_head.weight": _verifier_head(local, dtype)}
            if family == "eagle3":
                if "lm_head" in quantized:
                    raise ConfigError("vLLM builds an EAGLE-3 drafter's lm_head as a ParallelLMHead without a "
                                      "quantization config (vLLM 0.33 model_executor/models/llama_eagle3.py), so a "
                                      "quantized lm_head has nothing to load into: quantize without --include "
                                      "lm_head")
                if "embed_tokens.weight" not in weights:
                    weights = {**weights, "embed_tokens.weight": _verifier_embedding(local, dtype)}
    else:
        rename, cfg_out, layout = (lambda n: n), dict(public), f"public {family}"
    tensors: dict[str, Tensor] = {}
    for k, v in weights.items():
        owner = next((n for n in quantized if k.startswith(n + ".") and k != n + ".bias"), None)
        if owner is None and not (fmt == "speculators" and sp.drop_on_write(family, config, k)):
            tensors[rename(k)] = v
    for name, stored in quantized.items():
        assert enc is not None
        new = enc.encode(stored, qcfg)
        tensors.update({f"{rename(name)}.{s}": t for s, t in new.items()})
    others = [rename(n) for n in linears if n not in quantized]
    extra_files: dict[str, Any] = {}
    if enc is not None:
        spec = enc.spec(qcfg)
        if fmt == "speculators":
            cfg_out["quantization_config"] = ct.quantization_config(spec, [rename(n) for n in quantized], others)
        else:
            cfg_out["quantization_config"] = mo.quantization_config(spec, others)
            extra_files["hf_quant_config.json"] = mo.hf_quant_config(spec, others)
        notes += enc.notes(qcfg, {rename(n): linears[n] for n in quantized})
        notes += fused_notes(set(quantized), linears)
    cfg_out["torch_dtype"] = dtype
    from specpress.models.inspect import target_precision

    precision = target_precision(block.get("steps"))  # which target it was aligned with (float or compressed)
    if precision and precision["label"] != "float":
        notes.append(f"aligned with the target compressed as {precision['label']} (--target-quant {precision['spec']}, "
                     f"recorded as specpress.target_precision): serve it beside a target quantized that way")
    cfg_out["specpress"] = {**block, "exported_as": fmt, **({"target_precision": precision} if precision else {})}
    out = Path(out).expanduser()
    with atomic_dir(out, force=force) as tmp:
        write_json(tmp / "config.json", cfg_out)
        for fname, obj in extra_files.items():
            write_json(tmp / fname, obj)
        save_weights(tensors, tmp / "model.safetensors")
    return ExportSummary(out, fmt, family, layout, step.get("scheme") if step else None, speculative_tokens,
                         len(tensors), tuple(notes))


def _verifier_embedding(local: Path | None, dtype: str) -> Tensor:
    """The verifier's embed_tokens [V, H]: speculators' eagle3 checkpoints store it and its Eagle3DraftModel
    reads it (left out, transformers allocates it uninitialised)."""
    if local is None:
        raise UsageError("speculators' eagle3 layout stores the verifier's embed_tokens (its Eagle3DraftModel reads "
                         "it from the checkpoint): pass --verifier as the local target directory, or save the "
                         "drafter with the target's embedding (save_drafter(..., include_shared=True))")
    w = read_weights(local)
    emb = w.get("model.embed_tokens.weight")
    if emb is None:
        raise CheckpointError(f"{local}: model.embed_tokens.weight is not stored")
    return emb.to(getattr(torch, dtype))


def _verifier_head(local: Path | None, dtype: str) -> Tensor:
    """The verifier's lm_head [V, H] (speculators' DFlash stores it); tied heads come from embed_tokens."""
    if local is None:
        raise UsageError("speculators' dflash layout stores the verifier's lm_head: pass --verifier as the local "
                         "target directory (the server can still load the model id you serve)")
    w = read_weights(local)
    head = w.get("lm_head.weight", w.get("model.embed_tokens.weight"))
    if head is None:
        raise CheckpointError(f"{local}: neither lm_head.weight nor model.embed_tokens.weight is stored")
    return head.to(getattr(torch, dtype))
