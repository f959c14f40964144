"""Run a specpress EAGLE-3 drafter inside SafeAILab/EAGLE's own inference code (the ecosystem reference).

Nothing of EAGLE is vendored: pass the path of a checkout (the directory holding its `eagle/` package).
Run in a venv with EAGLE's imports (torch, transformers 5, safetensors, huggingface_hub, accelerate) plus
specpress's, with this repo on PYTHONPATH:

    PYTHONPATH=. python bench/eagle_reference.py window --eagle ~/EAGLE --target T --drafter D
    PYTHONPATH=. python bench/eagle_reference.py decode --eagle ~/EAGLE --target T --drafter D \
        --prompts prompts.jsonl --total-token 16 --depth 4 --top-k 4 --max-new-tokens 64

`window` runs one teacher-forced window through both drafters (EAGLE's `cnets.Model` loaded by its own
`EaModel.from_pretrained`, and specpress's) and prints, stage by stage, the largest difference and the
first position that differs. `decode` runs EAGLE's `eagenerate` (greedy) and specpress's loop with the
same EAGLE-2 tree and prints τ (tokens per target forward, bonus included) of both, and whether EAGLE's
output equals plain greedy decoding. Both print one JSON object last.

EAGLE's code targets transformers 4.x; the fixes below are applied from here, never to its files:
- its Qwen2/Qwen3 KV modules import transformers internals that 5.x removed: stubbed (Llama targets only);
- its configs read the 4.x `rope_theta` / `rope_scaling` attributes: set on the base model's config;
- transformers 5 leaves the KV model's rotary buffers uninitialised after loading: `_init_rope` re-run;
- `_tied_weights_keys` is a 4.x list that 5.x rejects on tied targets: given as a 5.x mapping;
- its EAGLE-3 `load_emb` reads the target embedding through `model.safetensors.index.json`: a single-file
  target is presented through a temporary directory of links plus a one-entry index;
- `AutoTokenizer(use_fast=False)` is replaced by the only thing `eagenerate` reads, `eos_token_id`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import torch

LOAD_REPORT: dict[str, list[str]] = {}


def import_eagle(eagle_dir: str | Path) -> types.SimpleNamespace:
    """Import EAGLE's inference modules from a checkout, with the transformers-5 fixes applied."""
    root = Path(eagle_dir).expanduser().resolve()
    if not (root / "eagle" / "model" / "ea_model.py").is_file():
        raise SystemExit(f"{root} is not an EAGLE checkout (expected eagle/model/ea_model.py under it)")
    sys.path.insert(0, str(root))
    import eagle.model  # noqa: F401  (the package, so the stubs below can sit inside it)

    for mod, cls in (("modeling_qwen2_kv", "Qwen2ForCausalLM"), ("modeling_qwen3_kv", "Qwen3ForCausalLM"),
                     ("modeling_mixtral_kv", "MixtralForCausalLM")):
        name = f"eagle.model.{mod}"
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            setattr(stub, cls, type(cls, (), {"from_pretrained": classmethod(_unsupported(cls))}))
            sys.modules[name] = stub
    from eagle.model import cnets, ea_model, modeling_llama_kv

    kv = modeling_llama_kv.LlamaForCausalLM
    kv._tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    ea_model.AutoTokenizer = _EosOnlyTokenizer
    original = cnets.Model.load_state_dict

    def load_state_dict(self, state_dict, strict=True, **kw):  # records what EAGLE's loader reports
        res = original(self, state_dict, strict=strict, **kw)
        LOAD_REPORT["missing"] = sorted(res.missing_keys)
        LOAD_REPORT["unexpected"] = sorted(res.unexpected_keys)
        return res

    cnets.Model.load_state_dict = load_state_dict
    init = cnets.Model.__init__

    def model_init(self, config, *a, **kw):  # 4.x rope attributes on the drafter's EConfig
        _rope_4x(config)
        init(self, config, *a, **kw)

    cnets.Model.__init__ = model_init
    return types.SimpleNamespace(cnets=cnets, ea_model=ea_model, kv=modeling_llama_kv)


def _rope_4x(cfg: Any) -> None:
    """Give a transformers-5 config the 4.x `rope_theta` and `rope_scaling` (None: default RoPE)."""
    rope = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise SystemExit(f"this harness handles default RoPE only (config has {rope})")
    theta = getattr(cfg, "rope_theta", None) or rope.get("rope_theta", 10000.0)
    cfg.rope_scaling = None
    cfg.rope_theta = theta


def _unsupported(cls: str):
    def from_pretrained(*_a: Any, **_k: Any) -> None:
        raise SystemExit(f"this harness stubs EAGLE's {cls} (it does not import under transformers 5); "
                         f"use a Llama target")
    return from_pretrained


class _EosOnlyTokenizer:
    """What eagenerate reads from the tokenizer: eos_token_id (from the target's config.json)."""

    def __init__(self, eos: int | None) -> None:
        self.eos_token_id = eos

    @classmethod
    def from_pretrained(cls, path: str, **_kw: Any) -> "_EosOnlyTokenizer":
        eos = json.loads((Path(path) / "config.json").read_text()).get("eos_token_id")
        return cls(eos[0] if isinstance(eos, list) else eos)


def target_view(target_dir: Path, tmp: Path) -> Path:
    """A directory of links to `target_dir` plus model.safetensors.index.json when it is single-file."""
    if (target_dir / "model.safetensors.index.json").is_file():
        return target_dir
    view = tmp / "target"
    view.mkdir()
    for f in target_dir.iterdir():
        (view / f.name).symlink_to(f.resolve())
    (view / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model.safetensors"}}))
    return view


def load_eagle(eg: types.SimpleNamespace, target_dir: Path, drafter_dir: Path, tmp: Path, *,
               total_token: int, depth: int, top_k: int) -> Any:
    """EaModel.from_pretrained(use_eagle3=True) on a Llama target, fp32, CPU."""
    from transformers import AutoConfig

    view = target_view(target_dir, tmp)
    cfg = AutoConfig.from_pretrained(view)
    _rope_4x(cfg)
    model = eg.ea_model.EaModel.from_pretrained(
        use_eagle3=True, base_model_path=str(view), ea_model_path=str(drafter_dir), total_token=total_token,
        depth=depth, top_k=top_k, config=cfg, torch_dtype=torch.float32)
    for m in model.base_model.modules():
        if hasattr(m, "_init_rope") and hasattr(m, "rotary_emb"):
            m._init_rope()
    return model.eval()


def load_report(ea: Any, target_embedding: torch.Tensor) -> dict[str, Any]:
    """What EAGLE's load_state_dict(strict=False) reported, and whether its drafter ended up with the
    target's embedding (its load_emb fills embed_tokens outside the state dict, so a listed
    `embed_tokens.weight` is harmless exactly when this is true)."""
    mine = ea.ea_layer.embed_tokens.weight
    return {**LOAD_REPORT, "embedding_is_targets": bool(torch.equal(mine, target_embedding.to(mine.dtype)))}


def compare(name: str, a: torch.Tensor, b: torch.Tensor, tol: float) -> dict[str, Any]:
    """Largest |a - b| and the first position (dim 1) where it exceeds tol."""
    if a.shape != b.shape:
        return {"stage": name, "shape": [list(a.shape), list(b.shape)]}
    d = (a.float() - b.float()).abs().reshape(a.shape[0], a.shape[1], -1).amax(dim=(0, 2))
    bad = (d > tol).nonzero()
    return {"stage": name, "max_abs": float(d.max()), "first_diff_pos": int(bad[0]) if len(bad) else None}


@torch.no_grad()
def window(eg, args, tmp: Path) -> dict[str, Any]:
    from specpress.models.drafter_io import load_drafter
    from specpress.models.target import load_target

    ea = load_eagle(eg, args.target, args.drafter, tmp, total_token=args.total_token, depth=args.depth,
                    top_k=args.top_k)
    target = load_target(args.target)
    d = load_drafter(args.drafter, target)
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, target.config.vocab_size, (1, args.window), generator=g)
    out, _orig, _h = ea(ids, output_orig=True)
    taps_e = list(out["hidden_states"])
    ours = target(ids, taps=d.taps)
    taps_s = [ours.taps[i] for i in d.taps]
    rows = [compare(f"tap {i} (specpress hidden_states[{t}])", taps_e[i] if i < len(taps_e) else ids[..., None],
                    taps_s[i], args.tol) for i, t in enumerate(d.taps)]
    if len(taps_e) != len(taps_s):
        rows.append({"stage": "tap count", "eagle": len(taps_e), "specpress": len(taps_s)})
    feats_e, feats_s = torch.cat(taps_e, -1)[:, :-1], d.fuse_taps(ours.taps)[:, :-1]
    rows += drafter_stages(ea.ea_layer, d, feats_e, feats_s, ids, args.tol)
    emb = d.shared.embed_tokens.weight
    res = {"mode": "window", "load": load_report(ea, emb), "stages": rows}
    if not res["load"]["embedding_is_targets"]:
        # Isolate what else differs: give EAGLE's drafter the target's embedding and compare again.
        ea.ea_layer.embed_tokens.weight.data.copy_(emb)
        res["stages_with_target_embedding"] = drafter_stages(ea.ea_layer, d, feats_e, feats_s, ids, args.tol)
    return res


def drafter_stages(layer, d, feats_e: torch.Tensor, feats_s: torch.Tensor, ids: torch.Tensor,
                   tol: float) -> list[dict[str, Any]]:
    """EAGLE's cnets.Model vs specpress's drafter on one teacher-forced window, stage by stage."""
    nxt = ids[:, 1:]
    rows = [compare("embedding of the next token", layer.embed_tokens(nxt), d.embed(nxt), tol)]
    if feats_e.shape == feats_s.shape:
        rows.append(compare("fc(fused taps)", layer.fc(feats_e), d.fc(feats_s), tol))
    h_e = layer(feats_e, input_ids=nxt)
    logits_s, h_s = d(feats_s, nxt)
    rows.append(compare("midlayer output (fed back)", h_e, h_s, tol))
    logits_e = layer.lm_head(layer.norm(h_e))
    rows.append(compare("draft-vocab logits", logits_e, logits_s, tol))
    agree = float((logits_e.argmax(-1) == logits_s.argmax(-1)).float().mean())
    rows.append({"stage": "draft argmax agreement", "fraction": agree})
    # One draft step: the fed-back hidden of each position with the token after next.
    h2_e = layer(h_e[:, :-1], input_ids=ids[:, 2:])
    _, h2_s = d(h_s[:, :-1], ids[:, 2:])
    rows.append(compare("draft step 2 output (no cache)", h2_e, h2_s, tol))
    return rows


@torch.no_grad()
def decode(eg, args, tmp: Path) -> dict[str, Any]:
    from specpress.models.drafter_io import load_drafter_for
    from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
    from specpress.runtime.bench import load_bench_inputs
    from specpress.runtime.loop import speculative_generate
    from specpress.runtime.plain import decode_plain
    from specpress.runtime.policy import parse_policy
    from specpress.runtime.sampling import SamplingParams

    ea = load_eagle(eg, args.target, args.drafter, tmp, total_token=args.total_token, depth=args.depth,
                    top_k=args.top_k)
    target, prompts = load_bench_inputs(args.target, args.prompts)
    prompts = prompts[: args.limit] if args.limit else prompts
    d = load_drafter_for(target, args.drafter)
    policy = parse_policy(f"dynamic:depth={args.depth},topk={args.top_k},budget={args.total_token - 1}")
    e_tok = e_rounds = s_acc = s_rounds = 0
    lossless = True
    for p in prompts:
        ids = torch.tensor([p.ids])
        out, new, idx = ea.eagenerate(ids, max_new_tokens=args.max_new_tokens, log=True,
                                      max_length=len(p.ids) + args.max_new_tokens + 64)
        e_tok, e_rounds = e_tok + int(new), e_rounds + int(idx) + 1
        got = out[0, len(p.ids):].tolist()
        plain = decode_plain(TorchTarget(target), p.ids, len(got)).tokens
        lossless &= got == plain[: len(got)]
        res = speculative_generate(TorchTarget(target), drafter_runner(d), p.ids, args.max_new_tokens, policy,
                                   SamplingParams(0.0, 0, 1.0), torch.Generator().manual_seed(0))
        s_acc += sum(r.accepted for r in res.rounds)
        s_rounds += len(res.rounds)
    return {"mode": "decode", "load": load_report(ea, target.model.embed_tokens.weight), "prompts": len(prompts),
            "policy": str(policy), "max_new_tokens": args.max_new_tokens, "tau_eagle": e_tok / e_rounds, "tau_specpress": 1 + s_acc / s_rounds, "eagle_lossless": lossless}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["window", "decode"])
    ap.add_argument("--eagle", required=True, help="EAGLE checkout (holds eagle/model/ea_model.py)")
    ap.add_argument("--target", required=True, type=Path)
    ap.add_argument("--drafter", required=True, type=Path)
    ap.add_argument("--prompts", help="decode: a prompts file (specpress bench format)")
    ap.add_argument("--limit", type=int, default=0, help="decode: first N prompts (0 = all)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--total-token", type=int, default=16)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--window", type=int, default=24, help="window: tokens in the teacher-forced window")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--json", type=Path, help="also write the result object to this file")
    args = ap.parse_args(argv)
    args.target, args.drafter = args.target.expanduser(), args.drafter.expanduser()
    if args.mode == "decode" and not args.prompts:
        ap.error("decode needs --prompts (a .jsonl of {\"prompt\": ...} or {\"input_ids\": [...]} lines)")
    torch.manual_seed(args.seed)
    eg = import_eagle(args.eagle)
    with tempfile.TemporaryDirectory() as tmp:
        res = (window if args.mode == "window" else decode)(eg, args, Path(tmp))
    print(json.dumps(res, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
