"""`export hf --for vllm|sglang|trtllm` with a low-rank or a shared draft head: each engine's own rule decides.

Every engine builds one dense head (EAGLE-3: [draft_vocab_size, hidden]; a draft LM: [vocab, hidden]), so a
low-rank head is refused naming that engine's rule (its version and file) or written dense with
--materialize-head. Without lm_head in the checkpoint, vLLM and TensorRT-LLM install the target's whole head,
while SGLang does so only when config.json has draft_vocab_size null: a shared head over the whole vocabulary
is written without lm_head (and, for SGLang, with that null); over a reduced vocabulary it is refused or
materialized from the target's rows. Each export is read back by specpress and computes what the drafter did.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from drafters_common import CONFIGS, V, make, randomize, run

from specpress.compress.prune import PruneConfig, prune
from specpress.errors import RequestError
from specpress.export.hf import export_hf
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.io import tensor_index

ENGINES = {"vllm": ("vLLM 0.34", "llama_eagle3.py"), "sglang": ("SGLang 0.5.23", "llama_eagle3.py"),
           "trtllm": ("TensorRT-LLM", "modeling_speculative.py")}


def _lm(target):
    return randomize(build_drafter(CONFIGS["lm"]), 1).attach_target(target)


def _full_vocab_eagle3(target):
    return randomize(build_drafter(dataclasses.replace(CONFIGS["eagle3"], draft_vocab_size=V)), 4).attach_target(target)


def _same(out, d, target) -> None:
    back = load_drafter(out, target)
    assert torch.allclose(run(back, target), run(d, target), atol=1e-5)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_low_rank_head_is_refused_by_the_engines_rule_or_written_dense(engine, target, target_dir, tmp_path):
    label, where = ENGINES[engine]
    for family, d in (("eagle3", make("eagle3", target)), ("lm", _lm(target))):
        low = prune(d, PruneConfig(head_rank=4))
        src = save_drafter(low, tmp_path / f"{family}-src")
        out = tmp_path / f"{family}-x"
        rule = where if family == "eagle3" else "plain HF decoder"
        with pytest.raises(RequestError, match=f"head_rank 4.*{label}.*{rule}.*--materialize-head"):
            export_hf(src, out, engine=engine, verifier=str(target_dir))
        assert not out.exists()
        s = export_hf(src, tmp_path / f"{family}-m", engine=engine, verifier=str(target_dir), materialize_head=True)
        index = tensor_index(s.out)
        rows = d.config.draft_vocab_size if family == "eagle3" else V
        assert tuple(index["lm_head.weight"].shape) == (rows, d.config.hidden_size)
        assert not any(k.startswith(("lm_head.down", "lm_head.up")) for k in index)
        cfg = json.loads((s.out / "config.json").read_text())
        assert "head_rank" not in cfg and cfg["specpress"]["materialized_head"] == "low_rank"
        _same(s.out, low, target)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_shared_head_over_the_whole_vocabulary_is_written_as_the_engine_shares_it(engine, target, target_dir,
                                                                                      tmp_path):
    d = prune(_full_vocab_eagle3(target), PruneConfig(share_head=True))
    src = save_drafter(d, tmp_path / "src")
    with pytest.raises(RequestError, match="drop the flag"):
        export_hf(src, tmp_path / "y", engine=engine, verifier=str(target_dir), materialize_head=True)
    s = export_hf(src, tmp_path / "x", engine=engine, verifier=str(target_dir))
    assert not any(k.startswith("lm_head") for k in tensor_index(s.out))
    cfg = json.loads((s.out / "config.json").read_text())
    if engine == "sglang":  # SGLang loads the target's head only for a null draft_vocab_size
        assert "draft_vocab_size" in cfg and cfg["draft_vocab_size"] is None
        assert any("load_lm_head_from_target" in n for n in s.notes)
    else:  # vLLM / TensorRT-LLM: no lm_head in the checkpoint is enough; the draft vocabulary is the target's
        assert cfg.get("draft_vocab_size", V) in (None, V)
    _same(s.out, d, target)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_shared_head_over_a_reduced_vocabulary_is_refused_or_written_from_the_targets_rows(engine, target,
                                                                                            target_dir, tmp_path):
    label, _ = ENGINES[engine]
    d = prune(make("eagle3", target), PruneConfig(share_head=True))
    src = save_drafter(d, tmp_path / "src")
    with pytest.raises(RequestError, match=f"24-token draft vocabulary.*{label}.*WHOLE.*--materialize-head"):
        export_hf(src, tmp_path / "x", engine=engine, verifier=str(target_dir))
    s = export_hf(src, tmp_path / "m", engine=engine, verifier=str(target_dir), materialize_head=True)
    head = tensor_index(s.out)["lm_head.weight"]
    assert tuple(head.shape) == (24, d.config.hidden_size)
    cfg = json.loads((s.out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 24 and not cfg.get("shared_head")
    _same(s.out, d, target)


def test_quantized_factors_materialize_into_a_float_head_trtllm_accepts(target, target_dir, tmp_path):
    """TensorRT-LLM refuses a quantized lm_head; factors multiplied back are a float lm_head, so the rest of the
    drafter keeps its quantized Linears and the head is excluded from quantization."""
    from specpress.compress.quantize.api import quantize
    from specpress.models.quantized.scheme import config_for

    d = prune(make("eagle3", target), PruneConfig(head_rank=4))
    quantize(d, config_for("fp8", activations="none", include=("lm_head",)))
    src = save_drafter(d, tmp_path / "src")
    s = export_hf(src, tmp_path / "m", engine="trtllm", verifier=str(target_dir), materialize_head=True)
    quant = json.loads((s.out / "hf_quant_config.json").read_text())["quantization"]
    assert "lm_head" in quant["exclude_modules"]
    assert "lm_head.weight_scale" not in tensor_index(s.out)
    back = load_drafter(s.out, target)
    assert torch.allclose(run(back, target), run(load_drafter(src, target), target), atol=1e-4)
