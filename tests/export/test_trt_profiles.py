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


def test_a_sum_axis_is_sized_as_the_sum_of_its_parts():
    # DFlash's block graph: positions [1, context_block] covers features [1, context] then block_ids [1, block];
    # sized on its own, the profile's opt / max shapes contradict the graph (TensorRT for RTX aborted on it)
    shapes = {"features": (1, "context", 8), "block_ids": (1, "block"), "positions": (1, "context_block"),
              "past_key.0": (1, 1, "past", 8)}
    b = Budget(max_tree=32, max_context=128)
    for phase, shp in profiles(shapes, b).items():
        for i in range(3):  # min, opt, max
            assert shp["positions"][i][1] == shp["features"][i][1] + shp["block_ids"][i][1], phase
    assert profiles(shapes, b)["draft"]["positions"] == ((1, 2), (1, 144), (1, 160))
    # an override of a part carries into the sum; an override of the sum itself wins
    over = profile_shapes(shapes, b, {"context": AxisRange(4, 8, 16)})
    assert over["positions"] == ((1, 5), (1, 24), (1, 48))
    assert profile_shapes(shapes, b, {"context_block": AxisRange(3, 3, 3)})["positions"] == ((1, 3), (1, 3), (1, 3))
    # names that merely contain underscores are not sums unless every part is an axis of the graph
    assert profile_shapes({"x": ("past_len",)}, b)["x"] == ((0,), (128,), (128,))
