"""vLLM's loading rules for a speculators EAGLE-3 export, restated from vLLM 0.33 and run on our exports.

vLLM needs a GPU, so its rules are encoded here, each citing the file it was read from (vLLM 0.33):

- R1 module names (model_executor/models/llama_eagle3.py): the draft decoder layer is built under the prefix
  `model.layers.{num_target_layers}` (LlamaModel(start_layer_id=<target depth>)); `fc` is `model.fc` (a
  ReplicatedLinear); `lm_head` is a ParallelLMHead built without a quantization config; checkpoint names get
  `model.` prepended (all but lm_head) in Eagle3LlamaForCausalLM.load_weights.
- R2 fused Linears (model_executor/models/llama.py `packed_modules_mapping`, the stacked mapping of
  llama_eagle3.py's load_weights): q/k/v load into one QKVParallelLinear `qkv_proj`, gate/up into one
  MergedColumnParallelLinear `gate_up_proj`; o_proj / down_proj are RowParallelLinear.
- R3 ignore (quantization/compressed_tensors/utils.py `should_ignore_layer`): a fused layer is ignored when
  its shard names (fused name with the shard suffix substituted) match `ignore`, all shards alike or a
  ValueError; other layers by their own name; an entry matches when equal, or as a regex after `re:`
  (`re.match`: anchored at the start, not rewritten for the draft layer's index).
- R4 targets (same file, `find_matched_target`): the layer name equal / `re:`-matched, else the module's
  class name containing the target (case-insensitive: `Linear` is in QKVParallelLinear, RowParallelLinear,
  ReplicatedLinear, ...), else every shard of a fused layer matched.
- R5 tap count (transformers_utils/configs/speculators/base.py: the drafter's hf_config is
  transformer_layer_config plus the fields algos.py `update_eagle3` copies; the EAGLE-3 drafter and the
  model runner count the taps `fc` fuses from `eagle_config["eagle_aux_hidden_state_layer_ids"]`, 3 when
  absent): fc's in_features = target_hidden_size * that count.

The same matching is also run through compressed-tensors' own `compressed_tensors.utils.match.is_match`
(the library vLLM's loader is built on; 0.20.1 here), with stand-ins for vLLM's layer classes under its
`LinearBase`, which that function matches to a `Linear` target.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from drafters_common import CONFIGS, SHAPE, V, randomize
from safetensors.torch import load_file
from torch import nn

from specpress.compress.quantize.api import quantize
from specpress.errors import ConfigError
from specpress.export.hf import export_hf
from specpress.models.drafter import build_drafter
from specpress.models.drafter_io import save_drafter
from specpress.models.quantized.scheme import config_for
from specpress.models.target import TargetConfig, TargetModel, save_target

ct_match = pytest.importorskip("compressed_tensors.utils.match")  # the `serving` extra
FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}  # R2
SCHEMES = {"int4": {"group_size": 8}, "int4-asym": {"group_size": 8, "symmetric": False}, "int8": {}, "fp8": {}}


# ------------------------------------------------------------------ vLLM's rules, restated (see docstring)

class LinearBase(nn.Module):  # stand-ins for vLLM's layer classes (model_executor/layers/linear.py)
    pass


class QKVParallelLinear(LinearBase):
    pass


class MergedColumnParallelLinear(LinearBase):
    pass


class RowParallelLinear(LinearBase):
    pass


class ReplicatedLinear(LinearBase):
    pass


class ParallelLMHead(nn.Module):  # a VocabParallelEmbedding, not a LinearBase
    pass


def vllm_modules(num_target_layers: int) -> dict[str, tuple[nn.Module, list[str]]]:
    """R1 + R2: vLLM module name -> (a module of its class, the checkpoint names it loads)."""
    p = f"model.layers.{num_target_layers}"
    return {
        f"{p}.self_attn.qkv_proj": (QKVParallelLinear(), [f"layers.0.self_attn.{s}" for s in FUSED["qkv_proj"]]),
        f"{p}.self_attn.o_proj": (RowParallelLinear(), ["layers.0.self_attn.o_proj"]),
        f"{p}.mlp.gate_up_proj": (MergedColumnParallelLinear(), [f"layers.0.mlp.{s}" for s in FUSED["gate_up_proj"]]),
        f"{p}.mlp.down_proj": (RowParallelLinear(), ["layers.0.mlp.down_proj"]),
        "model.fc": (ReplicatedLinear(), ["fc"]),
    }


def _match(value: str, target: str, contains: bool = False) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], value) is not None
    if contains:
        return target.lower() in value.lower()
    return target == value


def should_ignore_layer(name: str, ignore: list[str]) -> bool:
    """R3."""
    proj = name.split(".")[-1]
    if proj in FUSED and name not in ignore:
        found = {any(_match(name.replace(proj, s), i) for i in ignore) for s in FUSED[proj]}
        if len(found) != 1:
            raise ValueError(f"different quantization schemes for the shards of {name}")
        return found.pop()
    return any(_match(name, i) for i in ignore)


def find_matched_target(name: str, module: nn.Module, targets: list[str]) -> str | None:
    """R4."""
    for t in targets:
        if _match(name, t):
            return t
    for t in targets:
        if _match(type(module).__name__, t, contains=True):
            return t
    fused = next((k for k in FUSED if name.endswith(k)), None)
    if fused is None:
        return None
    hits = [next((t for t in targets if _match(name.replace(fused, s), t)), None) for s in FUSED[fused]]
    return hits[0] if all(hits) else None


# ------------------------------------------------------------------------------------------ exports

def target_of_depth(n: int) -> TargetModel:
    torch.manual_seed(0)
    return randomize(TargetModel(TargetConfig(**SHAPE, num_hidden_layers=n)), 0)


def eagle3(target: TargetModel, taps: tuple[int, ...]):
    d = build_drafter(dataclasses.replace(CONFIGS["eagle3"], target_layer_ids=taps))
    d = randomize(d, 1).attach_target(target)
    d.set_draft_vocab(torch.randperm(V, generator=torch.Generator().manual_seed(1))[:24].sort().values)
    return d


DEPTHS = {8: (2, 4, 5), 2: (0, 1)}  # target depth -> taps (a 2-layer target: two taps below its depth)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """depth -> (target, its saved directory)."""
    out = {}
    for n in DEPTHS:
        t = target_of_depth(n)
        out[n] = (t, save_target(t, tmp_path_factory.mktemp(f"t{n}") / "target"))
    return out


def export(targets, depth, tmp_path, scheme, exclude=(), taps=None):
    t, tdir = targets[depth]
    d = eagle3(t, taps or DEPTHS[depth])
    quantize(d, config_for(scheme.split("-")[0], exclude=exclude, **SCHEMES[scheme]))
    src = save_drafter(d, tmp_path / "src")
    out = export_hf(src, tmp_path / "out", "speculators", verifier=str(tdir)).out
    cfg = json.loads((out / "config.json").read_text())
    return d, cfg, load_file(str(out / "model.safetensors"))


def quantized_names(tensors) -> set[str]:
    return {k.rpartition(".")[0] for k in tensors if k.endswith((".weight_packed", ".weight_scale"))}


@pytest.mark.parametrize("depth", list(DEPTHS))
@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("exclude", [(), ("fc", "down_proj")], ids=["all", "fc-down-float"])
def test_every_quantized_linear_matches_its_scheme_and_every_float_one_is_ignored(depth, scheme, exclude, targets,
                                                                                 tmp_path):
    _, cfg, tensors = export(targets, depth, tmp_path, scheme, exclude)
    q = cfg["quantization_config"]
    (group_name, group), = q["config_groups"].items()
    ignore, stored_q = q["ignore"], quantized_names(tensors)
    assert stored_q, "nothing was quantized"
    for name, (module, shards) in vllm_modules(depth).items():
        quantized = [s in stored_q for s in shards]
        assert len(set(quantized)) == 1, f"{name}: shards {shards} quantized in part"
        ignored = should_ignore_layer(name, ignore)
        matched = find_matched_target(name, module, group["targets"])
        ct_says = ct_match.is_match(name, module, group["targets"], ignore, fused=FUSED)
        if quantized[0]:
            assert not ignored and matched is not None, f"{name}: quantized in the checkpoint, unmatched in vLLM"
            assert ct_says, f"{name}: compressed-tensors' is_match does not match it"
        else:
            assert ignored, f"{name}: float in the checkpoint but not ignored: vLLM would expect {group_name}'s tensors"
            assert not ct_says
    assert "lm_head" not in stored_q  # R1: vLLM's EAGLE-3 lm_head takes no quantization config


@pytest.mark.parametrize("taps", [(2, 5), (1, 3, 4, 6)], ids=["2-taps", "4-taps"])
def test_vllm_sizes_fc_for_the_drafters_taps(taps, targets, tmp_path):
    """R5: a drafter with 2 or 4 taps gets an fc vLLM allocates at its stored shape."""
    d, cfg, tensors = export(targets, 8, tmp_path, "int8", exclude=("fc",), taps=taps)
    hf = {**cfg["transformer_layer_config"]}  # base.py: transformer_layer_config + update_eagle3's fields
    hf.update(draft_vocab_size=cfg["draft_vocab_size"], target_hidden_size=cfg["target_hidden_size"],
              eagle_aux_hidden_state_layer_ids=cfg["eagle_aux_hidden_state_layer_ids"])
    ids = (hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    count = len(ids) if ids else 3
    assert hf["eagle_aux_hidden_state_layer_ids"] == list(taps)  # the layers vLLM taps (ids it reads first)
    assert tensors["fc.weight"].shape == (d.config.hidden_size, hf["target_hidden_size"] * count)


def test_a_quantized_draft_head_is_refused(targets, tmp_path):
    """R1: vLLM's EAGLE-3 lm_head is a ParallelLMHead without a quantization config."""
    t, tdir = targets[8]
    d = eagle3(t, DEPTHS[8])
    quantize(d, config_for("int4", group_size=8, include=("lm_head",)))
    src = save_drafter(d, tmp_path / "src")
    with pytest.raises(ConfigError, match="ParallelLMHead.*--include lm_head"):
        export_hf(src, tmp_path / "out", "speculators", verifier=str(tdir))
    assert not (tmp_path / "out").exists()


def test_a_per_layer_choice_is_refused_where_the_config_cannot_name_it(target, target_dir, tmp_path):
    """The ignore list names modules without their layer index (vLLM renumbers draft layers, R1, R3): a
    module float in one DFlash layer and quantized in the other cannot be written."""
    from drafters_common import make

    d = make("dflash", target)
    quantize(d, config_for("int8", exclude=("layers.1.mlp.down_proj",)))
    src = save_drafter(d, tmp_path / "src")
    with pytest.raises(ConfigError, match=r"down_proj.*some decoder layers and float in others"):
        export_hf(src, tmp_path / "out", "speculators", verifier=str(target_dir))
