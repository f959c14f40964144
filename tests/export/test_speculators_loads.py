"""speculators' own code loads what `export hf --for vllm` writes for an EAGLE-3 drafter and computes what
specpress computes (speculators 0.9.0, in the side interpreter: tests/export/side.py).

For each scheme cell, `Eagle3DraftModel.from_pretrained(export)` (transformers 5.19's compressed-tensors loader
decompressing the quantized Linears, compressed-tensors 0.17.0 as vLLM 0.34 pins it) runs its own training-time
forward: three chained draft steps from every position of one window of target taps, teacher-forced, its draft
attending to the accepted context and its own chain. specpress runs the same steps (models/forced.py chain) on
the same taps and ids. The head's logits (captured at speculators' lm_head) must equal specpress's to float
rounding and every draft token (speculators' argmax over the draft vocabulary) must be equal.

A cell speculators' loader cannot take is listed in NOT_LOADED with what it raised: such a drafter is served by
vLLM (its own kernels, tests/export/test_vllm_rules.py) but not readable by speculators here.

Two cells carry a low-rank draft head (prune --head-rank 16), written with --materialize-head as the dense
lm_head vLLM builds: "headrank" float, "int4+headrank" with int4 factors multiplied back into a float head
beside int4 Linears. specpress's reference is the low-rank drafter itself (its factors).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch
from engines_common import CELLS, drafter, quantized, saved_target, wide_target
from side import run_side

from specpress.compress.prune import PruneConfig, prune
from specpress.compress.quantize.api import quantize
from specpress.export.hf import export_hf
from specpress.models import forced
from specpress.models.drafter_io import save_drafter

pytestmark = pytest.mark.speculators

STEPS, T, PAD = 3, 24, 128  # window of T ids; speculators' flex-attention block mask needs a multiple of 128
SPEC_CELLS = [None, "int4", "int4-asym", "int8", "int8-asym", "int8-dynamic", "int8-static", "fp8", "fp8-dynamic",
              "fp8-static", "fp8-tensor-static", "nvfp4", "nvfp4-static", "mxfp8", "mxfp8-dynamic", "mxfp4",
              "int2", "int2-asym", "ternary", "int4+head", "headrank",
              "int4+headrank"]  # int3: vLLM's 3-bit layouts disagree (refused)
HEAD_RANK = 16  # in_features 16 and 64 of the factors: int4's groups of 16 divide both
TOL = 2e-5  # float32 rounding over one layer, the head and three chained steps

SIDE = r"""
import sys, torch
from speculators.models import Eagle3DraftModel
from transformers import CompressedTensorsConfig
payload = torch.load(sys.argv[1], weights_only=False)
out = {}
for cell, path in payload["exports"].items():
    try:
        q = payload["quantized"][cell]
        kw = {"quantization_config": CompressedTensorsConfig(run_compressed=False)} if q else {}
        m = Eagle3DraftModel.from_pretrained(path, torch_dtype=torch.float32, **kw).eval()
        # compressed-tensors decompresses NVFP4 / MX weights to bfloat16 whatever torch_dtype says; the forward
        # then meets float32 activations, so the model is cast to float32 (the decompressed values kept)
        dense = {n: mod.weight.detach().clone() for n, mod in m.named_modules()
                 if isinstance(mod, torch.nn.Linear) and n in payload["linears"]}
        m = m.float()
    except Exception as exc:  # reported, and judged by the test
        out[cell] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        continue
    got = []
    m.lm_head.register_forward_hook(lambda mod, i, o: got.append(o.detach()))
    feats, ids, P = payload["feats"], payload["ids"], payload["pad"]
    T = ids.shape[1] - 1
    h = torch.zeros(1, P, feats.shape[-1]); h[:, :T] = feats[:, :T]
    x = torch.zeros(1, P, dtype=torch.long); x[:, :T] = ids[:, 1:]
    doc = torch.full((1, P), -1); doc[:, :T] = 0
    dtypes = sorted({str(p.dtype) for p in m.parameters()})
    try:
        with torch.no_grad():
            toks = m(h, x, doc, position_ids=torch.arange(P)[None], ttt_steps=payload["steps"])
    except Exception as exc:
        out[cell] = {"error": f"forward: {type(exc).__name__}: {exc}; parameter dtypes {dtypes}"[:400]}
        continue
    out[cell] = {"logits": [g[:, :T] for g in got], "tokens": [t[:, :T] for t in toks], "weights": dense}
torch.save(out, sys.argv[2])
"""


# Where compressed-tensors (the loader speculators reads quantized checkpoints through) computes otherwise than
# vLLM and specpress, by its own documented rule; specpress's reference then follows that rule (so the test
# still asks for float rounding and equal tokens, and shows that rule is the only difference):
#   nvfp4*        decompressed to bfloat16 (compressed-tensors 0.17 compressors/nvfp4/helpers.py
#                 unpack_fp4_from_uint8 dtype=torch.bfloat16): our weights rounded to bf16
#   mx*           decompressed to bfloat16 too (compressors/mx_utils.py): exact, an e8m0 power of two times an
#                 e2m1 / e4m3 element fits bf16
#   int8-dynamic  activations quantized with scale amax / 127.5 (quantization/utils/helpers.py calculate_qparams:
#                 amax / (bit_range / 2)); vLLM's per-token int8 kernel and specpress use amax / 127
BF16_WEIGHTS = {"nvfp4", "nvfp4-static"}
BF16_EXACT = {"mxfp8", "mxfp8-dynamic", "mxfp4"}
CT_INT8_GRID = {"int8-dynamic"}


@contextlib.contextmanager
def as_compressed_tensors_computes(cell: str):
    """specpress's forward with compressed-tensors' rule for `cell` (see above) in place of its own."""
    import specpress.models.quantized.integer as integer
    from specpress.models.quantized.activations import fake_int8, per_token_amax
    from specpress.models.quantized.nvfp4 import NVFP4Linear

    saved = integer.int8_input, NVFP4Linear.dequantize
    if cell in CT_INT8_GRID:
        integer.int8_input = lambda x, mode, s: fake_int8(x.float(), per_token_amax(x.float()) / 127.5).to(x.dtype)
    if cell in BF16_WEIGHTS:
        NVFP4Linear.dequantize = lambda self, dtype=None: saved[1](self, torch.float32).to(torch.bfloat16).to(
            dtype or self.compute_dtype)
    try:
        yield
    finally:
        integer.int8_input, NVFP4Linear.dequantize = saved


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """(specpress's reference per cell, speculators' results), every cell in one side-interpreter run."""
    from specpress.models.formats.speculators import rename_out
    from specpress.models.quantized.modules import quantized_modules

    tmp = tmp_path_factory.mktemp("speculators")
    target = wide_target()
    tdir = saved_target(target, tmp)
    ids = torch.randint(1, 61, (1, T), generator=torch.Generator().manual_seed(11))
    refs, exports, linears = {}, {}, set()
    feats = None
    for cell in SPEC_CELLS:
        key = str(cell)
        low = "headrank" in key
        if low:
            d = prune(drafter("eagle3", target), PruneConfig(head_rank=HEAD_RANK))
            if key == "int4+headrank":
                quantize(d, replace(CELLS["int4"](), include=("lm_head",)))
        else:
            d = quantized("eagle3", "int4", target, include=("lm_head",)) if cell == "int4+head" \
                else quantized("eagle3", cell, target)
        src = save_drafter(d, tmp / f"src-{key}")
        exports[key] = str(export_hf(src, tmp / f"out-{key}", engine="vllm", verifier=str(tdir),
                                     materialize_head=low).out)
        with torch.no_grad():
            feats = d.fuse_taps(target(ids, taps=d.taps).taps)
        # grad-tracking inputs: every quantized Linear takes its dequantized product
        with torch.enable_grad(), as_compressed_tensors_computes(key):
            f = forced.chain(d, ids, feats.clone().requires_grad_(True), steps=STEPS)
        weights = {rename_out("eagle3", n): m.dequantize(torch.float32) for n, m in quantized_modules(d).items()
                   if not (low and n.startswith("lm_head."))}  # the factors: one float lm_head in the export
        linears |= set(weights)
        refs[key] = {"logits": [lg.detach() for lg, _ in f.steps], "weights": weights}
    payload = {"exports": exports, "quantized": {str(c): c not in (None, "headrank") for c in SPEC_CELLS},
               "feats": feats,
               "ids": ids, "pad": PAD, "steps": STEPS, "linears": sorted(linears)}
    return refs, run_side(SIDE, payload, tmp / "side")


@pytest.mark.parametrize("cell", [str(c) for c in SPEC_CELLS])
def test_speculators_loads_our_export_and_drafts_what_specpress_drafts(cell, loaded):
    refs, got = loaded
    r, ref = got[cell], refs[cell]
    assert "error" not in r, f"speculators' Eagle3DraftModel.from_pretrained failed on the {cell} export: {r['error']}"
    for name, mine in ref["weights"].items():  # the dense weights speculators computes with
        theirs = r["weights"][name]
        want = mine.to(torch.bfloat16) if cell in BF16_WEIGHTS | BF16_EXACT else mine
        assert theirs.dtype == want.dtype and torch.equal(theirs, want), f"{cell}: {name} decompressed to other weights"
        if cell in BF16_EXACT:
            assert torch.equal(theirs.float(), mine), f"{cell}: {name} lost bits in bfloat16"
    assert len(r["logits"]) == STEPS
    for k, (mine, theirs) in enumerate(zip(ref["logits"], r["logits"], strict=True)):
        n = mine.shape[1]
        diff = (theirs[:, :n] - mine).abs().max().item()
        scale = mine.abs().max().item()
        assert diff <= TOL * max(1.0, scale), f"{cell} step {k}: logits differ by {diff:.3g} (scale {scale:.3g})"
        assert torch.equal(r["tokens"][k][:, :n], mine.argmax(-1)), f"{cell} step {k}: draft tokens differ"


def test_every_compressed_tensors_scheme_is_tried():
    """The cells cover every scheme the registry has a compressed-tensors encoding for, in each activation mode
    vLLM serves (weight-only, dynamic, static) where the scheme has it."""
    from specpress.models.formats.encodings import CT, encodings

    tried = {(CELLS[c]().scheme, CELLS[c]().act_mode) for c in SPEC_CELLS if c in CELLS}
    assert {s for s, _ in tried} >= {"int4", "int8", "fp8", "nvfp4", "mxfp8", "mxfp4", "int2", "ternary"}
    assert {"integer", "fp8", "nvfp4", "mx", "lowbit"} == set(encodings(CT))
    assert {("int8", "dynamic"), ("int8", "static"), ("fp8", "dynamic"), ("fp8", "static"), ("nvfp4", "static"),
            ("mxfp8", "dynamic")} <= tried
