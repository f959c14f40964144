"""The target model: Llama / Mistral / Qwen2 / Qwen3 decoder, with a preallocated KV cache.

One forward serves prefill, one-token decode and a tree verify: new tokens come with explicit
positions and an explicit boolean mask over [cached slots ; new tokens]. Hidden-state taps use
HF's `hidden_states` indexing: tap i < L is the residual stream entering layer i, tap L is the
final normed hidden state.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor, nn

from specpress.errors import CheckpointError, ConfigError, RequestError
from specpress.limits import DIM_BOUNDS, check_dim, check_dims
from specpress.models.kv import Fp8KVCache, KVCache
from specpress.models.layers import (MLP, RMSNorm, RopeConfig, Rotary, apply_rotary, attention, resolve_mask,
                                     resolve_positions)

ARCHITECTURES = {
    # architecture -> (model_type, q/k/v bias default, o bias default, q/k norm)
    "LlamaForCausalLM": ("llama", None, None, False),
    "MistralForCausalLM": ("mistral", False, False, False),
    "Qwen2ForCausalLM": ("qwen2", True, False, False),
    "Qwen3ForCausalLM": ("qwen3", None, None, True),
}


@dataclass(frozen=True)
class TargetConfig:
    """The fields of an HF config.json that define the network (frozen, validated)."""

    architecture: str = "LlamaForCausalLM"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope: RopeConfig | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    sliding_window: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(
                f"architecture {self.architecture!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
        check_dims({f: getattr(self, f) for f in DIM_BOUNDS if hasattr(self, f)}, "model config")
        _, qkvb, ob, _ = ARCHITECTURES[self.architecture]
        put = object.__setattr__
        if self.num_key_value_heads is None:
            put(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                  f"{self.num_attention_heads}; set head_dim explicitly")
            put(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.rope is None:
            put(self, "rope", RopeConfig(theta=self.rope_theta))
        put(self, "qkv_bias", bool(qkvb if self.qkv_bias is None else self.qkv_bias))
        put(self, "o_bias", bool(ob if self.o_bias is None else self.o_bias))
        if self.num_attention_heads % self.num_key_value_heads:  # type: ignore[operator]
            raise ConfigError(f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                              f"num_key_value_heads {self.num_key_value_heads}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"config field {name!r} must be positive, found {getattr(self, name)}")

    @property
    def qk_norm(self) -> bool:
        return ARCHITECTURES[self.architecture][3]

    @property
    def model_type(self) -> str:
        return ARCHITECTURES[self.architecture][0]

    @property
    def max_context(self) -> int:
        """Longest sequence this model computes exactly (a sliding window caps full attention)."""
        if self.sliding_window:
            return min(self.max_position_embeddings, int(self.sliding_window))
        return self.max_position_embeddings

    @property
    def eos_ids(self) -> tuple[int, ...]:
        e = self.eos_token_id
        return () if e is None else tuple(e) if isinstance(e, (list, tuple)) else (int(e),)

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any], source: str = "config.json") -> "TargetConfig":
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else {v[0]: k for k, v in ARCHITECTURES.items()}.get(cfg.get("model_type", ""), "")
        if arch not in ARCHITECTURES:
            raise ConfigError(f"{source}: architecture {arch or cfg.get('model_type')!r} is not supported; "
                              f"supported: {', '.join(ARCHITECTURES)}")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [k for k in required if k not in cfg]
        if missing:
            raise ConfigError(f"{source}: missing field(s) {', '.join(missing)}")
        if cfg.get("mlp_bias"):
            raise ConfigError(f"{source}: mlp_bias=true is not supported")
        sw = cfg.get("sliding_window")
        if arch == "Qwen2ForCausalLM" and not cfg.get("use_sliding_window", False):
            sw = None
        if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") and not cfg.get("use_sliding_window", False):
            sw = None
        qkvb = ob = None
        if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
            qkvb = ob = bool(cfg.get("attention_bias", False))
        for k in ("eos_token_id", "bos_token_id"):
            v = cfg.get(k)
            ids = v if isinstance(v, list) else [v]
            if v is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise ConfigError(f"{source}: {k} must be a token id or a list of them, found {v!r}")
        dims = {k: check_dim(k, cfg[k], source) for k in required}  # before anything is sized from them
        dims.update({k: check_dim(k, cfg[k], source) for k in ("num_key_value_heads", "head_dim",
                                                               "max_position_embeddings") if cfg.get(k) is not None})
        try:
            return cls(
                architecture=arch,
                vocab_size=dims["vocab_size"],
                hidden_size=dims["hidden_size"],
                intermediate_size=dims["intermediate_size"],
                num_hidden_layers=dims["num_hidden_layers"],
                num_attention_heads=dims["num_attention_heads"],
                num_key_value_heads=dims.get("num_key_value_heads"),
                head_dim=dims.get("head_dim"),
                max_position_embeddings=dims.get("max_position_embeddings", 4096),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope=RopeConfig.from_hf(cfg),
                rope_theta=float((cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 1e4))),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=qkvb,
                o_bias=ob,
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_id=cfg.get("eos_token_id"),
                sliding_window=sw,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {exc}") from None

    def to_hf(self) -> dict[str, Any]:
        """A config.json that transformers loads as-is."""
        assert self.rope is not None
        out: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope.theta,
            "rope_parameters": self.rope.to_hf(),
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        }
        if self.architecture in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
            out["attention_bias"] = bool(self.qkv_bias)
        if self.architecture != "LlamaForCausalLM":
            out["sliding_window"] = self.sliding_window
            out["use_sliding_window"] = False
        return out

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra", None)
        return d


@dataclass
class TargetOutput:
    logits: Tensor | None  # [B, T, V] (or [B, 1, V] with logits="last")
    hidden: Tensor  # [B, T, H] final normed hidden state
    taps: dict[int, Tensor]  # tap index -> [B, T, H]


class TargetAttention(nn.Module):
    """Llama/Qwen attention; `in_dim` overrides the input width (EAGLE-3's midlayer reads 2H)."""

    def __init__(self, cfg: TargetConfig, in_dim: int | None = None) -> None:
        super().__init__()
        h, nq, nkv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        assert nkv is not None and d is not None
        self.nq, self.nkv, self.d = nq, nkv, d
        i = in_dim or h
        self.q_proj = nn.Linear(i, nq * d, bias=bool(cfg.qkv_bias))
        self.k_proj = nn.Linear(i, nkv * d, bias=bool(cfg.qkv_bias))
        self.v_proj = nn.Linear(i, nkv * d, bias=bool(cfg.qkv_bias))
        self.o_proj = nn.Linear(nq * d, h, bias=bool(cfg.o_bias))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                cache: KVCache | None, layer: int) -> Tensor:
        """x [B, T, H]; mask bool [B|1, 1, T, S] over [cache[:past] ; new]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nq, self.d)
        k = self.k_proj(x).view(b, t, self.nkv, self.d)
        v = self.v_proj(x).view(b, t, self.nkv, self.d)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q.transpose(1, 2), cos, sin)
        k = apply_rotary(k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)
        if cache is not None:
            k, v = cache.write(layer, k, v)
        out = attention(q, k, v, mask)  # [B, Hq, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.nq * self.d))


class DecoderLayer(nn.Module):
    """A Llama decoder layer. input_norm=False drops input_layernorm (EAGLE-1's first layer reads fc's
    output as is); the state dict then has no such key."""

    def __init__(self, cfg: TargetConfig, *, input_norm: bool = True) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if input_norm else None
        self.self_attn = TargetAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                cache: KVCache | None, layer: int) -> Tensor:
        h = x if self.input_layernorm is None else self.input_layernorm(x)
        x = x + self.self_attn(h, cos, sin, mask, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class TargetModel(nn.Module):
    """HF-compatible decoder-only LM (state_dict keys = HF keys: `model.layers.0.…`, `lm_head.weight`)."""

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        assert cfg.rope is not None and cfg.head_dim is not None
        self.rotary = Rotary(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)

    def new_cache(self, max_len: int, batch: int = 1) -> KVCache:
        """A preallocated cache for `max_len` tokens on this model's device and dtype."""
        c = self.config
        assert c.num_key_value_heads is not None and c.head_dim is not None
        if max_len > c.max_context:
            raise RequestError(f"requested {max_len} tokens but the model's context is {c.max_context} "
                               f"(max_position_embeddings / sliding_window); use a shorter prompt or fewer new tokens")
        w = self.model.embed_tokens.weight  # never quantized or factorised (an lm drafter's lm_head may be)
        cls = Fp8KVCache if getattr(self, "kv_cache_format", "none") == "fp8" else KVCache  # an lm drafter's
        return cls(c.num_hidden_layers, batch, c.num_key_value_heads, max_len, c.head_dim, w.dtype, w.device)

    def forward(
        self,
        input_ids: Tensor,
        *,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
        mask: Tensor | None = None,
        taps: Sequence[int] = (),
        logits: str = "all",
    ) -> TargetOutput:
        """Run T new tokens.

        input_ids [B, T]; positions [B, T] or [T] (default past..past+T-1);
        mask bool [T, past+T] or [B, T, past+T] (default causal), True = may attend;
        cache: written at slots [past, past+T) and advanced by T.
        logits: "all" | "last" | "none".
        """
        b, t = input_ids.shape
        past = cache.reserve(t) if cache is not None else 0
        dev = input_ids.device
        positions = resolve_positions(positions, b, t, past, dev)
        mask4 = resolve_mask(mask, t, past, dev)
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        n_layers = len(self.model.layers)
        tapped: dict[int, Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            if i in taps:
                tapped[i] = x
            x = layer(x, cos, sin, mask4, cache, i)
        hidden = self.model.norm(x)
        if n_layers in taps:
            tapped[n_layers] = hidden
        if cache is not None:
            cache.length = past + t
        out_logits = None
        if logits == "all":
            out_logits = self.lm_head(hidden)
        elif logits == "last":
            out_logits = self.lm_head(hidden[:, -1:])
        return TargetOutput(out_logits, hidden, tapped)


# ----------------------------------------------------------------------------------------------
# Loading and saving (HF directory layout)
# ----------------------------------------------------------------------------------------------


def load_target(path: str | Path, *, dtype: torch.dtype | str = torch.float32,
                device: torch.device | str | None = None) -> TargetModel:
    """Load a local HF-format directory of a supported architecture, checking every tensor."""
    from specpress.device import parse_dtype, pick_device
    from specpress.models.io import check_finite, load_into, read_config, read_weights

    path = Path(path).expanduser()
    cfg = TargetConfig.from_hf(read_config(path), source=str(path / "config.json"))
    weights = read_weights(path)
    check_finite(weights, path)
    stored = _stored_digest(weights, cfg)
    dt = parse_dtype(dtype)
    weights = {k: (v.to(dt) if v.is_floating_point() else v) for k, v in weights.items()}
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = TargetModel(cfg)
    load_into(model, weights, path, optional=("lm_head.weight",) if cfg.tie_word_embeddings else ())
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    elif "lm_head.weight" not in weights:
        raise CheckpointError(f"{path}: missing tensor 'lm_head.weight' (tie_word_embeddings is false)")
    assert cfg.rope is not None and cfg.head_dim is not None
    model.rotary = Rotary(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)
    model.stored_weights_sha256 = stored  # the drafter fingerprint of the weights as stored (drafter.py)
    return model.to(pick_device(None if device is None else str(device))).eval()


def _stored_digest(weights: dict[str, Tensor], cfg: TargetConfig) -> str | None:
    from specpress.models.drafter import head_digest

    head = weights.get("model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight")
    norm = weights.get("model.norm.weight")
    return head_digest(norm, head) if head is not None and norm is not None else None


def target_state_dict(model: TargetModel) -> dict[str, Tensor]:
    """HF keys; a tied lm_head is left out (as transformers saves it)."""
    sd = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def save_target(model: TargetModel, out: str | Path, *, extra_files: Mapping[str, str | bytes] | None = None,
                force: bool = False, dtype: torch.dtype | None = None) -> Path:
    """Write config.json + model.safetensors (+ extra files) atomically; return the directory."""
    from specpress.artifacts import atomic_dir, write_json
    from specpress.models.io import save_weights

    out = Path(out).expanduser()
    sd = target_state_dict(model)
    dt = dtype or model.lm_head.weight.dtype
    sd = {k: v.to(dt) if v.is_floating_point() else v for k, v in sd.items()}
    with atomic_dir(out, force=force) as tmp:
        cfg = model.config.to_hf()
        cfg["torch_dtype"] = str(dt).removeprefix("torch.")
        write_json(tmp / "config.json", cfg)
        save_weights(sd, tmp / "model.safetensors")
        for name, content in (extra_files or {}).items():
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            (target.write_bytes if isinstance(content, bytes) else target.write_text)(content)  # type: ignore[operator]
    return out
