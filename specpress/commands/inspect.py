"""`specpress inspect`: what a model or drafter artifact holds."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import click


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@click.command("inspect")
@click.argument("path", type=click.Path(path_type=Path), required=False)
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              type=click.Path(path_type=Path, allow_dash=True),
              help="Write every field as one JSON object to FILE; bare --json (or -) prints it on stdout.")
@click.option("--force", is_flag=True, help="Replace an existing --json file.")
def inspect_cmd(path: Path | None, json_out: Path | None, force: bool) -> None:
    """Show family, architecture, parameters, bytes as stored, dtype and provenance of PATH.

    PATH is an artifact directory or a bare config.json. Without weights the model is built on the
    meta device, so even an 8B-scale drafter config is counted in seconds. `params` counts what the
    drafter stores itself (embeddings and heads shared with the target are not counted).

    \b
    Examples:
      specpress inspect ~/.cache/specpress/zoo/small
      specpress inspect ./eagle3-drafter --json
      specpress inspect ./eagle3-drafter --json eagle3.json
      specpress inspect ./EAGLE3-LLaMA3.1-Instruct-8B/config.json
    """
    from specpress.errors import UsageError
    from specpress.models.inspect import inspect_artifact

    if path is None and json_out not in (None, Path("-")):  # `inspect --json PATH`: the flag, then the artifact
        path, json_out = json_out, Path("-")
    if path is None:
        raise UsageError("give the artifact to inspect: specpress inspect PATH")
    if json_out is not None and json_out != Path("-"):
        from specpress.artifacts import check_output

        check_output(json_out, force=force, kind="file", flag="--json", inputs={"PATH": path})
    info = inspect_artifact(path)
    if json_out is not None:
        text = json.dumps(info, indent=2, default=str)
        if json_out == Path("-"):
            click.echo(text)
        else:
            from specpress.artifacts import write_file

            write_file(json_out, text + "\n")
            click.echo(f"wrote {json_out}")
        return
    rows = [("path", info.get("path")), ("family", info.get("family")), ("architecture", info.get("architecture")),
            ("params", f"{info['params']:,}"),
            ("bytes", f"{info['bytes']:,} ({_fmt_bytes(info['bytes'])}, from {info.get('bytes_source')})"),
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
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")
    q = info.get("quantization")
    if q:
        click.echo(f"{'quantized':<{width}}  {q['scheme']} ({q['method']}): {q['quantized_bytes']:,} bytes for "
                   f"{q['quantized_params']:,} params = {q['quantized_bits_per_param']} bits/param; "
                   f"other tensors {q['other_bytes']:,} bytes")
        if q.get("speed"):
            click.echo(f"{'computed':<{width}}  {q['speed']}")
        for name, m in q["modules"].items():
            click.echo(f"  {name}  {m['bytes']:,} B / {m['params']:,} params = {m['bits_per_param']} bits/param")
    steps = info.get("provenance") or []
    click.echo(f"{'provenance':<{width}}  {'(none)' if not steps else ''}")
    for i, step in enumerate(steps, 1):
        text = describe_step(step) if isinstance(step, dict) else str(step)
        click.echo(textwrap.fill(text, width=110, initial_indent=f"  {i}. ", subsequent_indent="     ",
                                 break_on_hyphens=False, break_long_words=False))
    if steps:
        click.echo("  (every field: specpress inspect PATH --json)")
    for warning in info.get("warnings") or []:
        click.echo(f"warning: {warning}", err=True)


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
            from specpress.compress.quantize.report import allocation_line

            parts.append("budget " + allocation_line(step["allocation"]))
        if step.get("target_quant"):
            parts.append(f"calibrated against the target compressed as {step['target_quant']['label']}")
        return "; ".join(parts)
    scalars = [f"{k} {v}" for k, v in step.items() if k not in ("step", "name") and isinstance(v, (str, int, float))]
    return f"{kind}: {', '.join(scalars)}" if scalars else kind


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
