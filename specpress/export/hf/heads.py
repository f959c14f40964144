"""What `export hf` does with a draft head that is not the public dense `lm_head.weight` (models/heads.py).

Each engine's rules say what it loads: the head it builds for a family is its route's own_head in the family's
serving facet (export/hf/facets/), the head it shares is Rules.shared_head (vllm.py, sglang.py, trtllm.py), with
the files they were read from; `--format` alone, without an engine, follows vLLM's and TensorRT-LLM's together
(the facet's own_head, RULE_SHARED below):

  - every engine builds the head as one dense Linear: EAGLE-3's [draft_vocab_size, hidden_size], a draft
    LM's (the lm family) [vocab_size, hidden_size]. A low-rank head's `lm_head.down` / `lm_head.up` have
    nothing to load into.
  - a checkpoint WITHOUT lm_head gets the target's whole lm_head: in vLLM and TensorRT-LLM always, in SGLang
    when config.json has draft_vocab_size null (sglang.py writes that null). Its logits then cover the
    target's vocabulary, so only a drafter whose draft vocabulary IS the target's (d2t the identity)
    computes the same thing. A shared head over a reduced draft vocabulary cannot be expressed.

So: a shared head over the whole vocabulary is written without lm_head (what the engines share); a
low-rank head, or a shared one over a reduced vocabulary, is refused naming the engine's rule unless
`materialize` asks for a dense `lm_head.weight` [Vd, H] (up · down, or the target's rows of the draft
vocabulary, read from the local target directory): the engines then load it as any dense head, and the
drafter's bytes grow by the dense head's (reported). Quantized factors are multiplied dequantised and the
dense head is written in float: TensorRT-LLM's lm_head takes no quantization config either.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from specpress.errors import CheckpointError, RequestError, UsageError

RULE_SHARED = ("vLLM and TensorRT-LLM share the target's WHOLE lm_head when the checkpoint has none (vLLM: "
               "has_own_lm_head false in v1/spec_decode/eagle/utils.py; TensorRT-LLM: load_lm_head_from_target), "
               "which computes the drafter's logits only when its draft vocabulary is the target's")


def head_kind(config: Any) -> str:
    """"shared", "low_rank" or "dense"."""
    if getattr(config, "shared_head", False):
        return "shared"
    return "low_rank" if getattr(config, "head_rank", None) is not None else "dense"


def own_head_rule(family: str, rules: Any = None, eng: Any = None) -> str:
    """The rule for the one dense head the engine (`eng`, its `rules`) builds for `family`, from the family's
    serving facet (export/hf/facets/); without an engine, vLLM's and TensorRT-LLM's together."""
    from specpress.export.hf.facets import serving_facet

    if eng is not None:
        route = eng.route(family)
        text = route.own_head if route is not None else ""
        where = eng.read_from
    else:
        facet = serving_facet(family)
        text = facet.own_head if facet is not None else ""
        where = "vLLM's or TensorRT-LLM's"
    if not text:
        raise RequestError(f"{where} rule for a {family} drafter's own head is not known (its serving facet, "
                           f"export/hf/facets/, names none): serve it from specpress's ONNX export")
    return f"{rules.label} {text}" if eng is not None else text


def refusal(family: str, config: Any, rules: Any = None, eng: Any = None) -> str | None:
    """Why the engine (`eng`, with `rules`: its Rules; None: vLLM's and TensorRT-LLM's rules together, for
    --format alone) cannot load this drafter's head as it is (None when it can: dense, or shared over the full
    vocabulary, which is written without lm_head)."""
    kind = head_kind(config)
    if kind == "low_rank":
        own = own_head_rule(family, rules, eng)
        return (f"this {family} drafter's head is low rank (head_rank {config.head_rank}: lm_head.down, "
                f"lm_head.up), but {own}")
    if kind == "shared" and config.draft_vocab_size != config.vocab_size:
        shared = getattr(rules, "shared_head", None) or RULE_SHARED
        return (f"this {family} drafter reads the target's lm_head rows of its {config.draft_vocab_size}-token draft "
                f"vocabulary (shared_head), but {shared} ({config.vocab_size} tokens here)")
    return None


def materialize(drafter_dir: Path, family: str, config: Any, weights: dict[str, Tensor], block: dict[str, Any],
                verifier_dir: Path | None, dtype: str) -> tuple[Any, dict[str, Tensor], dict[str, Any], str]:
    """(dense config, weights with a dense lm_head.weight, the specpress block with the factors dropped from the
    active quantize step, a note on the bytes) for a low-rank or shared head."""
    from specpress.models.heads import dense_weight
    from specpress.models.quantized.restore import active_quantize_step

    kind = head_kind(config)
    dt = getattr(torch, dtype)
    if kind == "low_rank":
        from specpress.models.drafter_io import load_drafter

        head = dense_weight(load_drafter(drafter_dir, device="cpu").lm_head)  # quantized factors dequantised
        before = config.head_rank * (head.shape[0] + head.shape[1])
        dense = dataclasses.replace(config, head_rank=None)
    else:
        if verifier_dir is None:
            raise UsageError("writing a shared head as a dense lm_head reads the target's rows: pass --target as the "
                             "local target directory")
        from specpress.models.io import read_weights

        tw = read_weights(verifier_dir)
        full = tw.get("lm_head.weight", tw.get("model.embed_tokens.weight"))
        if full is None:
            raise CheckpointError(f"{verifier_dir}: neither lm_head.weight nor model.embed_tokens.weight is stored")
        ids = torch.arange(config.draft_vocab_size) + weights["d2t"].long().cpu()
        head, before = full.index_select(0, ids), 0
        dense = dataclasses.replace(config, shared_head=False)
    out = {k: v for k, v in weights.items() if not k.startswith("lm_head.")}
    out["lm_head.weight"] = head.to(dt).contiguous()
    steps = [dict(s) for s in block.get("steps") or ()]
    if active_quantize_step(steps) is not None:  # the last quantize step: its factors are gone
        i = max(i for i, st in enumerate(steps) if st.get("step") == "quantize")
        names = steps[i].get("quantized") or ()
        steps[i]["quantized"] = [n for n in names if not n.startswith("lm_head.")]
        if len(steps[i]["quantized"]) != len(names):
            steps[i]["notes"] = [*(steps[i].get("notes") or ()), "export hf: the low-rank head's quantized factors "
                                 "were multiplied back into a dense float lm_head (their codes are not in this export)"]
    size = torch.empty((), dtype=dt).element_size()
    note = (f"wrote a dense lm_head [{head.shape[0]}, {head.shape[1]}] ({head.numel() * size:,} bytes in {dtype}) in "
            f"place of the {'low-rank factors' if kind == 'low_rank' else 'shared target rows'} "
            f"({before * size:,} bytes of the drafter's own): the engines load a dense head only, so the "
            f"exported drafter is {(head.numel() - before) * size:,} bytes larger than the one measured")
    return dense, out, {**block, "steps": steps, "materialized_head": kind}, note


def check(family: str, config: Any, materialize_head: bool, rules: Any = None, eng: Any = None) -> None:
    """Refuse an inexpressible head unless asked to write it dense; refuse the flag where it has no use."""
    why = refusal(family, config, rules, eng)
    if why and not materialize_head:
        raise RequestError(f"{why}. Pass --materialize-head to write a dense lm_head instead (the exported drafter "
                           f"then stores the whole head again), or serve it from specpress's ONNX export")
    if materialize_head and why is None:
        raise RequestError(f"--materialize-head: this {family} drafter's head ({head_kind(config)}) is written as "
                           f"the engines load it already; drop the flag")


__all__ = ["head_kind", "own_head_rule", "refusal", "materialize", "check"]
