"""`specpress plan` against measured peaks: on a small random target (bf16 on disk) and an EAGLE-3 drafter,
each command's peak resident memory, measured in a fresh process (VmHWM), is within 20 % of what plan
predicted for the same command line."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch
from scale_common import run_peak, write_target

RUN = """
import sys
from specpress.cli import main
try:
    main({argv!r})
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
result = {{}}
"""


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    from specpress.models.drafter import build_drafter
    from specpress.models.drafter_io import save_drafter
    from specpress.models.eagle3 import Eagle3Config
    from specpress.models.target import load_target
    from specpress.zoo.tokenizer import tokenizer_files, train_tokenizer

    root = tmp_path_factory.mktemp("plan")
    write_target(root / "target", hidden=512, layers=8, ffn=2048, vocab=32000)
    text = "\n".join(f.read_text() for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40])
    (root / "data.txt").write_text(text)
    for name, content in tokenizer_files(train_tokenizer([text], 2048), model_max_length=512).items():
        (root / "target" / name).write_text(content)
    target = load_target(root / "target")
    cfg = Eagle3Config(vocab_size=32000, hidden_size=512, intermediate_size=2048, num_attention_heads=8,
                       num_key_value_heads=2, max_position_embeddings=512, draft_vocab_size=8000)
    torch.manual_seed(0)
    d = build_drafter(cfg).attach_target(target)
    d.set_draft_vocab(torch.arange(8000))
    save_drafter(d, root / "eagle3")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": text[i * 500:i * 500 + 200]}) + "\n"
                                                for i in range(2)))
    return root


def commands(r: Path) -> dict[str, list[str]]:
    t, e, data = str(r / "target"), str(r / "eagle3"), str(r / "data.txt")
    return {
        "distill": ["distill", "--target", t, "--family", "eagle3", "--data", data, "--out", str(r / "o-distill"),
                    "--steps", "2", "--draft-vocab", "8000"],
        "quantize": ["quantize", "--drafter", e, "--out", str(r / "o-q"), "--scheme", "int4", "--target", t,
                     "--data", data, "--eval-batches", "1"],
        "export onnx": ["export", "onnx", "--drafter", e, "--target", t, "--out", str(r / "o-onnx")],
        "bench": ["bench", "--target", t, "--drafter", e, "--prompts", str(r / "prompts.jsonl"),
                  "--max-new-tokens", "8", "--json", str(r / "o-bench.json")],
    }


@pytest.mark.slow  # each command twice in a fresh process (~3 min); .ci/run runs it
@pytest.mark.parametrize("name", ["distill", "quantize", "export onnx", "bench"])
def test_plan_predicts_the_measured_peak(case, name, tmp_path):
    argv = commands(case)[name]
    planned = tmp_path / "plan.json"
    run_peak(RUN.format(argv=["plan", "--json", str(planned), *argv]))
    plan = json.loads(planned.read_text())
    measured = run_peak(RUN.format(argv=argv))["peak_rss"]
    ratio = measured / plan["peak_bytes"]
    assert 0.8 <= ratio <= 1.2, (f"{name}: measured {measured / 2 ** 20:.0f} MiB, planned "
                                 f"{plan['peak_bytes'] / 2 ** 20:.0f} MiB ({plan['phases']})")



def tiny_case(root: Path) -> None:
    """A tiny random bf16 target (root/target) and an EAGLE-3 drafter for it (root/eagle3), for plans only."""
    from specpress.models.drafter import build_drafter
    from specpress.models.drafter_io import save_drafter
    from specpress.models.eagle3 import Eagle3Config
    from specpress.models.target import load_target

    write_target(root / "target", hidden=64, layers=8, ffn=128, vocab=1000, heads=4)
    cfg = Eagle3Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=512, draft_vocab_size=500)
    d = build_drafter(cfg).attach_target(load_target(root / "target"))
    d.set_draft_vocab(torch.arange(500))
    save_drafter(d, root / "eagle3")


def test_plan_export_hf_counts_the_verifier_tensor_under_each_spelling(tmp_path):
    """export hf's speculators layout stores the verifier's embeddings / head: plan counts them whether the
    target is given as --target, as the deprecated --verifier, or implied by --for vllm."""
    from specpress.plan import plan_command

    tiny_case(tmp_path)
    t, e = str(tmp_path / "target"), str(tmp_path / "eagle3")
    base = {"drafter": e, "out": str(tmp_path / "o-hf"), "engine": None, "fmt": "speculators", "target": None,
            "verifier": None, "policy": None, "force": False}
    plain = plan_command("export hf", base)
    assert "verifier tensor" not in plain.holds  # no target given: nothing of it is stored
    for extra in ({"target": t}, {"verifier": t}, {"fmt": None, "engine": "vllm", "target": t}):
        p = plan_command("export hf", {**base, **extra})
        assert p.holds["verifier tensor"] == 1000 * 64 * 4, extra  # the drafter's fp32, the target's shape
        assert p.peak_bytes > plain.peak_bytes


def test_plan_quantize_has_the_gptq_phase_for_low_bit_gptq(tmp_path):
    """--scheme int3 --method gptq runs GPTQ (LowBitGPTQConfig): plan counts its Hessian and calibration rounds
    as it does integer GPTQ's; round to nearest has neither."""
    from specpress.plan import plan_command

    tiny_case(tmp_path)
    base = {"drafter_dir": str(tmp_path / "eagle3"), "target_dir": str(tmp_path / "target"), "group_size": 64}
    plans = {(s, m): plan_command("quantize", {**base, "scheme": s, "method": m})
             for s, m in (("int3", "gptq"), ("int4", "gptq"), ("int3", "rtn"))}
    low, whole, rtn = plans["int3", "gptq"], plans["int4", "gptq"], plans["int3", "rtn"]
    assert "gptq hessian (widest group)" in low.phases["quantize"] and "gptq hessian" in low.holds
    assert low.holds["gptq hessian"] == whole.holds["gptq hessian"]
    for key in ("calibration_batches", "calibration_passes", "target_forwards", "target_tokens"):
        assert low.work[key] == whole.work[key], key
    assert "gptq hessian" not in rtn.holds and "calibration_batches" not in rtn.work
