"""Shared by the drafter tests: tiny configs per family, a tiny random target, and per-family runners."""

from __future__ import annotations

import torch

from specpress.models.dflash import DFlashConfig
from specpress.models.drafter import build_drafter
from specpress.models.eagle import EagleConfig
from specpress.models.eagle3 import Eagle3Config
from specpress.models.lm import LMConfig
from specpress.models.mtp import MTPConfig
from specpress.models.target import TargetConfig, TargetModel

V, H, F, L = 61, 32, 40, 8
SHAPE = dict(vocab_size=V, hidden_size=H, intermediate_size=F, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128)
CONFIGS = {
    "eagle": EagleConfig(**SHAPE),
    "eagle3": Eagle3Config(**SHAPE, draft_vocab_size=24),
    "mtp": MTPConfig(**SHAPE, num_target_layers=L),
    "dflash": DFlashConfig(**SHAPE, num_hidden_layers=2, num_target_layers=L, block_size=4, mask_token_id=0),
    "lm": LMConfig(vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, max_position_embeddings=128),
}
FAMILIES = list(CONFIGS)


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Norm weights away from 1 and larger weights, so that a wrong norm or order shows numerically."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.6 / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.1))
    return model.eval()


def tiny_target() -> TargetModel:
    """An 8-layer random Llama target (hidden 32): EAGLE-3's taps 2, L//2, L-3 are distinct."""
    torch.manual_seed(0)
    cfg = TargetConfig(**SHAPE, num_hidden_layers=L)
    t = randomize(TargetModel(cfg), 0)
    with torch.no_grad():
        t.model.embed_tokens.weight.normal_(0, 1)
    return t


def make(family: str, target: TargetModel, seed: int = 1):
    d = randomize(build_drafter(CONFIGS[family]), seed).attach_target(target)
    if family == "eagle3":
        d.set_draft_vocab(torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:24].sort().values)
    return d


IDS = torch.randint(1, V, (1, 12), generator=torch.Generator().manual_seed(5))


@torch.no_grad()
def run(d, target: TargetModel, ids: torch.Tensor = IDS, **kw) -> torch.Tensor:
    """The family's main output on a prompt (no cache unless given in kw)."""
    out = target(ids, taps=d.taps)
    if d.family == "lm":
        return d(ids, **kw).logits
    if d.family == "dflash":
        c = ids.shape[1] - 1
        return d(d.fuse_taps(out.taps)[:, :c], d.make_block(ids[:, c]), **kw)
    hidden = d.fuse_taps(out.taps) if d.family == "eagle3" else out.hidden
    logits, g = d(hidden[:, :-1], ids[:, 1:], **kw)
    return torch.cat([logits, g], dim=-1)


CODE_TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x = 1\n    y = 2\n" * 20


def save_with_tokenizer(target: TargetModel, tmp_path):
    """Save `target` as an HF dir with a BPE tokenizer (vocab <= V) trained on CODE_TEXT, plus a .jsonl of
    that text; returns (target dir, data file). Skips the test when `tokenizers` is missing."""
    import json

    import pytest

    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from specpress.models.target import save_target

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([CODE_TEXT], trainers.BpeTrainer(vocab_size=V, special_tokens=["<eos>", "<unk>"]))
    assert tok.get_vocab_size() <= V
    tdir = save_target(target, tmp_path / "target", extra_files={"tokenizer.json": tok.to_str()})
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"text": CODE_TEXT}) for _ in range(3)) + "\n")
    return tdir, data


def random_eos_target() -> TargetModel:
    """A freshly initialised target (seed 0) of the tiny shape with EOS id 0."""
    torch.manual_seed(0)
    return TargetModel(TargetConfig(**SHAPE, num_hidden_layers=L, eos_token_id=0))


def stop_regen_at_batch(monkeypatch, n: int = 2):
    """Make regenerate's n-th batch raise KeyboardInterrupt (a Ctrl-C mid-run); returns the real batch
    function, to put back with monkeypatch.setattr(regen, "continue_batch", real)."""
    from specpress.compress import regen

    real = regen.continue_batch
    calls = []

    def stop(*a, **k):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(regen, "continue_batch", stop)
    return real


def saved_target_and_drafter(root):
    """A tiny random target saved with a tokenizer and data under root, and an EAGLE-3 drafter for it:
    (target dir, data file, drafter dir), the inputs the CLI tests hand to commands."""
    from specpress.models.drafter_io import save_drafter

    t = random_eos_target()
    tdir, data = save_with_tokenizer(t, root)
    return tdir, data, save_drafter(make("eagle3", t), root / "e3")


def lm_sweep_inputs(root, prompts: int) -> None:
    """A sweep's inputs under `root`: a tiny target, an lm drafter holding the target's own weights (every
    draft accepted until it is compressed), `prompts` 5-token prompts and 4 x 150 token ids as input_ids."""
    import json

    from specpress.models.drafter_io import save_drafter
    from specpress.models.lm import LMDrafter
    from specpress.models.target import save_target

    target = tiny_target()
    save_target(target, root / "target")
    d = LMDrafter(LMConfig.from_target_config(target.config))
    d.load_state_dict(target.state_dict())
    save_drafter(d.eval().attach_target(target), root / "drafter")
    g = torch.Generator().manual_seed(3)
    rows = [{"input_ids": torch.randint(1, V, (5,), generator=g).tolist()} for _ in range(prompts)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = [{"input_ids": torch.randint(1, V, (150,), generator=g).tolist()} for _ in range(4)]
    (root / "ids.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
