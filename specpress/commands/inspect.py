"""`specpress inspect`: what a model or drafter artifact holds."""

from __future__ import annotations

import json
from pathlib import Path

import click


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@click.command("inspect")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect_cmd(path: Path, as_json: bool) -> None:
    """Show family, architecture, parameters, bytes as stored, dtype and provenance of PATH.

    PATH is an artifact directory or a bare config.json. Without weights the model is built on the
    meta device, so even an 8B-scale drafter config is counted in seconds. `params` counts what the
    drafter stores itself (embeddings and heads shared with the target are not counted).

    \b
    Examples:
      specpress inspect ~/.cache/specpress/zoo/small
      specpress inspect ./eagle3-drafter --json
      specpress inspect ./EAGLE3-LLaMA3.1-Instruct-8B/config.json
    """
    from specpress.models.inspect import inspect_artifact

    info = inspect_artifact(path)
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    rows = [("path", info.get("path")), ("family", info.get("family")), ("architecture", info.get("architecture")),
            ("params", f"{info['params']:,}"),
            ("bytes", f"{info['bytes']:,} ({_fmt_bytes(info['bytes'])}, from {info.get('bytes_source')})"),
            ("dtype", info.get("dtype")), ("bits/param", f"{info.get('bits_per_param', 0):.2f}")]
    if info.get("shared_bytes"):
        rows.append(("shared with target", f"{info['shared_bytes']:,} bytes (not counted above)"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")
    q = info.get("quantization")
    if q:
        click.echo(f"{'quantized':<{width}}  {q['scheme']} ({q['method']}): {q['quantized_bytes']:,} bytes for "
                   f"{q['quantized_params']:,} params = {q['quantized_bits_per_param']} bits/param; "
                   f"other tensors {q['other_bytes']:,} bytes")
        for name, m in q["modules"].items():
            click.echo(f"  {name}  {m['bytes']:,} B / {m['params']:,} params = {m['bits_per_param']} bits/param")
    steps = info.get("provenance") or []
    click.echo(f"{'provenance':<{width}}  {'(none)' if not steps else ''}")
    for i, step in enumerate(steps, 1):
        name = step.get("step", step.get("name", "?")) if isinstance(step, dict) else step
        click.echo(f"  {i}. {name}  {json.dumps(step, default=str)[:200] if isinstance(step, dict) else ''}")
