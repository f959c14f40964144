"""The CLI's path for `specpress export onnx` and `export target`: directories in, a validated export out, and the
summary the commands print.

    opts = ExportOptions(attention="plugin", dtype="fp16")
    rep = onnx_export("drafters/eagle3", "zoo/small", "onnx/eagle3", opts)
    print("\\n".join(onnx_lines(rep, opts)))
    rep = target_export("zoo/small", "onnx/target", TargetExportOptions())
    print("\\n".join(target_lines(rep, TargetExportOptions())))

Each claims `out` (options.force replaces it) before loading anything, then exports and validates
(export/onnx.py export_from_dirs, export/target.py export_target_from_dir); over tolerance nothing is written.
`onnx_lines` / `target_lines` are what the commands print of the report.

Importing this module does not import torch (`specpress export --help` must not).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any


def onnx_export(drafter_dir: str | Path, target_dir: str | Path, out: str | Path, options: Any, *,
                target_dtype: str = "auto", progress: Callable[[str], None] = lambda s: None,
                warn: Callable[[str], None] | None = None, bar: bool = False) -> Any:
    """Claim `out`, load the drafter on its target, export its graphs and validate them; the ExportReport.

    options: export.onnx.ExportOptions. progress: each stage's line; warn: a drafter built for another target
    (stderr by default); bar: a progress bar on stderr while validating.
    """
    from specpress.artifacts import claim_output
    from specpress.export.onnx import export_from_dirs
    from specpress.models.drafter_io import check_drafter_config

    with claim_output(out, force=options.force, inputs={"--drafter": drafter_dir, "--target": target_dir},
                      writes="specpress-onnx"):
        check_drafter_config(drafter_dir)  # before the target is built
        return export_from_dirs(drafter_dir, target_dir, out, options, progress=progress, warn=warn,
                                target_dtype=target_dtype, bar=bar)


def onnx_lines(rep: Any, options: Any) -> list[str]:
    """The summary `export onnx` prints: graphs and their bytes, worst errors on random inputs and real rounds,
    the real rounds' draft agreement, the shared bytes and tolerance, how quantized Linears were written."""
    own = sum(rep.graphs.values())
    head = (f"exported {len(rep.graphs)} graph(s) -> {rep.out}  ({rep.seconds:.1f} s, attention "
            f"{options.attention}, {options.dtype})")
    lines = [head]
    rounds = rep.rounds.errors if rep.rounds else {}
    lines.append(f"  {'graph':<10} {'bytes':>14}   max_rel / max_abs over outputs: random inputs | real rounds")
    for name, size in rep.graphs.items():
        lines.append(f"  {name:<10} {size:>12,} B   {worst(rep.errors[name])} | {worst(rounds.get(name))}")
    if rep.rounds:
        r = rep.rounds
        lines.append(f"  real rounds: {r.policy} greedy, {r.prompts} prompts, {r.rounds} rounds: {r.agree} drafted "
                     f"the same tokens, {r.near_ties} near ties, {r.disagree} differ")
    lines.append(f"  drafter graphs {own:,} B; shared target embeddings/head {rep.shared_bytes:,} B (counted apart); "
                 f"tolerance max_rel {rep.tolerance:g}")
    if rep.quantization:
        q = rep.quantization
        ops = Counter(note.split(" -> ", 1)[-1] for note in q["linears"])  # "<linear>: <scheme> -> <ops>"
        lines.append(f"  quantized Linears ({', '.join(q['schemes'])}, --quant-format {q['format']}): "
                     + "; ".join(f"{n} as {op}" for op, n in ops.items()))
    return lines


def target_export(target_dir: str | Path, out: str | Path, options: Any, *,
                  progress: Callable[[str], None] = lambda s: None) -> Any:
    """Claim `out`, check the disk has room for the weights (from the safetensors headers alone), export the
    target's forward and validate it; the TargetExportReport. options: export.target.TargetExportOptions."""
    from specpress.artifacts import check_space, claim_output
    from specpress.export.target import export_target_from_dir
    from specpress.models.io import tensor_index

    dtype = options.dtype
    with claim_output(out, force=options.force, inputs={"--target": target_dir}, writes="specpress-onnx-target"):
        params = sum(math.prod(t.shape) for t in tensor_index(target_dir).values())  # from the headers alone
        check_space(out, params * (2 if dtype == "fp16" else 4), f"the target's {params:,} parameters at {dtype}")
        return export_target_from_dir(target_dir, out, options, progress=progress)


def target_lines(rep: Any, options: Any) -> list[str]:
    """The summary `export target` prints: bytes, worst error on random inputs, greedy decoding agreement."""
    d = rep.decode
    return [f"exported the target -> {rep.out}  ({rep.seconds:.1f} s, {options.dtype}, {rep.bytes:,} B)",
            f"  random inputs: {worst(rep.errors)}; tolerance max_rel {rep.tolerance:g}",
            (f"  greedy decoding, {d['prompts']} prompts x {d['tokens']} tokens: {d['agree']} identical, "
             f"{d['near_ties']} near ties, {d['differ']} differ")]


def worst(errors: dict | None) -> str:
    """'max_rel / max_abs (output)' of the output with the largest max_rel; '-' when not run."""
    if not errors:
        return "-"
    name, e = max(errors.items(), key=lambda kv: kv[1]["max_rel"])
    return f"{e['max_rel']:.1e} / {max(x['max_abs'] for x in errors.values()):.1e} ({name})"


__all__ = ["onnx_export", "onnx_lines", "target_export", "target_lines", "worst"]
