"""DistillConfig's record is pinned: to_dict() is the provenance of every distilled drafter, the resume key
of its checkpoints and (hashed) the sweep's distilled-drafter cache key (~/.cache/specpress/drafters/), so a
change to how the config is held inside must not move one byte of it. The expected records are literals
written from the flat config of 2026-12-07, before the family options moved into classes of their own
(Eagle3Options, DFlashOptions: issue 36 §2); they held unchanged across that move."""

from __future__ import annotations

import hashlib
import json

import pytest

from specpress.compress.config import DistillConfig

# the record of DistillConfig(family="eagle", steps=10, bf16=False); each case below differs from it by `diff`
BASE = ('{"anchors": 16, "batch": 8, "bf16": false, "block_size": 8, "ce_weight": 0.1, "checkpoint_minutes": 2.0, '
        '"compile": false, "draft_vocab": null, "eval_batches": 4, "family": "eagle", "feature_noise": 0.1, '
        '"feature_weight": 1.0, "ffn": null, "gamma": null, "grad_clip": null, "heads": null, "hidden": null, '
        '"kv_heads": null, "labels": "target", "layers": null, "lr": 0.001, "markov_rank": null, '
        '"mask_token_id": null, "min_lr_ratio": 0.1, "minutes": null, "optimizer": "adamw", "seed": 0, '
        '"seq_len": 128, "step_decay": 0.8, "steps": 10, "taps": null, "teacher_weight": 1.0, "ttt_steps": null, '
        '"tv_weight": 0.0, "version": 1, "warmup_ratio": 0.04, "weight_decay": 0.0}')

# the record's key order (to_dict's insertion order, which json.dumps without sort_keys would show)
ORDER = ['version', 'family', 'steps', 'minutes', 'lr', 'optimizer', 'warmup_ratio', 'min_lr_ratio', 'weight_decay',
         'grad_clip', 'batch', 'seq_len', 'seed', 'hidden', 'layers', 'ffn', 'heads', 'kv_heads', 'draft_vocab',
         'taps', 'ttt_steps', 'block_size', 'anchors', 'gamma', 'mask_token_id', 'markov_rank', 'feature_noise',
         'feature_weight', 'ce_weight', 'step_decay', 'labels', 'tv_weight', 'teacher_weight', 'checkpoint_minutes',
         'eval_batches', 'bf16', 'compile']

# name: (DistillConfig keywords, the record's difference from BASE, sha256[:16] of the sorted-key JSON)
CASES = {
    "eagle-defaults": (dict(family="eagle", steps=10), {}, "6357287003a53def"),
    "eagle-unset-options": (dict(family="eagle", steps=10, taps=None, tv_weight=0.0, gamma=None, markov_rank=None),
                            {}, "6357287003a53def"),
    "eagle3-defaults": (dict(family="eagle3", steps=10),
                        {"family": "eagle3", "lr": 0.002, "optimizer": "muon"}, "c129fd7f116bce13"),
    "eagle3-taps": (dict(family="eagle3", steps=10, taps=(1, 3, 4)),
                    {"family": "eagle3", "lr": 0.002, "optimizer": "muon", "taps": [1, 3, 4]}, "7c3260a34635f6d6"),
    "eagle3-taps-list": (dict(family="eagle3", minutes=2.5, taps=[2, 4, 8], lr=5e-4, optimizer="adamw", draft_vocab=64),
                         {"draft_vocab": 64, "family": "eagle3", "lr": 0.0005, "minutes": 2.5, "steps": None,
                          "taps": [2, 4, 8]}, "d3be34537bfdafb1"),
    "mtp-defaults": (dict(family="mtp", steps=10, labels="data", ttt_steps=2),
                     {"family": "mtp", "labels": "data", "ttt_steps": 2}, "296fc091e138f3aa"),
    "lm-defaults": (dict(family="lm", steps=10, hidden=64, layers=2, bf16=True),
                    {"bf16": True, "family": "lm", "hidden": 64, "layers": 2}, "605d710ac93f813b"),
    "dflash-defaults": (dict(family="dflash", steps=10), {"family": "dflash"}, "f2654c3b000d694c"),
    "dflash-taps": (dict(family="dflash", steps=10, taps=(1, 2)),
                    {"family": "dflash", "taps": [1, 2]}, "82192c6bd58715c2"),
    "dflash-gamma": (dict(family="dflash", steps=10, gamma=1.0),
                     {"family": "dflash", "gamma": 1.0}, "9b8e1a1969d85ef6"),
    "dflash-gamma-int": (dict(family="dflash", steps=10, gamma=2),  # an int stays an int ("gamma": 2)
                         {"family": "dflash", "gamma": 2}, "d24e540fe8b432a1"),
    "dflash-markov": (dict(family="dflash", steps=10, markov_rank=128),
                      {"family": "dflash", "markov_rank": 128}, "e9e6624c0ff8ddef"),
    "dflash-tv": (dict(family="dflash", steps=10, tv_weight=0.9),
                  {"family": "dflash", "tv_weight": 0.9}, "060ff19648886384"),
    "dflash-tv-int": (dict(family="dflash", steps=10, tv_weight=0),  # "tv_weight": 0, not 0.0
                      {"family": "dflash", "tv_weight": 0}, "da207ff56438a8c8"),
    "dflash-all": (dict(family="dflash", steps=100, minutes=10.0, taps=(1, 4, 6), gamma=1.0, markov_rank=4,
                        tv_weight=0.5, lr=3e-3, optimizer="muon", block_size=16, anchors=8, mask_token_id=0,
                        labels="data", compile=True),
                   {"anchors": 8, "block_size": 16, "compile": True, "family": "dflash", "gamma": 1.0,
                    "labels": "data", "lr": 0.003, "markov_rank": 4, "mask_token_id": 0, "minutes": 10.0,
                    "optimizer": "muon", "steps": 100, "taps": [1, 4, 6], "tv_weight": 0.5}, "37f6c2856bfafca5"),
}


def _config(kw: dict) -> DistillConfig:
    return DistillConfig(**{"bf16": False, **kw})  # bf16 given: None resolves from the device


def _expected(diff: dict) -> str:
    return json.dumps({**json.loads(BASE), **diff}, sort_keys=True)


@pytest.mark.parametrize("name", CASES)
def test_record_is_byte_identical(name):
    kw, diff, digest = CASES[name]
    got = json.dumps(_config(kw).to_dict(), sort_keys=True)
    assert got == _expected(diff)
    assert hashlib.sha256(got.encode()).hexdigest()[:16] == digest
    assert list(_config(kw).to_dict()) == ORDER


@pytest.mark.parametrize("name", CASES)
def test_old_records_round_trip(name):
    """A record written before the options moved reads back as the same config, and writes the same bytes."""
    kw, diff, _ = CASES[name]
    record = json.loads(_expected(diff))
    back = DistillConfig.from_dict(record)
    assert back == _config(kw)
    assert json.dumps(back.to_dict(), sort_keys=True) == _expected(diff)


@pytest.mark.parametrize("name", ["eagle3-taps", "dflash-all"])
def test_resume_key_is_the_record_less_the_budgets(name):
    kw, diff, _ = CASES[name]
    want = json.loads(_expected(diff))
    for k in ("minutes", "checkpoint_minutes", "eval_batches"):
        want.pop(k)
    assert json.dumps(_config(kw).resume_key(), sort_keys=True) == json.dumps(want, sort_keys=True)
