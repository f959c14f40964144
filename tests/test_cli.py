"""The CLI contract: lazy loading, every command listed, clean errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from specpress.cli import cli
from specpress.commands import COMMANDS


@pytest.mark.parametrize("args", [["--help"], ["export", "hf", "--help"]])
def test_help_imports_no_torch(args):
    """`specpress --help`, and `export hf --help`, which lists the serving engines (export/hf/engines.py)."""
    code = ("import sys\nfrom specpress.cli import main\n"
            f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
            f"assert 'torch' not in sys.modules, 'specpress {' '.join(args)} imported torch'\nprint('OK')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("OK")


def test_help_lists_every_command():
    res = CliRunner().invoke(cli, ["--help"])
    assert res.exit_code == 0
    for name in COMMANDS:
        assert name in res.output


def test_every_command_loads_and_has_help():
    runner = CliRunner()
    for name in COMMANDS:
        res = runner.invoke(cli, [name, "--help"])
        assert res.exit_code == 0, (name, res.output)
        assert "Usage:" in res.output


def test_missing_target_is_a_clean_error(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"input_ids": [1]}\n')
    proc = subprocess.run([sys.executable, "-m", "specpress.cli", "bench", "--target", str(tmp_path / "nope"),
                           "--prompts", str(p), "--max-new-tokens", "3"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error:") and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_inspect_bare_public_eagle3_config(tmp_path):
    import json

    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
           "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1, "vocab_size": 128256,
           "draft_vocab_size": 32000, "rms_norm_eps": 1e-5, "torch_dtype": "float16",
           "max_position_embeddings": 8192, "rope_theta": 500000.0}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    res = CliRunner().invoke(cli, ["inspect", str(f), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["family"] == "eagle3"
    assert abs(info["params"] - 424.7e6) / 424.7e6 < 0.005  # algorithms.md: 424.7M for Llama-3.1-8B
