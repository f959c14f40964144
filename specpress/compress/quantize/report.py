"""The lines `specpress quantize` prints about a finished run: `report_lines(rep)`, each without its newline."""

from __future__ import annotations

from typing import Any

from specpress.models.inspect_report import allocation_line


def fmt_bytes(n: int) -> str:
    return f"{n:,} B" if n < 1024 else f"{n:,} B ({n / 1024 ** (2 if n >= 1024 ** 2 else 1):.2f} " \
                                        f"{'MiB' if n >= 1024 ** 2 else 'KiB'})"


def report_lines(rep: Any) -> list[str]:
    """What was written, bytes before / after, the allocation, weight SQNR, input scales, recovery, what was
    kept and why, notes, the compressed target, and acc@k before / after (or how to measure it).
    rep: a QuantizeReport (pipeline.quantize_from_dirs); everything is read from its step."""
    from specpress.models.quantized.scheme import config_from_dict

    s = rep.step
    lines = []
    what = ("mixed: one scheme per Linear" if s["scheme"] == "mixed" else
            f"{config_from_dict(s['config']).storage_label()}, method {s['method']}")
    lines.append(f"{rep.family} drafter quantized ({what}): {len(s['quantized'])} Linears -> {rep.out}"
                 + ("  [written dequantized: plain float weights]" if s.get("dequantized") else ""))
    source, before, after = s["source_bytes"], s["bytes_before"], s["bytes_after"]
    if s.get("dequantized"):
        lines.append(f"  bytes   {fmt_bytes(source)} as stored ({s['source_dtype']}) -> {fmt_bytes(after)} written "
                     f"as plain {s['float_dtype']} weights (the quantization error is kept, the packing is not)")
    else:
        lines.append(f"  bytes   {fmt_bytes(source)} as stored ({s['source_dtype']}) -> {fmt_bytes(after)}  "
                     f"({source / max(after, 1):.2f}x smaller; {100 * after / max(before, 1):.1f}% of the source in "
                     f"{s['float_dtype']}; quantized Linears "
                     f"{8 * s['quantized_bytes'] / max(s['quantized_params'], 1):.2f} bits/param)")
    if s.get("allocation"):
        lines.append("  budget  " + allocation_line(s["allocation"]))
    sq = {k: v for k, v in s["weight_sqnr_db"].items() if v is not None}
    if sq:
        worst = min(sq, key=sq.get)  # type: ignore[arg-type]
        lines.append(f"  weight SQNR  min {sq[worst]:.1f} dB ({worst}), mean {sum(sq.values()) / len(sq):.1f} dB")
    if s.get("input_amax"):
        amax = s["input_amax"].values()
        lines.append(f"  inputs  static input scales for {len(amax)} Linears: activation amax {min(amax):.4g} .. "
                     f"{max(amax):.4g}")
    rec = s.get("recovery")
    if rec:
        lines.append(f"  recovered  {rec['steps']} steps of quantization-aware distillation "
                     f"({', '.join(rec['scales'])} scales), final loss {rec['final_loss']:.4f}, {rec['seconds']:.0f} s")
    for sk in s["skipped"]:
        lines.append(f"  kept    {sk['module']}: {sk['reason']}")
    for note in s["notes"]:
        lines.append(f"  note    {note}")
    if s.get("target_quant"):
        lines.append(f"  target  calibrated and measured against the target compressed as "
                     f"{s['target_quant']['label']} (--target-quant {s['target_quant']['spec']})")
    if rep.before is not None and rep.after is not None:
        where = "held-out" if rep.heldout else "fresh windows (no held-out split: data too small)"
        lines.append(f"  acc@k before {' '.join(f'{a:.3f}' for a in rep.before)}")
        lines.append(f"  acc@k after  {' '.join(f'{a:.3f}' for a in rep.after)}  "
                     f"(delta {' '.join(f'{b - a:+.3f}' for a, b in zip(rep.before, rep.after))}; {where})")
    else:
        lines.append("  acceptance cost not measured: pass --target DIR --data PATH to report acc@k before / after")
    return lines
