"""Real clients read what `export hf` writes.

- compressed-tensors (installed with the `serving` extra, next to the project's pins): its own config
  model parses our `quantization_config` and its own compressors decompress every quantized Linear to the
  dense weight specpress's module computes with, exactly.
- speculators (cannot be installed next to the project: it pins transformers <= 5.19 and pulls CUDA
  torch): its own config classes validate our config.json, in the side interpreter (tests/export/side.py;
  .ci/run builds it); marked `speculators`. Its models load and run our EAGLE-3 exports in
  test_speculators_loads.py.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from drafters_common import make
from safetensors.torch import load_file
from side import need_side

from specpress.compress.quantize.api import quantize
from specpress.export.hf import export_hf
from specpress.models.drafter_io import save_drafter
from specpress.models.formats.speculators import rename_out
from specpress.models.quantized.modules import quantized_modules
from specpress.models.quantized.scheme import config_for

SCHEMES = {"int4": dict(group_size=8), "int4-asym": dict(group_size=8, symmetric=False), "int8": {},
           "int8-asym": dict(group_size=8, symmetric=False), "fp8": {}, "int3": dict(group_size=8),
           "int3-asym": dict(group_size=8, symmetric=False), "int2": dict(group_size=8),
           "int2-asym": dict(group_size=8, symmetric=False), "ternary": dict(group_size=8)}


def exported(family, scheme, target, target_dir, tmp_path):
    d = make(family, target)
    if scheme:
        quantize(d, config_for(scheme.split("-")[0], **SCHEMES[scheme]))
    src = save_drafter(d, tmp_path / "src")
    out = export_hf(src, tmp_path / "out", "speculators", verifier=str(target_dir)).out
    return d, out


@pytest.mark.parametrize("family", ["eagle3", "dflash"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_compressed_tensors_decompresses_to_our_dequantized_weights(family, scheme, target, target_dir, tmp_path):
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig

    d, out = exported(family, scheme, target, target_dir, tmp_path)
    qc = QuantizationConfig.model_validate(json.loads((out / "config.json").read_text())["quantization_config"])
    scheme_obj = qc.config_groups["group_0"]
    compressor = BaseCompressor.load_from_registry(scheme_obj.format or qc.format)
    tensors = load_file(str(out / "model.safetensors"))
    mods = quantized_modules(d)
    assert mods, "nothing was quantized"
    for name, mod in mods.items():
        pre = rename_out(family, name) + "."
        local = {k[len(pre):]: v for k, v in tensors.items() if k.startswith(pre) and not k.endswith("bias")}
        dense = compressor.decompress(local, scheme_obj)["weight"]
        ours = mod.dequantize(torch.float32)
        # compressed-tensors dequantizes in the scale's dtype (float32, or the low-bit schemes' float16): one
        # rounding of specpress's float32 product, which is exact (small integer code times the scale)
        assert dense.shape == ours.shape and torch.equal(dense, ours.to(dense.dtype)), f"{ct.__name__}: {name}"


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`")
def test_transformers_loads_a_compressed_lm_drafter(target, target_dir, tmp_path):
    """The `lm` family leaves as a plain HF Llama dir: transformers' compressed-tensors quantizer loads
    it (decompressing) and computes the logits specpress's int4 drafter computes."""
    pytest.importorskip("compressed_tensors")
    transformers = pytest.importorskip("transformers")
    d, out = exported("lm", "int4", target, target_dir, tmp_path)
    qcfg = transformers.CompressedTensorsConfig(run_compressed=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, quantization_config=qcfg,
                                                           torch_dtype=torch.float32).eval()
    ids = torch.randint(1, 61, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids).logits
        ours = d(ids).logits
    assert (ref - ours).abs().max() < 1e-4


VALIDATE = r"""
import json, sys
from speculators import SpeculatorModelConfig
from speculators.models import DFlashSpeculatorConfig, Eagle3SpeculatorConfig
for path in sys.argv[1:]:
  raw = json.load(open(path))
  cfg = SpeculatorModelConfig.from_dict(raw)
  want = {"eagle3": Eagle3SpeculatorConfig, "dflash": DFlashSpeculatorConfig}[raw["speculators_model_type"]]
  assert type(cfg) is want, type(cfg)
  sc = cfg.speculators_config
  out = {"type": type(cfg).__name__, "algorithm": sc.algorithm, "tokens": sc.proposal_methods[0].speculative_tokens,
         "verifier": sc.verifier.name_or_path, "draft_vocab_size": cfg.draft_vocab_size,
         "layer_type": cfg.transformer_layer_config.model_type,
         "vocab": cfg.transformer_layer_config.vocab_size, "hidden": cfg.transformer_layer_config.hidden_size}
  for k in ("eagle_aux_hidden_state_layer_ids", "aux_hidden_state_layer_ids", "block_size", "norm_before_residual"):
      if hasattr(cfg, k):
          out[k] = getattr(cfg, k)
  print(json.dumps(out))
"""


@pytest.mark.speculators
def test_speculators_config_classes_validate_our_config(target, target_dir, tmp_path):
    """One interpreter start (~15 s)."""
    exe = need_side()
    made = {f: exported(f, "int4", target, target_dir, tmp_path / f) for f in ("eagle3", "dflash")}
    r = subprocess.run([exe, "-c", VALIDATE, *(str(out / "config.json") for _, out in made.values())],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()[-2:]
    for (family, (d, _)), line in zip(made.items(), lines):
        got = json.loads(line)
        c = d.config
        assert got["algorithm"] == family and got["verifier"] == str(target_dir)
        assert got["vocab"] == c.vocab_size and got["hidden"] == c.hidden_size
        if family == "eagle3":
            assert got["type"] == "Eagle3SpeculatorConfig" and got["layer_type"] == "llama"
            assert got["draft_vocab_size"] == c.draft_vocab_size and got["norm_before_residual"] is False
            assert got["tokens"] == 3
        else:
            assert got["type"] == "DFlashSpeculatorConfig" and got["layer_type"] == "qwen3"
            assert got["aux_hidden_state_layer_ids"] == [i + 1 for i in c.target_layer_ids]
            assert got["block_size"] == c.block_size and got["tokens"] == c.block_size - 1
