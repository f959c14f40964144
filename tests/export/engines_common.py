"""Shared by the engine tests: drafters wide enough for every scheme's block (in_features 64 / 128 / 192:
groups of 16 / 32 / 64 divide them), one quantize config per scheme cell, and their exports."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import torch
from drafters_common import randomize, run

from specpress.compress.quantize.api import quantize
from specpress.export.hf import export_hf
from specpress.models.dflash import DFlashConfig
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import save_drafter
from specpress.models.eagle import EagleConfig
from specpress.models.eagle3 import Eagle3Config
from specpress.models.lm import LMConfig
from specpress.models.quantized.scheme import config_for
from specpress.models.target import TargetConfig, TargetModel, save_target

V, H, F, L = 61, 64, 128, 8
SHAPE = dict(vocab_size=V, hidden_size=H, intermediate_size=F, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256)
CONFIGS = {
    "eagle3": Eagle3Config(**SHAPE, draft_vocab_size=24),
    "dflash": DFlashConfig(**SHAPE, num_hidden_layers=2, num_target_layers=L, block_size=4, mask_token_id=0),
    "eagle": EagleConfig(**SHAPE),
    "lm": LMConfig(**SHAPE, num_hidden_layers=2),
}


def fp8(act: str, granularity: str = "channel"):
    return replace(config_for("fp8", activations=act), granularity=granularity)


# scheme cell -> its quantize config (the schemes engines deploy; group 16 keeps int4 off PyTorch's int4 kernel,
# so specpress's forward is the dequantized one)
CELLS = {
    "int4": lambda: config_for("int4", group_size=16),
    "int4-asym": lambda: config_for("int4", group_size=16, symmetric=False),
    "int4-awq": lambda: config_for("int4", "awq", group_size=16),
    "int8": lambda: config_for("int8"),
    "int8-asym": lambda: config_for("int8", group_size=16, symmetric=False),
    "int8-dynamic": lambda: config_for("int8", activations="dynamic"),
    "int8-static": lambda: config_for("int8", activations="static"),
    "int8-smoothquant": lambda: config_for("int8", "smoothquant", activations="static"),
    "fp8": lambda: fp8("none"),
    "fp8-dynamic": lambda: fp8("dynamic"),
    "fp8-static": lambda: fp8("static"),
    "fp8-tensor-static": lambda: fp8("static", "tensor"),
    "nvfp4": lambda: config_for("nvfp4"),
    "nvfp4-static": lambda: config_for("nvfp4", activations="static"),
    "mxfp8": lambda: config_for("mxfp8", activations="none"),
    "mxfp8-dynamic": lambda: config_for("mxfp8"),
    "mxfp4": lambda: config_for("mxfp4", activations="none"),
    "nf4": lambda: config_for("nf4"),
    "int3": lambda: config_for("int3", group_size=16),
    "int3-asym": lambda: config_for("int3", group_size=16, symmetric=False),
    "int2": lambda: config_for("int2", group_size=16),
    "int2-asym": lambda: config_for("int2", group_size=16, symmetric=False),
    "ternary": lambda: config_for("ternary", group_size=16),
}


def wide_target(seed: int = 0) -> TargetModel:
    torch.manual_seed(seed)
    t = randomize(TargetModel(TargetConfig(**SHAPE, num_hidden_layers=L)), seed)
    with torch.no_grad():
        t.model.embed_tokens.weight.normal_(0, 1)
    return t


def drafter(family: str, target: TargetModel, seed: int = 1, **changes):
    d = randomize(build_drafter(dataclasses.replace(CONFIGS[family], **changes)), seed).attach_target(target)
    if family == "eagle3":
        vd = d.config.draft_vocab_size
        d.set_draft_vocab(torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:vd].sort().values)
    return d


def quantized(family: str, cell: str | None, target: TargetModel, seed: int = 1, **qopts):
    """A `family` drafter quantized per `cell` (None: float), calibrated on the target where a scheme needs it."""
    d = drafter(family, target, seed)
    if cell is not None:
        cfg = CELLS[cell]()
        if qopts:
            cfg = replace(cfg, **qopts)
        quantize(d, cfg, calibration=lambda m: run(m, target))
    return d


def export(d, tmp: Path, engine: str | None = None, fmt: str | None = None, verifier: Path | None = None,
           name: str = "out"):
    src = save_drafter(d, tmp / f"{name}-src")
    return export_hf(src, tmp / name, fmt, engine=engine, verifier=None if verifier is None else str(verifier))


def saved_target(target: TargetModel, tmp: Path) -> Path:
    return save_target(target, tmp / "target")
