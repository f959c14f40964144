"""Short zoo builds with preset overrides, for choosing the training budget (batch, lr, steps).

    python bench/zoo_budget.py --steps 300 --set lr=0.004 --out /tmp/zoo-lr4
    python bench/zoo_budget.py --steps 400 --set optimizer=muon --set lr=0.004 --out /tmp/zoo-muon

Builds the small preset with the given overrides into --out (from scratch) and prints one JSON line:
the overrides, validation loss / perplexity, training seconds and tokens/s. Compare runs that saw the
same number of tokens (steps x batch_size x seq_len).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import fields, replace
from pathlib import Path

from specpress.zoo.build import PRESETS, ZooPreset, build_zoo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="ZooPreset field override, e.g. batch_size=8 (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    types = {f.name: f.type for f in fields(ZooPreset)}
    kw: dict[str, object] = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in types:
            ap.error(f"unknown preset field {name!r}; fields: {', '.join(types)}")
        try:
            kw[name] = json.loads(value)
        except json.JSONDecodeError:  # a bare word, e.g. optimizer=muon
            kw[name] = value
    preset = replace(PRESETS["small"], **kw)
    for p in (args.out, args.out.with_name(args.out.name + ".partial")):
        shutil.rmtree(p, ignore_errors=True)
    t0 = time.monotonic()
    r = build_zoo(args.out, preset=preset, steps=args.steps, progress=False)
    rate = r.tokens_seen / max(r.train_seconds, 1e-9)
    print(json.dumps({"steps": args.steps, **kw, "tokens": r.tokens_seen, "val_loss": r.val_loss,
                      "val_perplexity": r.val_perplexity, "train_s": r.train_seconds, "tokens_per_s": round(rate),
                      "wall_s": round(time.monotonic() - t0)}))


if __name__ == "__main__":
    main()
