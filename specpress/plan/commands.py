"""The planners of single commands (specpress.plan's model), keyed by the command's name; each takes the
command's parsed options."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specpress.plan import (
    ES,
    HEAD_BLOCK,
    ORT_SESSIONS,
    SAVE_COPY,
    DrafterFacts,
    Plan,
    base_bytes,
    data_bytes,
    drafter_facts,
    forward_bytes,
    kv_bytes,
    linear_widths,
    target_facts,
)

Planner = Callable[[dict[str, Any]], Plan]
PLANNERS: dict[str, Planner] = {}


def planner(*names: str) -> Callable[[Planner], Planner]:
    def deco(fn: Planner) -> Planner:
        for n in names:
            PLANNERS[n] = fn
        return fn
    return deco


@planner("distill")
def plan_distill(p: dict[str, Any]) -> Plan:
    from specpress.compress.config import DistillConfig
    from specpress.compress.students import student_config
    from specpress.models.drafter import build_drafter, get_family
    from specpress.models.target import TargetModel
    from specpress.optim import in_block

    t = target_facts(p["target_dir"], p.get("target_dtype", "bf16"))
    keys = ("family", "steps", "minutes", "lr", "optimizer", "batch", "seq_len", "hidden", "layers", "ffn", "heads",
            "kv_heads", "draft_vocab", "taps", "ttt_steps", "block_size", "anchors", "markov_rank")
    cfg = DistillConfig(**{k: p.get(k) for k in keys if p.get(k) is not None})
    with torch.device("meta"):
        target = TargetModel(t.cfg)
        target.stored_weights_sha256 = "meta"  # no digest of meta tensors
        student = build_drafter(student_config(cfg, t.cfg), target)
    fam = get_family(cfg.family)
    named = [(n, q) for n, q in student.named_parameters()]
    n_params = sum(q.numel() for _, q in named)
    muon = sum(q.numel() for n, q in named if q.dim() == 2 and in_block(n)) if cfg.optimizer == "muon" else 0
    b, n = cfg.batch, cfg.seq_len
    k = cfg.resolved_ttt_steps(student) if fam.loss == "chain" else 1
    vd = getattr(student.config, "draft_vocab_size", t.cfg.vocab_size) if fam.draft_vocab == "reduced" \
        else t.cfg.vocab_size
    h, f = student.config.hidden_size, student.config.intermediate_size
    steps = cfg.steps or 0
    signals = b * n * h * (1 + len(student.taps)) * 4 + b * n * vd * t.es
    # per unrolled step, kept for backward: the draft logits (losses.soft_ce_logits keeps only them: bf16,
    # and their fp32 copy for the step's head) and the layer's activations; one step's fp32 softmax, log-softmax
    # and product at a time
    loss = k * b * n * (vd * 4 + h * 24 + f * 12) + b * n * vd * 16
    state = n_params * 4 * 2 + (n_params - muon) * 8 + muon * 4  # weights + grads, AdamW 2 moments, Muon 1
    phase = {"target": t.bytes, "student + grads + optimizer": state, "teacher signals": signals,
             "target forward": forward_bytes(t, b, n, logits=fam.draft_vocab != "reduced",
                                             taps=len(student.taps)) + (HEAD_BLOCK if fam.draft_vocab == "reduced"
                                                                        else 0),
             "loss activations": loss, "data": data_bytes(p.get("data_path"))}
    evals = cfg.eval_batches
    forwards = steps + evals + (4 if cfg.minutes and not cfg.steps else 0)
    return Plan("distill", base_bytes(), {"train step": phase},
                {"target": t.bytes, "student + grads + optimizer": state},
                {"target_forwards": forwards if steps else f"{evals} + one per step ({cfg.minutes} minutes)",
                 "target_tokens": forwards * b * n if steps else None, "student_params": n_params},
                [f"target held in {t.dtype}"])


def _quantize_config(p: dict[str, Any]) -> Any:
    from specpress.compress.quantize.request import module_names
    from specpress.models.quantized.scheme import config_for

    return config_for(p["scheme"], p.get("method"), group_size=p.get("group_size"), symmetric=p.get("symmetric"),
                      include=module_names(p.get("include")), exclude=module_names(p.get("exclude")),
                      activations=p.get("activations"), act_calibration=p.get("act_calibration"),
                      kv_cache=p.get("kv_cache"))


def _gptq_groups(names: list[str]) -> list[list[str]]:
    """The Linears GPTQ calibrates together (those reading one input: q/k/v, gate/up), by name."""
    groups: dict[str, list[str]] = {}
    for n in names:
        parent, _, leaf = n.rpartition(".")
        key = f"{parent}.qkv" if leaf in ("q_proj", "k_proj", "v_proj") else \
            f"{parent}.gu" if leaf in ("gate_proj", "up_proj") else n
        groups.setdefault(key, []).append(n)
    return list(groups.values())


@planner("quantize")
def plan_quantize(p: dict[str, Any]) -> Plan:
    from specpress.compress.agreement import agreement_rows
    from specpress.compress.quantize.api import select_modules
    from specpress.compress.quantize.calibrate import default_calib_batches
    from specpress.models.quantized.configs import GPTQSettings

    d = p.get("_drafter") or drafter_facts(p["drafter_dir"])
    config = p.get("_config") or _quantize_config(p)
    names, _ = select_modules(d.model, config)
    widths = linear_widths(d.model)
    q_params = sum(widths[n][0] * widths[n][1] for n in names)
    b, n = p.get("batch", 4), p.get("seq_len", 128)
    phases: dict[str, dict[str, int]] = {}
    holds = {"drafter": d.held}
    work: dict[str, Any] = {"target_forwards": 0, "target_tokens": 0}
    common = {"drafter": d.held, "codes": 2 * q_params}  # the SQNR reads the replaced Linears, not copies
    t = None
    if p.get("target_dir") is not None:
        t = target_facts(p["target_dir"], p.get("target_dtype", "bf16"))
        vd = getattr(d.model.config, "draft_vocab_size", t.cfg.vocab_size)
        holds["target"] = t.bytes
        evals = p.get("eval_batches", 4)
        if evals:
            rows = min(b, agreement_rows(d.model, n))  # the windows agreement scores at once
            phases["agreement"] = {"target": t.bytes, "drafter": d.held, "data": data_bytes(p.get("data_path")),
                                   "target forward": forward_bytes(t, rows, n, False, d.taps) + HEAD_BLOCK,
                                   "signals + loss": rows * n * (vd * 32 + d.model.config.hidden_size * 20)}
        work["target_forwards"] += 2 * evals
        work["target_tokens"] += 2 * evals * b * n
    phase = {**({"target": t.bytes} if t else {}), **common}
    if isinstance(config, GPTQSettings):  # integer and low-bit GPTQ: the same Hessians and rounds
        assert t is not None
        batches = p.get("calib_batches") or default_calib_batches(d.model, config, b, n)
        groups = _gptq_groups(names)
        k = max(widths[g[0]][0] for g in groups)
        hessian = 4 * k * k + 8 * k * k * 3 + 4 * k * k  # the fp32 sum; gptq_codes' float64 H and two of H + λI, its
        #                                                factor, its inverse and that one's factor; the fp32 result
        phase["gptq hessian (widest group)"] = hessian
        phase["calibration rounds (target KV)"] = kv_bytes(t.cfg, n, t.es)
        holds["gptq hessian"] = hessian
        passes = 1 + (len(groups) if config.sequential else 1)
        prompts = batches * b
        forwards = passes * prompts * (n - n // 2 + 1)  # a rounds pass: each prompt's prefill and one
        work.update(target_forwards=work["target_forwards"] + forwards,  # verify per new token at most (tau 1)
                    target_tokens=work["target_tokens"] + passes * prompts * n, calibration_batches=batches,
                    calibration_passes=passes)
    phases["quantize"] = phase
    phases["save"] = {**({"target": t.bytes} if t else {}), "drafter": d.held, "codes": 2 * q_params,
                      "serialized": int(SAVE_COPY * d.stored)}
    return Plan("quantize", base_bytes(), phases, holds, work,
                [f"target held in {t.dtype}"] if t else ["no target: bytes and SQNR only"])


@planner("prune")
def plan_prune(p: dict[str, Any]) -> Plan:
    d = p.get("_drafter") or drafter_facts(p["drafter_dir"])
    phases: dict[str, dict[str, int]] = {}
    holds = {"drafter": d.held}
    work: dict[str, Any] = {"target_forwards": 0, "target_tokens": 0}
    b, n = p.get("batch", 8), p.get("seq_len", 128)
    phase = {"drafter": d.held, "pruned copy": d.held}
    if p.get("target_dir") is not None:
        from specpress.compress.prune import VOCAB_MINUTES, VOCAB_TOKENS

        t = target_facts(p["target_dir"], p.get("target_dtype", "bf16"))
        holds["target"] = t.bytes
        vd = getattr(d.model.config, "draft_vocab_size", t.cfg.vocab_size)
        cb = p.get("calib_batches", 2)
        k = 1
        signals = cb * (b * n * vd * t.es + b * n * d.model.config.hidden_size * (1 + d.taps) * 4)
        probes = cb * b * n * k * vd * 4 * 2
        phase.update({"target": t.bytes, "calibration signals + probes": signals + probes,
                      "data": data_bytes(p.get("data_path"))})
        if p.get("vocab") is not None:
            tokens = p.get("vocab_tokens") or VOCAB_TOKENS
            fw = math.ceil(tokens / (b * n))
            phase["vocab counting forward"] = forward_bytes(t, b, n, logits=True)
            work.update(vocab_forwards=f"{fw} (or --vocab-minutes {p.get('vocab_minutes') or VOCAB_MINUTES}, "
                                       f"whichever ends first)", vocab_tokens=tokens)
            work["target_forwards"] += fw
            work["target_tokens"] += fw * b * n
        work["target_forwards"] += cb
        work["target_tokens"] += cb * b * n
    phases["prune"] = phase
    phases["save"] = {k: v for k, v in phase.items() if k in ("target", "drafter", "pruned copy")}
    phases["save"]["serialized"] = int(SAVE_COPY * d.stored)
    return Plan("prune", base_bytes(), phases, holds, work)


def _export_bytes(d: DrafterFacts, dtype: str) -> int:
    """An export's own weights as onnxruntime holds them: floats in the graph's dtype; a quantized drafter's
    codes as stored."""
    return d.stored if d.quantized else d.params * ES[dtype]


@planner("export onnx")
def plan_export_onnx(p: dict[str, Any]) -> Plan:
    from specpress.models.drafter import get_family

    d = drafter_facts(p["drafter_dir"])
    t = target_facts(p["target_dir"], p.get("target_dtype", "auto"))
    dtype = p.get("dtype", "fp32")
    ort = _export_bytes(d, dtype)
    head = t.cfg.vocab_size * t.cfg.hidden_size * ES[dtype] if get_family(d.family).draft_vocab == "target" else 0
    ref = d.held // 4 * ES[dtype] if dtype != "fp32" else 0
    phases = {"build": {"target": t.bytes, "drafter": d.held, "reference copy": ref + (d.held if ref else 0)},
              "validate": {"target": t.bytes, "drafter": d.held, "reference copy": ref,
                           "onnxruntime weights (mapped)": ort + head, "onnxruntime sessions": ORT_SESSIONS}}
    return Plan("export onnx", base_bytes(onnx=True), phases,
                {"target": t.bytes, "drafter": d.held, "export weights": ort + head},
                {"target_forwards": 3 * 7 + 3 * 4 * 2, "target_tokens": 3 * 8 + 3 * 32},
                [f"target held in {t.dtype}; graphs in {dtype}"])


@planner("export target")
def plan_export_target(p: dict[str, Any]) -> Plan:
    dtype = p.get("dtype", "fp32")
    t = target_facts(p["target_dir"], dtype)
    logits = 3 * 32 * t.cfg.vocab_size * 4 * 2
    phases = {"torch reference": {"target": t.bytes, "forward": forward_bytes(t, 1, 32, True), "logits kept": logits},
              "onnxruntime validation": {"onnxruntime weights": t.bytes, "logits kept": logits,
                                         "forward": forward_bytes(t, 1, 32, True),
                                         "onnxruntime sessions": ORT_SESSIONS}}
    return Plan("export target", base_bytes(onnx=True), phases, {"target": t.bytes},
                {"target_forwards": 3 * (7 + 24 + 1) + 3 * 24 + 1, "target_tokens": 3 * (8 + 24) * 2},
                [f"target held in {dtype}, released before onnxruntime opens the graph"])


@planner("bench", "run")
def plan_decode(p: dict[str, Any]) -> Plan:
    from specpress.runtime.backends import get_backend, is_drafter_artifact

    t = target_facts(p["target_dir"], p.get("dtype", "fp32"))
    new = p.get("max_new_tokens", 64)
    prompts = 1
    if p.get("prompts_file"):
        try:
            prompts = sum(1 for line in Path(p["prompts_file"]).expanduser().read_text().splitlines() if line.strip())
        except OSError:
            prompts = 1
    kv = 2 * kv_bytes(t.cfg, min(t.cfg.max_context, new + 512), t.es)  # target's + drafter's (upper bound)
    phase = {"target": t.bytes, "kv caches + logits": kv + 64 * t.cfg.vocab_size * 4}
    holds = {"target": t.bytes}
    phases = {}
    onnx = False
    if p.get("drafter_dir") is not None:
        path = Path(p["drafter_dir"]).expanduser()
        backend = p.get("backend", "torch")
        onnx = get_backend(backend).reads == "onnx"
        if onnx and is_drafter_artifact(path):
            d = drafter_facts(path)
            ort = _export_bytes(d, "fp32")
            phases["on-the-fly export"] = {"target": t.bytes, "drafter": d.held, "onnxruntime weights (mapped)": ort}
            phase["onnxruntime drafter (packed + mapped)"] = 2 * ort
            holds["drafter"] = ort
        elif onnx:
            from specpress.manifest import load_manifest

            ort = load_manifest(path).drafter_bytes
            phase["onnxruntime drafter (packed + mapped)"] = 2 * ort
            holds["drafter"] = ort
        else:
            d = drafter_facts(path)
            phase["drafter"] = d.held
            holds["drafter"] = d.held
    phases["decode"] = phase
    spec = 2 if p.get("drafter_dir") is not None else 1
    return Plan("bench", base_bytes(onnx=onnx), phases, holds,
                {"target_forwards": f"<= {prompts * new * spec} ({prompts} prompts x {new} tokens"
                                    f"{', plain + speculative' if spec == 2 else ''})",
                 "target_tokens": prompts * new * spec}, [f"target held in {t.dtype}"])


@planner("export hf")
def plan_export_hf(p: dict[str, Any]) -> Plan:
    """The drafter read (mapped) and written a tensor at a time; speculators' eagle3 / dflash layouts also
    store the verifier's embeddings / head, converted from the target's files to the drafter's dtype."""
    from specpress.models.io import read_config

    d = drafter_facts(p.get("drafter_dir") or p["drafter"])
    phases = {"write": {"drafter": d.stored, "serialized": int(SAVE_COPY * d.stored)}}
    holds = {"drafter": d.stored}
    from specpress.export.hf.engines import engine
    from specpress.models.drafter import get_family

    verifier = p.get("target") or p.get("verifier")  # --verifier: the deprecated spelling of --target
    layout = p.get("fmt") or (engine(p["engine"]).layouts.get(d.family) if p.get("engine") else None)
    if layout == "speculators" and get_family(d.family).speculators is not None and verifier \
            and Path(verifier).expanduser().is_dir():
        t = target_facts(verifier, "auto")
        es = {"float16": 2, "bfloat16": 2}.get(str(read_config(p.get("drafter_dir") or p["drafter"]).get(
            "torch_dtype")), 4)
        v = t.cfg.vocab_size * t.cfg.hidden_size
        phases["verifier tensor"] = {"as stored (mapped)": v * t.es, "converted": v * es}
        phases["write"]["verifier tensor"] = v * es
        holds["verifier tensor"] = v * es
    return Plan("export hf", base_bytes(), phases, holds, {"target_forwards": 0})


