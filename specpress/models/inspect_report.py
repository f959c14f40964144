"""The CLI's path for `specpress inspect`: an artifact in, its fields out (and, with --json FILE, written
there), and the lines the command prints.

    info = inspect_to("drafters/eagle3")                    # models/inspect.py's inspect_artifact
    print("\\n".join(inspect_lines(info)))                  # family, bytes, quantization, provenance
    inspect_to("drafters/eagle3", json_file="e3.json")      # the same fields as inspect_json(info), in a file

`describe_step` is the one line each provenance step gets; `allocation_line` the one a --budget allocation
gets (quantize's own summary prints it too).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any


def inspect_to(path: str | Path, json_file: str | Path | None = None, *, force: bool = False) -> dict[str, Any]:
    """inspect_artifact(path); with `json_file`, that file checked before reading (force: replace it) and
    inspect_json of the fields written to it."""
    from specpress.artifacts import check_output, write_file
    from specpress.models.inspect import inspect_artifact

    if json_file is not None:
        check_output(json_file, force=force, kind="file", flag="--json", inputs={"PATH": path})
    info = inspect_artifact(path)
    if json_file is not None:
        write_file(json_file, inspect_json(info) + "\n")
    return info


def inspect_json(info: dict[str, Any]) -> str:
    """Every field as one JSON object (what --json prints or writes)."""
    return json.dumps(info, indent=2, default=str)


def fmt_bytes(n: float) -> str:
    """`n` bytes in B (whole) or KiB / MiB / GiB (two decimals)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def inspect_lines(info: dict[str, Any]) -> list[str]:
    """What `inspect PATH` prints on stdout: one aligned row per field, the quantization per module, and one
    wrapped line per provenance step. (info["warnings"] go to stderr, apart.)"""
    rows = [("path", info.get("path")), ("family", info.get("family")), ("architecture", info.get("architecture")),
            ("params", f"{info['params']:,}"),
            ("bytes", f"{info['bytes']:,} ({fmt_bytes(info['bytes'])}, from {info.get('bytes_source')})"),
            ("dtype", info.get("dtype")), ("bits/param", f"{info.get('bits_per_param', 0):.2f}")]
    if info.get("shared_bytes"):
        head = info.get("shared_head_params") or 0
        rows.append(("shared with target", f"{info['shared_bytes']:,} bytes (not counted above"
                     + (f"; {head:,} of the target's head parameters read as the draft head)" if head else ")")))
    tp = info.get("target_precision")
    if tp:
        rows.append(("target precision", f"{tp['label']}" + ("" if tp["spec"] == "none" else f" (--target-quant "
                     f"{tp['spec']})") + f": aligned with it by step {tp['step']} ({tp['by']})"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    q = info.get("quantization")
    if q:
        lines.append(f"{'quantized':<{width}}  {q['scheme']} ({q['method']}): {q['quantized_bytes']:,} bytes for "
                     f"{q['quantized_params']:,} params = {q['quantized_bits_per_param']} bits/param; "
                     f"other tensors {q['other_bytes']:,} bytes")
        if q.get("speed"):
            lines.append(f"{'computed':<{width}}  {q['speed']}")
        for name, m in q["modules"].items():
            lines.append(f"  {name}  {m['bytes']:,} B / {m['params']:,} params = {m['bits_per_param']} bits/param")
    steps = info.get("provenance") or []
    lines.append(f"{'provenance':<{width}}  {'(none)' if not steps else ''}")
    for i, step in enumerate(steps, 1):
        text = describe_step(step) if isinstance(step, dict) else str(step)
        lines.append(textwrap.fill(text, width=110, initial_indent=f"  {i}. ", subsequent_indent="     ",
                                   break_on_hyphens=False, break_long_words=False))
    if steps:
        lines.append("  (every field: specpress inspect PATH --json)")
    return lines


def _acc(values: Any) -> str:
    return " ".join(f"{float(a):.3f}" for a in values or [])


def describe_step(step: dict[str, Any]) -> str:
    """One readable line per provenance step: what was done, with what, and what it cost or gained."""
    kind = str(step.get("step", step.get("name", "?")))
    cfg = step.get("config") or {}
    if kind == "distill":
        data = step.get("data") or {}
        parts = [f"distill {cfg.get('family', '')}: {step.get('steps')} steps, loss {step.get('final_loss', 0):.4f}",
                 f"acc@k {_acc(step.get('agreement'))} ({'held-out' if step.get('heldout') else 'training data'})"]
        if data.get("source"):
            parts.append(f"data {data['source']} ({int(data.get('tokens', 0)):,} tokens)")
        for key, label in (("target", "target"), ("init", "fine-tuned from"), ("from", "shrunk from")):
            if data.get(key):
                parts.append(f"{label} {data[key]}")
        if data.get("target_quant"):
            parts.append(f"target compressed as {data['target_quant']['label']}")
        return "; ".join(parts)
    if kind == "prune":
        before, after = step.get("shape_before") or {}, step.get("shape_after") or {}
        changed = ", ".join(f"{k} {before.get(k)} -> {v}" for k, v in after.items() if before.get(k) != v)
        return (f"prune: {changed or 'no shape change'}; params {int(step.get('params_before', 0)):,} -> "
                f"{int(step.get('params_after', 0)):,}")
    if kind == "quantize":
        what = f"quantize {_quant_label(cfg, step)}"
        parts = [f"{what}: {len(step.get('quantized') or [])} Linears, bytes {int(step.get('bytes_before', 0)):,} -> "
                 f"{int(step.get('bytes_after', 0)):,}" + (" (written dequantized)" if step.get("dequantized") else "")]
        rec = step.get("recovery") or {}
        if rec:
            parts.append(f"recovered {rec.get('steps')} steps ({', '.join(rec.get('scales') or [])} scales, loss "
                         f"{float(rec.get('final_loss', 0)):.4f})")
        agr = step.get("agreement") or {}
        if agr.get("before") and agr.get("after"):
            parts.append(f"acc@k {_acc(agr['before'])} -> {_acc(agr['after'])}")
        if step.get("allocation"):
            parts.append("budget " + allocation_line(step["allocation"]))
        if step.get("target_quant"):
            parts.append(f"calibrated against the target compressed as {step['target_quant']['label']}")
        return "; ".join(parts)
    scalars = [f"{k} {v}" for k, v in step.items() if k not in ("step", "name") and isinstance(v, (str, int, float))]
    return f"{kind}: {', '.join(scalars)}" if scalars else kind


def allocation_line(a: dict) -> str:
    """One line about a --budget allocation (quantize's output and inspect)."""
    counts: dict[str, int] = {}
    for lab in a["choice"].values():
        counts[lab] = counts.get(lab, 0) + 1
    return (f"{a['budget']} = {int(a['budget_bytes']):,} B; stores {int(a['measured_bytes']):,} B (predicted "
            f"{int(a['predicted_bytes']):,}; candidates span {int(a['min_bytes']):,}..{int(a['max_bytes']):,}); "
            + ", ".join(f"{n} x {lab}" for lab, n in counts.items())
            + f"; {a['sensitivity']} sensitivity, {a['seconds']:.1f} s")


def _quant_label(cfg: dict, step: dict) -> str:
    """The recorded config's storage label and method (`int4-g64 gptq`); the scheme word when the
    config cannot be read back."""
    from specpress.errors import ConfigError
    from specpress.models.quantized.scheme import config_from_dict

    if step.get("scheme") == "mixed":
        kinds = sorted({config_from_dict(c).storage_label() for c in step["module_configs"].values()})
        return f"mixed ({', '.join(kinds)})"
    try:
        return f"{config_from_dict(cfg).storage_label()} {step.get('method')}"
    except ConfigError:
        return f"{step.get('scheme')} {step.get('method')}"
