"""compress.prune_pipeline: the library path `specpress prune` runs writes what the command writes and reports what
it prints; its refusals are the command's."""

from __future__ import annotations

import pytest
from cli_common import run_main
from drafters_common import SHAPE, L, make, save_with_tokenizer, tiny_target

from specpress.compress.prune import PruneConfig
from specpress.compress.prune_pipeline import prune_from_dirs, report_lines
from specpress.errors import RequestError, UsageError
from specpress.models.drafter_io import save_drafter
from specpress.models.target import TargetConfig, TargetModel


@pytest.fixture()
def dirs(tmp_path):
    t = TargetModel(TargetConfig(**SHAPE, num_hidden_layers=L, eos_token_id=0))  # tiny_target() + an EOS id
    t.load_state_dict(tiny_target().state_dict())
    tdir, data = save_with_tokenizer(t, tmp_path)
    return save_drafter(make("eagle3", t), tmp_path / "e3"), tdir, data


def test_the_pipeline_writes_the_cli_artifact_and_reports_its_lines(dirs, tmp_path):
    src, tdir, data = dirs
    cli = run_main("prune", "--drafter", src, "--out", tmp_path / "cli", "--ffn", "20", "--kv-heads", "1",
                   "--vocab", "12", "--vocab-tokens", "512", "--importance", "kl", "--target", tdir, "--data", data,
                   "--batch", "2", "--seq-len", "16", "--recover-steps", "2")
    assert cli.exit_code == 0, cli.stderr
    config = PruneConfig(ffn=20, kv_heads=1, vocab=12, vocab_tokens=512, importance="kl", batch=2, seq_len=16,
                         recover_steps=2)
    rep = prune_from_dirs(src, tmp_path / "lib", config, target_dir=tdir, data_path=data)
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "lib" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    assert rep.out == tmp_path / "lib" and rep.family == "eagle3" and rep.drafter.config.intermediate_size == 20
    assert rep.step["step"] == "prune" and rep.recovery is not None and rep.recovery["steps"] == 2
    lines = report_lines(rep)
    assert cli.stdout.replace(str(tmp_path / "cli"), str(tmp_path / "lib")) == "".join(f"{ln}\n" for ln in lines)
    assert any(ln.startswith("  recovered: 2 distillation steps") for ln in lines)


def test_the_pipeline_refuses_what_the_command_refuses_before_writing(dirs, tmp_path):
    src, tdir, data = dirs
    with pytest.raises(UsageError, match="--data needs --target DIR"):
        prune_from_dirs(src, tmp_path / "a", PruneConfig(ffn=20), data_path=data)
    with pytest.raises(RequestError, match="--continuation-tokens sets how much the target generates"):
        prune_from_dirs(src, tmp_path / "b", PruneConfig(ffn=20), target_dir=tdir, data_path=data,
                        continuation_tokens=8)
    with pytest.raises(UsageError, match="--importance kl needs calibration by the target"):
        prune_from_dirs(src, tmp_path / "c", PruneConfig(ffn=20, importance="kl"))
    with pytest.raises(RequestError, match="--ffn 40 must be less than the drafter's 40 FFN channels"):
        prune_from_dirs(src, tmp_path / "d", PruneConfig(ffn=40))
    assert not any((tmp_path / n).exists() for n in "abcd")
    cli = run_main("prune", "--drafter", src, "--out", tmp_path / "e", "--ffn", "20", "--importance", "kl")
    assert cli.exit_code == 2 and "--importance kl needs calibration by the target" in cli.stderr
