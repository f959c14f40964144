"""Plain decoding and `bench` without a drafter equal transformers' greedy generate."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from specpress.cli import cli
from specpress.errors import DataError, RequestError
from specpress.models.target import load_target
from specpress.runtime.backends.torch.runner import TorchTarget
from specpress.runtime.plain import decode_plain
from specpress.runtime.sampling import SamplingParams
from specpress.runtime.prompts import load_prompts


def hf_greedy(hf, ids, n, eos=None):
    out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                      pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_equals_transformers_generate(hf_dir_factory, arch):
    hf, path = hf_dir_factory(arch, eos_token_id=None)
    ours = load_target(path)
    for seed in range(3):
        ids = torch.randint(0, 97, (8 + seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        got = decode_plain(TorchTarget(ours), ids, 20, eos_ids=()).tokens
        assert got == hf_greedy(hf, ids, 20)


def test_greedy_stops_at_eos_like_transformers(hf_dir_factory):
    hf, path = hf_dir_factory("llama", eos_token_id=None)
    ours = load_target(path)
    ids = [5, 6, 7, 8]
    free = decode_plain(TorchTarget(ours), ids, 20, eos_ids=()).tokens
    eos = free[5]  # a token the model emits: decoding must stop right after its first occurrence
    got = decode_plain(TorchTarget(ours), ids, 20, eos_ids=[eos]).tokens
    assert got == hf_greedy(hf, ids, 20, eos=eos)
    assert got[-1] == eos and eos not in got[:-1]


def test_sampling_is_seeded_and_varies(hf_dir_factory):
    _, path = hf_dir_factory("llama", eos_token_id=None)
    ours = load_target(path)
    a = decode_plain(TorchTarget(ours), [1, 2, 3], 15, SamplingParams(1.0), torch.Generator().manual_seed(7),
                     eos_ids=())
    b = decode_plain(TorchTarget(ours), [1, 2, 3], 15, SamplingParams(1.0), torch.Generator().manual_seed(7),
                     eos_ids=())
    c = decode_plain(TorchTarget(ours), [1, 2, 3], 15, SamplingParams(1.0), torch.Generator().manual_seed(8),
                     eos_ids=())
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens


def write_prompts(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_bench_cli_writes_contract_json(hf_dir_factory, tmp_path):
    hf, path = hf_dir_factory("llama", eos_token_id=None)
    prompts = [[3, 4, 5, 6], [10, 20, 30]]
    pfile = write_prompts(tmp_path / "p.jsonl", [{"input_ids": p} for p in prompts])
    out = tmp_path / "res.json"
    res = CliRunner().invoke(cli, ["bench", "--target", str(path), "--prompts", str(pfile),
                                   "--max-new-tokens", "12", "--temperature", "0", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    for key in ("tau", "ar", "histogram", "draft_ms", "verify_ms", "other_ms", "tokens_per_s",
                "baseline_tokens_per_s", "speedup", "lossless_mismatches", "drafter_bytes", "outputs", "config"):
        assert key in data
    assert data["outputs"] == [hf_greedy(hf, p, 12) for p in prompts]
    assert data["tau"] == 1.0 and data["tokens_per_s"] > 0
    assert data["config"]["max_new_tokens"] == 12


def test_prompt_file_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2]}\n{"oops": 1}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2"):
        load_prompts(bad, None, 97)
    bad.write_text('{"input_ids": [1, 2]}\n\n{not json\n')
    with pytest.raises(DataError, match=r"bad.jsonl:3: not valid JSON"):
        load_prompts(bad, None, 97)
    bad.write_text('{"input_ids": [1, 200]}\n')
    with pytest.raises(DataError, match="outside the target's vocabulary"):
        load_prompts(bad, None, 97)
    with pytest.raises(DataError, match="does not exist"):
        load_prompts(tmp_path / "none.jsonl", None, 97)


def test_prompt_longer_than_context(hf_dir_factory):
    _, path = hf_dir_factory("llama", max_position_embeddings=32)
    ours = load_target(path)
    with pytest.raises(RequestError, match="context is 32"):
        decode_plain(TorchTarget(ours), list(range(30)), 10)


def test_bench_cli_user_error_is_one_line(hf_dir_factory, tmp_path):
    import subprocess
    import sys

    _, path = hf_dir_factory("llama")
    pfile = write_prompts(tmp_path / "p.jsonl", [{"input_ids": [1, 2]}, {"prompt": 3}])
    proc = subprocess.run([sys.executable, "-m", "specpress.cli", "bench", "--target", str(path), "--prompts",
                           str(pfile), "--max-new-tokens", "4"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("error:") and "p.jsonl:2" in proc.stderr
