"""The CLI's path for `specpress export hf`: a drafter directory -> the serving layout in OUT -> its summary.

    summary = hf_export("drafters/eagle3", "serve/eagle3", engine="vllm", target="meta-llama/Llama-3.1-8B")
    print("\\n".join(summary.lines()))  # what was written, the command that serves it, the notes

`hf_export` refuses a command line that is wrong whatever the drafter (neither --for nor --format, a --format
the engine never writes) before `out` is claimed, takes the deprecated --verifier spelling of --target (a
warning), claims `out` (a local target directory counts as an input) and writes it (export/hf/api.py
export_hf, which refuses what the engine cannot load before writing anything). Importing this module does not
import torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def hf_export(drafter: str | Path, out: str | Path, fmt: str | None = None, *, engine: str | None = None,
              target: str | None = None, legacy_verifier: str | None = None, policy: str | None = None,
              force: bool = False, materialize_head: bool = False) -> Any:
    """Check the flags, claim `out`, write `drafter` as `engine` (vllm | sglang | trtllm | edgellm) loads it or in
    layout `fmt` (speculators | modelopt); the ExportSummary. target: the model id or local directory the server loads;
    legacy_verifier: --verifier, the old spelling of target (UsageError with both). force: replace `out`."""
    from specpress.artifacts import claim_output
    from specpress.errors import UsageError, deprecated
    from specpress.export.hf import export_hf
    from specpress.export.hf.api import check_flags

    check_flags(fmt, engine)  # before --out is claimed: the command line alone is wrong
    if legacy_verifier is not None:
        if target is not None:
            raise UsageError("--verifier is the old spelling of --target; give --target only")
        deprecated("--verifier", "use --target")
        target = legacy_verifier
    local = target if target is not None and Path(target).expanduser().exists() else None  # not a model id
    with claim_output(out, force=force, inputs={"--drafter": drafter, "--target": local}, writes="drafter"):
        return export_hf(drafter, out, fmt, engine=engine, verifier=target, policy=policy, force=force,
                         materialize_head=materialize_head)
