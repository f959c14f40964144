"""Exports shared by the export tests: each tiny family drafter exported once per session and form."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drafters_common import CONFIGS, make, tiny_target  # noqa: E402

from specpress.models.drafter import build_drafter  # noqa: E402


@pytest.fixture(scope="session")
def target():
    return tiny_target()


@pytest.fixture(scope="session")
def target_dir(target, tmp_path_factory):
    """The tiny target saved as an HF directory (the verifier the serving-format exports name)."""
    from specpress.models.target import save_target

    return save_target(target, tmp_path_factory.mktemp("verifier") / "target")


def make_drafter(name: str, target):
    """A tiny random drafter: the families of drafters_common, plus `dflash_markov` (a Markov head)."""
    if name == "dflash_markov":
        from drafters_common import randomize

        cfg = dataclasses.replace(CONFIGS["dflash"], markov_rank=3)
        return randomize(build_drafter(cfg), 7).attach_target(target)
    return make(name, target)


def bench_inputs(tmp_path: Path, target, family: str, monkeypatch) -> tuple[Path, Path, Path]:
    """For the `bench` CLI tests: (target dir with a tokenizer, a saved random `family` drafter, a file of two
    prompts), with SPECPRESS_CACHE moved under tmp_path so on-demand exports land there."""
    import json

    from drafters_common import save_with_tokenizer

    from specpress.models.drafter_io import save_drafter

    monkeypatch.setenv("SPECPRESS_CACHE", str(tmp_path / "cache"))
    tdir, _ = save_with_tokenizer(target, tmp_path)
    ddir = save_drafter(make_drafter(family, target), tmp_path / family)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"input_ids": [3, 5, 7, 9 + i]}) for i in range(2)) + "\n")
    return tdir, ddir, prompts


@pytest.fixture(scope="session")
def exported(tmp_path_factory, target):
    """exported(name, form="standard", **options) -> (drafter, export dir, report), built once each."""
    pytest.importorskip("onnxruntime")
    from specpress.export.onnx import ExportOptions, export_onnx

    cache: dict = {}

    def get(name: str, form: str = "standard", **opts):
        key = (name, form, tuple(sorted(opts.items())))
        if key not in cache:
            d = make_drafter(name, target)
            out = tmp_path_factory.mktemp("onnx") / f"{name}-{form}"
            report = export_onnx(d, out, ExportOptions(attention=form, **opts), target=target)
            cache[key] = (d, out, report)
        return cache[key]

    return get
