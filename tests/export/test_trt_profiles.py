"""Optimization profiles from an export's dynamic axes (no TensorRT needed)."""

from __future__ import annotations

import pytest

from specpress.errors import ConfigError
from specpress.export.trt.probe import save_probe
from specpress.export.trt.profiles import (AxisRange, Budget, axis_range, classify, onnx_input_shapes,
                                           profile_shapes, profiles)


@pytest.mark.parametrize("axis,kind", [("tree", "tree"), ("new_tokens", "tree"), ("seq_len", "tree"),
                                       ("past_len", "context"), ("slots", "context"), ("kv_len", "context"),
                                       ("mask_words", "words"), ("words", "words"), ("batch", "batch"),
                                       ("vocab", None)])
def test_classify(axis, kind):
    assert classify(axis) == kind


def test_ranges_follow_the_budget():
    b = Budget(max_tree=40, max_context=1000)
    assert axis_range("tree", b) == AxisRange(1, 16, 40)
    assert axis_range("words", b) == AxisRange(1, 1, 2)  # ceil(40 / 32)
    assert axis_range("past_len", b) == AxisRange(0, 256, 1000)  # a first call has no past
    assert axis_range("slots", b) == AxisRange(1, 256, 1000)
    assert axis_range("tree", b, "prefill") == AxisRange(1, 256, 1000)
    assert axis_range("words", b, "prefill") == AxisRange(1, 8, 32)  # ceil(1000 / 32)
    assert axis_range("batch", b, "prefill") == AxisRange(1, 1, 1)


def test_unknown_axis_names_the_flag():
    with pytest.raises(ConfigError, match="--axis vocab=MIN:OPT:MAX"):
        axis_range("vocab", Budget())


def test_bad_budget_and_ranges():
    with pytest.raises(ConfigError, match="max_tree <= max_context"):
        Budget(max_tree=64, max_context=32)
    with pytest.raises(ConfigError, match="min <= opt <= max"):
        AxisRange(4, 2, 8)
    with pytest.raises(ConfigError, match="MIN:OPT:MAX"):
        AxisRange.parse("1:2")
    assert AxisRange.parse("8") == AxisRange(8, 8, 8)
    assert AxisRange.parse("1:4:9") == AxisRange(1, 4, 9)


def test_profiles_of_the_probe_graph(tmp_path):
    shapes = onnx_input_shapes(save_probe(tmp_path / "p.onnx", num_heads=8, num_kv_heads=2))
    assert shapes["q"] == (1, 8, "tree", 64) and shapes["tree_mask"] == ("tree", "words")
    b = Budget(max_tree=64, max_context=512)
    got = profiles(shapes, b)
    assert set(got) == {"draft", "prefill"}
    assert got["draft"]["q"] == ((1, 8, 1, 64), (1, 8, 16, 64), (1, 8, 64, 64))
    assert got["draft"]["k"] == ((1, 2, 1, 64), (1, 2, 256, 64), (1, 2, 512, 64))
    assert got["draft"]["tree_mask"] == ((1, 1), (16, 1), (64, 2))
    assert got["draft"]["committed"] == ((1,), (1,), (1,))
    assert got["prefill"]["q"][2] == (1, 8, 512, 64) and got["prefill"]["tree_mask"][2] == (512, 16)


def test_overrides_win_and_single_profile_when_phases_agree():
    shapes = {"x": ("past_len", 4)}
    got = profiles(shapes, Budget(), {"past_len": AxisRange(2, 3, 5)})
    assert got == {"draft": {"x": ((2, 4), (3, 4), (5, 4))}}
    assert profile_shapes({"y": ("tree",)}, Budget(max_tree=8, max_context=8), phase="draft")["y"][2] == (8,)
