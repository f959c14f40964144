"""The CLI's path: drafter dir (+ target and data) -> pruned artifact, and the summary `specpress prune` prints.

    report = prune_from_dirs("drafters/eagle3", "drafters/eagle3-ffn384", PruneConfig(ffn=384))
    print("\\n".join(report_lines(report)))

`prune_from_dirs` checks the request (the option combinations, then every shape / flag error from
config.json alone on a meta-device drafter, then the window and the data) before loading anything, claims
`out`, loads the drafter, the target and its calibration stream (a prompts file as --data: the target's greedy
continuations of its prompts, compress/traffic.py), prunes (compress/prune.py, recovery included) and writes
the result. `report_lines` is what the command prints of the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from specpress.compress.prune import PruneConfig, check_request, prune
from specpress.models.drafter import Drafter


@dataclass
class PruneReport:
    out: Path
    family: str
    step: dict[str, Any]  # the "prune" provenance step written
    recovery: Mapping[str, Any] | None  # the last step recovery appended (None when config.recover_steps is 0)
    drafter: Drafter  # the pruned (and recovered) drafter, as written


def prune_from_dirs(drafter_dir: str | Path, out: str | Path, config: PruneConfig, *,
                    target_dir: str | Path | None = None, data_path: str | Path | None = None,
                    continuation_tokens: int | None = None, target_dtype: str = "bf16", force: bool = False,
                    progress: bool = False,
                    on_prompt: Callable[[int, int], None] | None = None) -> PruneReport:
    """Check, load, prune (and recover), write `out`; every refusal comes before any loading.

    data_path: calibration data tokenized by `target_dir`'s tokenizer (it needs the target), or a prompts file
    (bench's format): the target's greedy continuations of its prompts, `continuation_tokens` each
    (traffic.CONTINUATION_TOKENS when None; giving it for other data is refused), are then the data.
    progress: a bar on stderr while the vocab stage counts; on_prompt(i, n): called after each prompt of a
    prompts file is continued. force: replace an existing `out`.
    """
    from specpress.artifacts import claim_output
    from specpress.compress.calibration import target_stream
    from specpress.compress.data import check_data
    from specpress.compress.guards import check_seq_len
    from specpress.compress.traffic import CONTINUATION_TOKENS, is_prompts_file, traffic_stream
    from specpress.errors import RequestError, UsageError
    from specpress.models.drafter import build_drafter
    from specpress.models.drafter_io import load_drafter, read_drafter_config, save_drafter
    from specpress.models.target import load_target
    from specpress.models.tokenizer import load_tokenizer

    out = Path(out).expanduser()
    if data_path is not None and target_dir is None:
        raise UsageError("--data needs --target DIR: its tokenizer encodes the data")
    traffic = data_path is not None and is_prompts_file(data_path)
    if continuation_tokens is not None and not traffic:
        raise RequestError("--continuation-tokens sets how much the target generates per prompt of a prompts file "
                           "given as --data; --data is not one (a .jsonl of {\"prompt\": ...} or {\"input_ids\": "
                           "[...]} lines): drop --continuation-tokens or give a prompts file")
    inputs = {"--drafter": drafter_dir, "--target": target_dir, "--data": data_path}
    with claim_output(out, force=force, inputs=inputs, writes="drafter"):
        with torch.device("meta"):  # every shape / flag error first, from config.json alone
            shape = build_drafter(read_drafter_config(drafter_dir)[1])
            counts = check_request(shape, config, has_target=target_dir is not None, has_calib=data_path is not None)
        say_legacy(config, shape.config, counts)
        if target_dir is not None:
            check_seq_len(target_dir, config.seq_len, config.batch, training=config.recover_steps > 0)
        if data_path is not None:
            check_data(data_path)  # a device, a FIFO or more text than memory: refused before loading
        target = load_target(target_dir, dtype=target_dtype) if target_dir is not None else None
        stream, extra = None, {}
        if data_path is not None:
            assert target is not None and target_dir is not None
            extra = {"source": str(data_path), "target": str(target_dir)}
            if traffic:
                tdir = Path(target_dir).expanduser()
                tok = load_tokenizer(target_dir) if (tdir / "tokenizer.json").is_file() else None
                stream, record = traffic_stream(target, data_path, tok, continuation_tokens or CONTINUATION_TOKENS,
                                                on_prompt=on_prompt)
                extra["traffic"] = record
            else:
                stream = target_stream(target, target_dir, data_path)
        pruned = prune(load_drafter(drafter_dir, target), config, target=target, calib=stream,
                       provenance_extra=extra, progress=progress)
        save_drafter(pruned, out, force=force)
    step = next(s for s in reversed(pruned.provenance) if s.get("step") == "prune")
    recovery = pruned.provenance[-1] if config.recover_steps else None
    return PruneReport(out, pruned.family, step, recovery, pruned)


def say_legacy(config: PruneConfig, shape: Any, counts: dict[str, int]) -> None:
    """The deprecation warning for --ffn R / --heads R (shares to remove), with the count that says the same.
    shape: the drafter's config."""
    from specpress.errors import deprecated

    if isinstance(config.ffn, float):
        n = shape.intermediate_size
        deprecated(f"--ffn {config.ffn:g} (the share of FFN channels to remove)",
                   f"give the channels each layer keeps: --ffn {n - counts['ffn']} (of {n})")
    if config.heads is not None:
        n = shape.num_key_value_heads
        deprecated(f"--heads {config.heads:g} (the share of KV groups to remove)",
                   f"give the KV groups each attention keeps: --kv-heads {n - counts['heads']} (of {n})")


def report_lines(report: PruneReport) -> list[str]:
    """The summary `specpress prune` prints: the shape change, sizes, what the vocab / head stages did, the
    calibration fit before / after, and the recovery."""
    step = report.step
    before, after = step["shape_before"], step["shape_after"]
    changed = ", ".join(f"{k} {before.get(k)} -> {after[k]}" for k in after if before.get(k) != after[k])
    lines = [f"{report.family} drafter written to {report.out}", f"  {changed}",
             (f"  params {step['params_before']:,} -> {step['params_after']:,}  bytes {step['bytes_before']:,} -> "
              f"{step['bytes_after']:,} ({step['bytes_after'] / step['bytes_before']:.1%})")]
    cal = step["calibration"]
    vocab_rec = step["importance"].get("vocab")
    if vocab_rec:
        on = (f"the target's continuations of {cal['traffic']['prompts']} prompts" if "traffic" in cal else
              "the calibration data")
        cov0, cov1 = vocab_rec["coverage_before"], vocab_rec["coverage_after"]
        lines.append(f"  draft vocabulary ranked on {vocab_rec['counted_tokens']:,} tokens of {on}: it covers "
                     f"{100 * cov1:.1f} % of them (was {100 * cov0:.1f} %)")
    head_rec = step["importance"].get("head")
    if head_rec:
        what = (f"the target's lm_head rows ({head_rec['rows']:,} draft tokens, read at load)" if head_rec.get("shared")
                else f"rank {head_rec['rank']} factors ({head_rec['init']} init, weight error "
                     f"{100 * head_rec['weight_rel_error']:.1f} %)")
        lines.append(f"  draft head: {head_rec['params_before']:,} -> {head_rec['params_after']:,} parameters stored: "
                     f"{what}")
    if "agreement_before" in cal:
        lines.append(f"  calibration top-1 agreement {cal['agreement_before']:.3f} -> {cal['agreement_after']:.3f}, "
                     f"KL {cal['kl_before']:.4f} -> {cal['kl_after']:.4f} ({cal['tokens']} tokens, before recovery)")
    if report.recovery is not None:
        last = report.recovery
        acc = " ".join(f"{a:.3f}" for a in last.get("agreement", []))
        lines.append(f"  recovered: {last.get('steps')} distillation steps, loss {last.get('final_loss', 0):.4f}, "
                     f"acc@k {acc}")
    return lines


__all__ = ["PruneReport", "prune_from_dirs", "report_lines", "say_legacy"]
