"""specpress EAGLE-3 drafters inside SafeAILab/EAGLE's own inference code (bench/eagle_reference.py).

Needs an EAGLE checkout and a Python that can import it next to specpress (torch, transformers 5,
safetensors, huggingface_hub, accelerate + specpress's requirements); CI cannot fetch EAGLE, so this is
skipped unless both are given:

    SPECPRESS_EAGLE_DIR=/path/to/EAGLE SPECPRESS_EAGLE_PYTHON=/tmp/eagle-venv/bin/python \\
        pytest -m slow tests/interop

On a tiny random Llama target (8 layers, so EAGLE's hard-coded taps 2, L//2, L-3 are distinct) with
drafters distilled here for a short while on the target's own greedy continuations: EAGLE's loader
must leave no tensor unfilled, `eagenerate` must equal plain greedy decoding, the two drafters must
compute the same logits on a teacher-forced window, and τ in EAGLE's loop must be within 10% of
specpress's with the same EAGLE-2 tree (total_token 16, depth 4, top_k 4).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from drafters_common import V, tiny_target

EAGLE_DIR = os.environ.get("SPECPRESS_EAGLE_DIR")
EAGLE_PY = os.environ.get("SPECPRESS_EAGLE_PYTHON")
REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (EAGLE_DIR and EAGLE_PY), reason="set SPECPRESS_EAGLE_DIR (a SafeAILab/EAGLE checkout) "
                       "and SPECPRESS_EAGLE_PYTHON (a venv python that imports it) to run EAGLE's own code"),
]
TREE = ["--total-token", "16", "--depth", "4", "--top-k", "4"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> Path:
    """A confident tiny target, 8 held-out prompts, and eagle3 drafters (full / 32-token draft vocab,
    and an int8 copy of the reduced one written with --dequantize)."""
    from specpress.compress.config import DistillConfig
    from specpress.compress.data import WindowSampler
    from specpress.compress.distill import distill
    from specpress.compress.quantize.configs import config_for
    from specpress.compress.quantize.pipeline import quantize_from_dirs
    from specpress.models.drafter_io import save_drafter
    from specpress.models.target import save_target

    root = tmp_path_factory.mktemp("eagle-ref")
    t = tiny_target()
    with torch.no_grad():
        t.lm_head.weight.mul_(4)
        ids = torch.randint(1, V, (72, 6), generator=torch.Generator().manual_seed(1))
        for _ in range(40):  # the target's own greedy continuations: what it will be asked to decode
            ids = torch.cat([ids, t(ids, logits="last").logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    save_target(t, root / "target")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in ids[64:, :6].tolist()))
    stream = ids[:64].reshape(-1).numpy().astype(np.int32)
    for name, dv in (("full", None), ("v32", 32)):
        c = DistillConfig(family="eagle3", steps=150, batch=8, seq_len=32, lr=3e-3, eval_batches=1, draft_vocab=dv)
        save_drafter(distill(t, c, WindowSampler(stream, c.seq_len, c.batch, c.seed), None).drafter, root / name)
    quantize_from_dirs(root / "v32", config_for("int8", None), root / "v32-int8", dequantize_out=True)
    return root


def reference(mode: str, root: Path, drafter: str, *extra: str) -> dict:
    out = root / f"{mode}-{drafter}.json"
    cmd = [EAGLE_PY, str(REPO / "bench" / "eagle_reference.py"), mode, "--eagle", EAGLE_DIR, "--target",
           str(root / "target"), "--drafter", str(root / drafter), "--json", str(out), *TREE, *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("drafter", ["full", "v32", "v32-int8"])
def test_eagle_runs_our_drafter_like_we_do(zoo, drafter):
    win = reference("window", zoo, drafter)
    load = win["load"]
    assert load["embedding_is_targets"], load  # EAGLE's load_emb gave it the target's embedding
    assert set(load["missing"]) <= {"embed_tokens.weight"}, load  # ... which is why that one is listed
    # Full vocab: EAGLE deletes its d2t/t2d buffers and reports ours unexpected; reduced: both load.
    assert set(load["unexpected"]) == ({"d2t", "t2d"} if drafter == "full" else set()), load
    for row in win["stages"]:
        assert row.get("max_abs", 0.0) < 1e-4 and row.get("first_diff_pos") is None, row
        assert row.get("fraction", 1.0) == 1.0, row
    assert "stages_with_target_embedding" not in win

    dec = reference("decode", zoo, drafter, "--prompts", str(zoo / "prompts.jsonl"), "--max-new-tokens", "40")
    assert dec["eagle_lossless"], dec
    assert dec["tau_specpress"] > 1.5, dec  # the drafter is really drafting: the τ check has teeth
    assert abs(dec["tau_eagle"] - dec["tau_specpress"]) <= 0.1 * dec["tau_specpress"], dec
    print(f"{drafter}: tau eagle {dec['tau_eagle']:.3f} specpress {dec['tau_specpress']:.3f}", file=sys.stderr)
