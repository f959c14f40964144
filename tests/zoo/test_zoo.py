"""The zoo target: corpus split, tokenizer, training loop, and a miniature end-to-end build (seconds)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from specpress.errors import CheckpointError, DataError, RequestError
from specpress.zoo import build as zb
from specpress.zoo.corpus import EXCLUDED_DIRS, corpus_files, load_split_text, split_of, stdlib_root
from specpress.zoo.tokenizer import EOS_ID, EOS_TOKEN, encode_documents, tokenizer_files, train_tokenizer
from specpress.zoo.train import (STATE_FILE, TokenBatches, TrainConfig, init_weights, lr_at, make_optimizer,
                                 train)

TINY = zb.preset_with("small", hidden_size=32, intermediate_size=64, num_heads=2, vocab_size=300,
                      seq_len=32, batch_size=4, steps=6, warmup_steps=2, max_position_embeddings=64,
                      compile=False)


@pytest.fixture(scope="module")
def mini_stdlib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few small real stdlib files, copied with their relative paths (so their split is kept)."""
    root = tmp_path_factory.mktemp("stdlib")
    small = [f for f in corpus_files() if 1500 < f.size < 6000]
    picked = [f for f in small if f.split == "train"][:5] + [f for f in small if f.split == "val"][:1]
    for f in picked:
        (root / f.relpath).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f.path, root / f.relpath)
    (root / "test").mkdir()
    (root / "test" / "test_skipped.py").write_text("x = 1\n" * 100)
    return root


def _build(out: Path, root: Path, seed: int = 0, **kw) -> zb.ZooReport:
    return zb.build_zoo(out, preset=TINY, seed=seed, stdlib=root, progress=False, **kw)


@pytest.fixture(scope="module")
def mini_zoo(tmp_path_factory: pytest.TempPathFactory, mini_stdlib: Path) -> tuple[Path, zb.ZooReport]:
    out = tmp_path_factory.mktemp("zoo") / "mini"
    return out, _build(out, mini_stdlib)


# ----------------------------------------------------------------------------------------------
# corpus
# ----------------------------------------------------------------------------------------------


def test_real_stdlib_corpus_leaves_out_tests_and_splits_about_5_percent() -> None:
    files = corpus_files()
    rels = [f.relpath for f in files]
    assert rels == sorted(rels) and len(set(rels)) == len(rels)
    assert not any(set(r.split("/")[:-1]) & EXCLUDED_DIRS for r in rels)
    assert "os.py" in rels and not any(r.startswith("test/") for r in rels)
    val = [f for f in files if f.split == "val"]
    assert 0.02 < len(val) / len(files) < 0.09
    assert {f.relpath for f in corpus_files("val")} == {f.relpath for f in val}
    assert {f.relpath for f in corpus_files("train")}.isdisjoint(f.relpath for f in val)
    assert (stdlib_root() / "os.py").is_file()


def test_split_is_a_stable_function_of_the_path() -> None:
    import hashlib

    for rel in ("os.py", "json/decoder.py", "asyncio/timeouts.py"):
        h = int.from_bytes(hashlib.sha1(rel.encode()).digest()[:4], "big") % 1000
        assert split_of(rel) == ("val" if h < 50 else "train")
    assert split_of("asyncio/timeouts.py") == "val" and split_of("os.py") == "train"


def test_corpus_selection_and_errors(mini_stdlib: Path, tmp_path: Path) -> None:
    files = corpus_files(root=mini_stdlib)
    assert len(files) == 6 and not any("test" in f.relpath for f in files)
    assert len(corpus_files(root=mini_stdlib, max_files=2)) == 3  # 2 train + the 1 val file
    docs = load_split_text("val", root=mini_stdlib)
    val_file = mini_stdlib / corpus_files("val", root=mini_stdlib)[0].relpath
    assert len(docs) == 1 and docs[0] == val_file.read_text()
    with pytest.raises(DataError, match="holds no .py files"):
        corpus_files(root=tmp_path)
    with pytest.raises(RequestError, match="unknown corpus split"):
        corpus_files("dev")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# tokenizer
# ----------------------------------------------------------------------------------------------


def test_tokenizer_round_trips_and_eos_is_id_0(mini_stdlib: Path) -> None:
    texts = load_split_text("train", root=mini_stdlib)
    tok = train_tokenizer(texts, vocab_size=300)
    assert tok.get_vocab_size() == 300 and tok.token_to_id(EOS_TOKEN) == EOS_ID == 0
    for s in texts + ["def f(x):\n\t return  x  # é ✓ 😀\r\n", "", "   \n\n  "]:
        assert tok.decode(tok.encode(s).ids, skip_special_tokens=False) == s
    stream = encode_documents(tok, texts[:2])
    assert stream.dtype == np.uint16 and int((stream == EOS_ID).sum()) == 2 and stream[-1] == EOS_ID
    assert train_tokenizer(texts, vocab_size=300).to_str() == tok.to_str()  # deterministic
    assert set(tokenizer_files(tok, model_max_length=64)) == {
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    with pytest.raises(RequestError, match="vocab_size must be at least"):
        train_tokenizer(texts, vocab_size=100)


# ----------------------------------------------------------------------------------------------
# training pieces
# ----------------------------------------------------------------------------------------------


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    cfg = TrainConfig(steps=100, batch_size=1, seq_len=8, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lr_at(100, cfg) == pytest.approx(1e-4)


def test_batches_are_deterministic_windows_covering_each_epoch_once() -> None:
    toks = np.arange(1000, dtype=np.uint16)
    b = TokenBatches(toks, seq_len=10, batch_size=7, seed=3)
    again = TokenBatches(toks, seq_len=10, batch_size=7, seed=3)
    assert torch.equal(b.batch(5), again.batch(5)) and not torch.equal(b.batch(5), b.batch(6))
    x = torch.cat([b.batch(s) for s in range(b.n // 7)])  # whole steps of epoch 0
    assert x.shape[1] == 11 and bool((x[:, 1:] - x[:, :-1] == 1).all())  # contiguous windows
    starts = x[:, 0].tolist()
    assert len(set(starts)) == len(starts) and len({s % 10 for s in starts}) == 1  # one offset, no repeats
    with pytest.raises(DataError, match="need at least"):
        TokenBatches(toks[:15], seq_len=10, batch_size=1, seed=0)


def _tiny_model(seed: int = 0) -> torch.nn.Module:
    from specpress.models.target import TargetModel

    torch.manual_seed(seed)
    model = TargetModel(TINY.target_config())
    init_weights(model, TINY.num_layers)
    return model


class _Crash(Exception):
    pass


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resumed_training_matches_an_uninterrupted_run(tmp_path: Path, optimizer: str) -> None:
    toks = np.random.default_rng(0).integers(0, 300, 5000).astype(np.uint16)
    cfg = TrainConfig(steps=6, batch_size=2, seq_len=16, warmup_steps=2, checkpoint_every_s=0.0,
                      optimizer=optimizer)
    batches = TokenBatches(toks, 16, 2, seed=0)
    ref = _tiny_model()
    full = train(ref, batches, cfg)
    assert full.steps == 6 and full.tokens_seen == 6 * 2 * 16 and full.stopped_by == "steps"

    def crash_at_3(step: int, loss: float, tps: float) -> None:
        if step == 3:
            raise _Crash

    with pytest.raises(_Crash):
        train(_tiny_model(), batches, cfg, state_dir=tmp_path, on_step=crash_at_3)
    assert (tmp_path / STATE_FILE).is_file()
    resumed_model = _tiny_model(seed=1)  # different init: everything must come from the checkpoint
    resumed = train(resumed_model, batches, cfg, state_dir=tmp_path)
    assert resumed.resumed_from == 3 and resumed.steps == 6
    for (k, a), b in zip(ref.state_dict().items(), resumed_model.state_dict().values()):
        assert torch.equal(a, b), k
    with pytest.raises(CheckpointError, match="different build"):
        train(_tiny_model(), batches, TrainConfig(steps=7, batch_size=2, seq_len=16), state_dir=tmp_path)


def test_muon_takes_the_block_matrices_and_adamw_the_rest() -> None:
    model = _tiny_model()
    opt = make_optimizer(model, TrainConfig(steps=2, batch_size=1, seq_len=8, optimizer="muon"))
    muon, adamw = opt.parts
    names = {id(p): n for n, p in model.named_parameters()}
    on_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    on_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert on_muon.isdisjoint(on_adamw) and on_muon | on_adamw == set(names.values())
    assert on_muon == {n for n, p in model.named_parameters() if p.dim() == 2 and ".layers." in n}
    assert "model.embed_tokens.weight" in on_adamw and len(on_muon) == 7 * TINY.num_layers
    assert len(opt.param_groups) == len(muon.param_groups) + len(adamw.param_groups)
    # one step moves every parameter that has a gradient, through whichever optimizer holds it
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.randint(0, TINY.vocab_size, (2, 9))
    torch.nn.functional.cross_entropy(model(x[:, :-1]).logits.flatten(0, 1), x[:, 1:].flatten()).backward()
    opt.step()
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())
    with pytest.raises(RequestError, match="unknown optimizer 'sgd'; choose one of: adamw, muon"):
        TrainConfig(steps=1, batch_size=1, seq_len=8, optimizer="sgd")


# ----------------------------------------------------------------------------------------------
# presets and paths
# ----------------------------------------------------------------------------------------------


def test_presets_have_the_documented_sizes() -> None:
    from specpress.models.target import TargetModel

    sizes = {}
    for name, preset in zb.PRESETS.items():
        with torch.device("meta"):
            sizes[name] = sum(p.numel() for p in TargetModel(preset.target_config()).parameters())
        assert preset.num_layers >= 8
    assert 7.0e6 < sizes["small"] < 8.5e6 and 25e6 < sizes["medium"] < 32e6 and 1.9e6 < sizes["tiny"] < 2.1e6
    with pytest.raises(RequestError, match="EAGLE-3"):
        zb.preset_with("small", num_layers=4)
    with pytest.raises(RequestError, match="available: small, tiny, medium"):
        zb.preset_with("huge")


def test_default_dir_respects_specpress_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path))
    assert zb.default_zoo_dir("medium") == tmp_path / "zoo" / "medium"
    monkeypatch.delenv("SPECPRESS_CACHE")
    assert zb.default_zoo_dir() == Path.home() / ".cache" / "specpress" / "zoo" / "small"


# ----------------------------------------------------------------------------------------------
# end to end
# ----------------------------------------------------------------------------------------------


def test_mini_build_writes_a_complete_zoo_dir(mini_zoo: tuple[Path, zb.ZooReport]) -> None:
    out, r = mini_zoo
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "generation_config.json", "README.md", "zoo.json"):
        assert (out / name).is_file(), name
    assert zb.is_zoo_dir(out) and not out.with_name(out.name + ".partial").exists()
    assert r.out == out and r.steps == r.steps_planned == 6 and r.stopped_by == "steps"
    assert r.tokens_seen == 6 * TINY.batch_size * TINY.seq_len
    assert (r.train_files, r.val_files) == (5, 1) and r.train_tokens > 0 and r.val_tokens > 0
    assert math.isclose(r.val_perplexity, math.exp(r.val_loss), rel_tol=1e-3)
    assert r.val_perplexity < TINY.vocab_size * 2  # trained a little; a broken loss would be far off
    meta = json.loads((out / "zoo.json").read_text())
    assert meta["format"] == "specpress-zoo" and meta["val_loss"] == r.val_loss and meta["seed"] == 0
    assert meta["params"] == r.params and meta["preset"]["hidden_size"] == 32
    card = (out / "README.md").read_text()
    for number in (f"{r.params:,}", f"{r.tokens_seen:,}", f"{r.val_perplexity:.2f}", f"{r.train_tokens:,}"):
        assert number in card


def test_transformers_loads_the_zoo_as_is(mini_zoo: tuple[Path, zb.ZooReport]) -> None:
    transformers = pytest.importorskip("transformers")
    from specpress.models.target import load_target

    out, _ = mini_zoo
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "import os\n\ndef main() -> None:\n    print('héllo')\n"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and tok.eos_token_id == 0 and ids[0] != 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ours = load_target(out)
    x = torch.tensor([[0] + ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x).logits, atol=1e-4, rtol=1e-4)


def test_same_seed_same_weights_other_seed_other_weights(mini_zoo: tuple[Path, zb.ZooReport],
                                                         mini_stdlib: Path, tmp_path: Path) -> None:
    out, _ = mini_zoo
    _build(tmp_path / "again", mini_stdlib, seed=0)
    _build(tmp_path / "other", mini_stdlib, seed=1)
    a, b, c = (load_file(str(d / "model.safetensors")) for d in (out, tmp_path / "again", tmp_path / "other"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert (out / "tokenizer.json").read_text() == (tmp_path / "again" / "tokenizer.json").read_text()


def test_an_interrupted_build_resumes_to_the_same_weights(mini_zoo: tuple[Path, zb.ZooReport],
                                                          mini_stdlib: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real_train = zb.train

    def crashing_train(model, batches, cfg, **kw):  # type: ignore[no-untyped-def]
        def crash(step: int, loss: float, tps: float) -> None:
            if step == 3:
                raise _Crash
        return real_train(model, batches, zb.replace(cfg, checkpoint_every_s=0.0), state_dir=kw["state_dir"],
                          key=kw["key"], on_step=crash)

    out = tmp_path / "zoo"
    monkeypatch.setattr(zb, "train", crashing_train)
    with pytest.raises(_Crash):
        _build(out, mini_stdlib)
    monkeypatch.setattr(zb, "train", real_train)
    assert not out.exists() and (tmp_path / "zoo.partial" / STATE_FILE).is_file()
    report = _build(out, mini_stdlib)
    assert report.resumed_from == 3 and report.steps == 6 and not (tmp_path / "zoo.partial").exists()
    a, b = (load_file(str(d / "model.safetensors")) for d in (mini_zoo[0], out))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert report.val_loss == mini_zoo[1].val_loss


def test_ctrl_c_saves_the_step_and_says_how_to_go_on(mini_zoo: tuple[Path, zb.ZooReport], mini_stdlib: Path,
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 57, item 5: Ctrl-C in zoo build said 'aborted' and nothing else, and kept only the last periodic
    checkpoint. Now the step reached is saved on the way out and the message says where and how to go on."""
    from specpress.errors import Interrupted
    from specpress.zoo.train import load_state

    real_train = zb.train

    def ctrl_c_at_3(model, batches, cfg, **kw):  # type: ignore[no-untyped-def]
        def stop(step: int, loss: float, tps: float) -> None:
            if step == 3:
                raise KeyboardInterrupt
        return real_train(model, batches, cfg, state_dir=kw["state_dir"], key=kw["key"], on_step=stop)

    out = tmp_path / "zoo"
    monkeypatch.setattr(zb, "train", ctrl_c_at_3)  # the preset checkpoints every few minutes: none periodic here
    with pytest.raises(Interrupted) as exc:
        _build(out, mini_stdlib)
    partial = tmp_path / "zoo.partial"
    assert str(exc.value) == (f"interrupted: training step 3 of 6 saved in {partial}; to continue, run the same "
                              f"command again (a build resumes from its checkpoint; --no-resume starts over)")
    assert load_state(partial / STATE_FILE)["step"] == 3 and not out.exists()
    monkeypatch.setattr(zb, "train", real_train)
    report = _build(out, mini_stdlib)
    assert report.resumed_from == 3 and report.val_loss == mini_zoo[1].val_loss


def test_build_refuses_a_foreign_dir_and_replaces_a_zoo_with_force(mini_stdlib: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(RequestError, match="not a zoo directory"):
        _build(foreign, mini_stdlib)
    with pytest.raises(RequestError, match="unknown zoo size"):
        zb.build_zoo(tmp_path / "x", size="huge", progress=False)
    out = tmp_path / "zoo"
    stale = out.with_name("zoo.partial")
    stale.mkdir(parents=True)
    (stale / "meta.json").write_text("{}")  # left by a build with other settings: discarded
    first = _build(out, mini_stdlib, steps=2)
    assert first.steps == 2 and first.resumed_from == 0 and not stale.exists()
    with pytest.raises(RequestError, match="already holds a zoo target; pass --force"):
        _build(out, mini_stdlib, steps=3)  # a finished build is kept ...
    assert json.loads((out / "zoo.json").read_text())["steps"] == 2
    second = _build(out, mini_stdlib, steps=3, force=True)  # ... unless --force: rebuilt in place
    assert second.steps == 3 and json.loads((out / "zoo.json").read_text())["steps"] == 3


def test_ensure_zoo_reuses_a_finished_build(mini_zoo: tuple[Path, zb.ZooReport], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = mini_zoo
    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path))
    shutil.copytree(out, tmp_path / "zoo" / "small")

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("ensure_zoo rebuilt a finished zoo")

    monkeypatch.setattr(zb, "build_zoo", no_build)
    assert zb.ensure_zoo("small") == tmp_path / "zoo" / "small"
    with pytest.raises(AssertionError, match="rebuilt"):
        zb.ensure_zoo("medium")


def test_preset_changes_names_what_an_older_build_was_made_with(mini_zoo: tuple[Path, zb.ZooReport],
                                                                 tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = mini_zoo
    monkeypatch.setitem(zb.PRESETS, "small", zb.preset_with("small", steps=1200, optimizer="muon"))
    shutil.copytree(out, tmp_path / "z")
    meta = json.loads((tmp_path / "z" / "zoo.json").read_text())
    meta["preset"] = {k: v for k, v in dataclasses.asdict(zb.PRESETS["small"]).items() if k != "optimizer"}
    (tmp_path / "z" / "zoo.json").write_text(json.dumps(meta))
    assert zb.preset_changes(tmp_path / "z", "small") == ["optimizer: adamw -> muon"]  # absent = the default
    meta["preset"]["steps"] = 1000
    (tmp_path / "z" / "zoo.json").write_text(json.dumps(meta))
    assert zb.preset_changes(tmp_path / "z", "small") == ["steps: 1000 -> 1200", "optimizer: adamw -> muon"]
    meta["preset"]["optimizer"] = "muon"
    meta["preset"]["steps"] = 1200
    (tmp_path / "z" / "zoo.json").write_text(json.dumps(meta))
    assert zb.preset_changes(tmp_path / "z", "small") == []


def test_a_failing_compile_falls_back_to_eager_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    toks = np.random.default_rng(0).integers(0, 300, 3000).astype(np.uint16)
    batches = TokenBatches(toks, 16, 2, seed=0)
    eager = _tiny_model()
    train(eager, batches, TrainConfig(steps=3, batch_size=2, seq_len=16, warmup_steps=1))

    def broken_compile(model: torch.nn.Module) -> object:
        def run(x: torch.Tensor) -> object:
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    model = _tiny_model()
    with pytest.warns(RuntimeWarning, match="torch.compile failed.*no C\\+\\+ compiler"):
        cfg = TrainConfig(steps=3, batch_size=2, seq_len=16, warmup_steps=1, compile=True)
        result = train(model, batches, cfg)
    assert not result.compiled and result.steps == 3
    assert all(torch.equal(a, b) for a, b in zip(eager.state_dict().values(), model.state_dict().values()))
    assert not torch.are_deterministic_algorithms_enabled()  # training turns it on for itself only


@pytest.mark.slow
def test_compiled_training_is_deterministic(mini_stdlib: Path, tmp_path: Path) -> None:
    preset = zb.replace(TINY, compile=True)
    reports = [zb.build_zoo(tmp_path / n, preset=preset, stdlib=mini_stdlib, progress=False) for n in "ab"]
    assert all(r.compiled for r in reports)
    a, b = (load_file(str(tmp_path / n / "model.safetensors")) for n in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_training_dtype_auto_follows_native_bf16_and_is_recorded(mini_stdlib: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """auto trains a bf16 preset in bf16 only where the CPU computes bf16 natively; the dtype used is in zoo.json
    and on the card, and is not a preset change a sweep reports."""
    import specpress.device as device

    for native in (True, False):
        monkeypatch.setattr(device, "native_bf16", lambda dev="cpu", native=native: native)
        assert zb._bf16(TINY, "auto") is native and zb._bf16(TINY, "fp32") is False
        assert zb._bf16(TINY, "bf16") is True
        assert zb._bf16(dataclasses.replace(TINY, bf16=False), "auto") is False  # a preset asking for fp32
    with pytest.raises(Exception, match="choose auto, bf16 or fp32"):
        zb._bf16(TINY, "fp8")
    r = _build(tmp_path / "z", mini_stdlib, dtype="fp32")
    meta = json.loads((tmp_path / "z" / "zoo.json").read_text())
    assert r.bf16 is False and meta["preset"]["bf16"] is False and meta["bf16"] is False
    assert "fp32" in (tmp_path / "z" / "README.md").read_text()
    monkeypatch.setitem(zb.PRESETS, "small", TINY)  # TINY asks for bf16; the fp32 build is not "older"
    assert zb.preset_changes(tmp_path / "z", "small") == []
