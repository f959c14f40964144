"""The `speculators` checkpoint layout (what vLLM loads for `--speculative-config '{"model": DIR}'`), both ways.

config.json (speculators 0.9 `SpeculatorModelConfig` subclasses):
    speculators_model_type      "eagle3" | "dflash"
    speculators_version         the release this layout was checked against
    speculators_config          {algorithm, proposal_methods: [{proposal_type: "greedy", speculative_tokens,
                                 verifier_accept_k: 1, accept_tolerance: 0.0}], default_proposal_method:
                                 "greedy", verifier: {name_or_path, architectures}}
    transformer_layer_config    the draft layers as an HF config (eagle3: llama; dflash: qwen3)
    eagle3: draft_vocab_size, target_hidden_size, norm_before_residual (false: the residual is the raw
            fused feature), norm_before_fc / fc_norm / norm_output (false), eagle_aux_hidden_state_layer_ids;
            transformer_layer_config.eagle_config (the public layout's: vLLM counts `fc`'s taps from its list)
    dflash: draft_vocab_size (= the target vocab), block_size, target_hidden_size, mask_token_id,
            aux_hidden_state_layer_ids, sliding_window_non_causal / sample_from_anchor (false)

Tap ids: speculators (and vLLM) name the residual stream ENTERING layer j, i.e. HF hidden_states[j]
(its default eagle3 taps are [2, L//2, L-3]; its DFlash converter maps z-lab's target_layer_ids t to
t + 1). specpress's taps are hidden_states indices too, so eagle3 writes them unchanged and DFlash writes
target_layer_ids + 1. A DFlash tap on the target's LAST layer output (hidden_states[L]) enters no layer:
vLLM cannot tap it, so such a drafter is refused.

Weights: eagle3 `midlayer.*` -> `layers.0.*` (fc, norm, lm_head, d2t, t2d unchanged; d2t/t2d dropped
when the draft vocab is the full vocab, where speculators keeps no mapping) plus the verifier's
`embed_tokens.weight` (speculators' own eagle3 checkpoints keep it, and its Eagle3DraftModel reads it:
without it the embedding is whatever memory transformers allocated); dflash unchanged plus the
verifier's `lm_head.weight` (speculators' DFlash stores it). The specpress block rides along (speculators
configs allow extra fields) so provenance and the target fingerprint survive the round trip.

Each speculators model type specpress writes is one `Form` below (FORMS, keyed by speculators' own names); a
family says which one it is written as with its descriptor's `speculators` trait (models/family.py), so
nothing here asks for a family by name.

speculators cannot hold: eagle (EAGLE-1), mtp (its MTP layer is Qwen3-Next style: one module, Qwen3
blocks only, and it feeds the final-normed hidden back at chained steps where specpress's DeepSeek-style
module feeds the pre-norm hidden, so steps 2.. would compute something else), DFlash with a Markov head
(DSpark's head has no place in speculators' DFlash layout).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from specpress.errors import ConfigError

SPECULATORS_VERSION = "0.9.0"
# Fields speculators' own configs define, per model type (besides the shared ones below).
SHARED_FIELDS = ("architectures", "speculators_model_type", "speculators_version", "speculators_config",
                 "transformer_layer_config")
# What transformers' PretrainedConfig.save_pretrained adds, plus ours: accepted and ignored on reading.
BOILERPLATE = ("torch_dtype", "dtype", "transformers_version", "_name_or_path", "quantization_config", "specpress",
               "model_type", "use_cache", "tie_word_embeddings", "return_dict", "output_hidden_states",
               "output_attentions", "pad_token_id", "bos_token_id", "eos_token_id", "id2label", "label2id")


@dataclass(frozen=True)
class Form:
    """One speculators model type, both ways.

    architecture / layer_model_type: its speculators class and transformer_layer_config's model_type;
    fields: the config fields its speculators config defines; write(config, public, tlc) -> its own fields
    (tlc, the layer config, edited in place); read(cfg, tlc, source, num_target_layers) -> the public config;
    renames: (public prefix, speculators prefix) of its layer keys; identity_maps_dropped: d2t / t2d are left out
    when the draft vocabulary is the full one; verifier_tensor: the verifier tensor its checkpoints store
    ("embed_tokens" | "lm_head"); residual_taps: its tap ids name the residual entering a layer as they are
    written (a tap on the last layer's output has none)."""

    model_type: str
    architecture: str
    layer_model_type: str
    fields: tuple[str, ...]
    write: Callable[[Any, Mapping[str, Any], dict[str, Any]], dict[str, Any]]
    read: Callable[[Mapping[str, Any], dict[str, Any], str, int | None], dict[str, Any]]
    verifier_tensor: str
    renames: tuple[str, str] | None = None
    identity_maps_dropped: bool = False
    residual_taps: bool = False

    def rename_out(self, name: str) -> str:
        if self.renames is not None and name.startswith(self.renames[0]):
            return self.renames[1] + name[len(self.renames[0]):]
        return name

    def rename_in(self, name: str) -> str:
        if self.renames is not None and name.startswith(self.renames[1]):
            return self.renames[0] + name[len(self.renames[1]):]
        return name


def _write_eagle3(config: Any, public: Mapping[str, Any], tlc: dict[str, Any]) -> dict[str, Any]:
    taps = config.target_layer_ids
    # vLLM builds the drafter's hf_config from transformer_layer_config (transformers_utils/configs/
    # speculators/base.py) and counts the taps `fc` fuses from eagle_config's list (3 when absent)
    tlc["eagle_config"] = dict(public["eagle_config"])
    out: dict[str, Any] = {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False,
                           "norm_output": False,
                           "eagle_aux_hidden_state_layer_ids": None if taps is None else list(taps)}
    if config.shared_head:  # no lm_head tensor: the engines share the target's (export/hf/heads.py); ours
        out["shared_head"] = True  # reads it back as the shared head it is
    return out


def _write_dflash(config: Any, public: Mapping[str, Any], tlc: dict[str, Any]) -> dict[str, Any]:
    tlc["layer_types"] = ["full_attention"] * config.num_hidden_layers
    out = {"block_size": config.block_size, "mask_token_id": config.mask_token_id,
           "aux_hidden_state_layer_ids": [i + 1 for i in config.target_layer_ids],
           "sliding_window_non_causal": False, "sample_from_anchor": False}
    last = [i for i in config.target_layer_ids if i + 1 >= config.num_target_layers]
    if last:
        raise ConfigError(f"this dflash drafter reads the output of the target's last layer ({last}); "
                          f"speculators/vLLM tap the residual entering a layer (ids < "
                          f"{config.num_target_layers}), which cannot express it")
    return out


def _read_eagle3(cfg: Mapping[str, Any], tlc: dict[str, Any], source: str,
                 num_target_layers: int | None) -> dict[str, Any]:
    out: dict[str, Any] = dict(tlc)  # its eagle_config (written for vLLM) is the public layout's
    if int(tlc.get("num_hidden_layers", 1)) != 1:
        raise ConfigError(f"{source}: eagle3 with {tlc.get('num_hidden_layers')} layers; specpress reads one")
    out.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
               draft_vocab_size=cfg.get("draft_vocab_size", 32000),
               target_hidden_size=cfg.get("target_hidden_size"), shared_head=bool(cfg.get("shared_head")))
    if cfg.get("eagle_aux_hidden_state_layer_ids") is not None:
        out["eagle_aux_hidden_state_layer_ids"] = list(cfg["eagle_aux_hidden_state_layer_ids"])
    return out


def _read_dflash(cfg: Mapping[str, Any], tlc: dict[str, Any], source: str,
                 num_target_layers: int | None) -> dict[str, Any]:
    out: dict[str, Any] = dict(tlc)
    if cfg.get("draft_vocab_size", tlc.get("vocab_size")) != tlc.get("vocab_size"):
        raise ConfigError(f"{source}: a dflash drafter with a reduced draft vocabulary "
                          f"({cfg.get('draft_vocab_size')} of {tlc.get('vocab_size')}) is not computed by specpress")
    if num_target_layers is None:
        raise ConfigError(f"{source}: a speculators dflash config does not say how many layers the target has; "
                          f"this one has no specpress block and its verifier is not a local directory. Put the "
                          f"target's config.json at speculators_config.verifier.name_or_path")
    aux = cfg.get("aux_hidden_state_layer_ids")
    out.update(architectures=["DFlashDraftModel"], block_size=cfg.get("block_size", 8),
               num_target_layers=num_target_layers,
               dflash_config={"mask_token_id": cfg.get("mask_token_id"),
                              "target_layer_ids": None if aux is None else [int(i) - 1 for i in aux]})
    return out


FORMS: dict[str, Form] = {
    "eagle3": Form("eagle3", "Eagle3Speculator", "llama",
                   ("draft_vocab_size", "norm_before_residual", "target_hidden_size",
                    "eagle_aux_hidden_state_layer_ids", "norm_before_fc", "fc_norm", "norm_output",
                    "embed_requires_grad", "shared_head"),
                   _write_eagle3, _read_eagle3, verifier_tensor="embed_tokens", renames=("midlayer.", "layers.0."),
                   identity_maps_dropped=True, residual_taps=True),
    "dflash": Form("dflash", "DFlashSpeculator", "qwen3",
                   ("draft_vocab_size", "block_size", "target_hidden_size", "aux_hidden_state_layer_ids",
                    "mask_token_id", "sliding_window_non_causal", "sample_from_anchor"),
                   _write_dflash, _read_dflash, verifier_tensor="lm_head"),
}


def form_of(family: str) -> Form | None:
    """The speculators form drafter family `family` is written as (its descriptor's `speculators`), or None."""
    from specpress.models.drafter import get_family

    mtype = get_family(family).speculators
    return None if mtype is None else FORMS[mtype]


def family_of(model_type: str) -> str:
    """The drafter family written as speculators model type `model_type`."""
    from specpress.models.drafter import families_where

    return families_where(lambda f: f.speculators == model_type)[0]


def cannot_hold(family: str, config: Any) -> str | None:
    """Why speculators cannot hold this drafter (None when it can; an independent LM is written as a plain HF
    decoder instead)."""
    from specpress.models.drafter import get_family

    if get_family(family).session == "lm":
        return None
    form = form_of(family)
    if form is None:
        return (f"speculators has no layout for specpress's {family!r} drafters (it holds {' and '.join(FORMS)}; "
                f"its mtp is a Qwen3-Next-style module whose chained steps feed back the final-normed hidden, "
                f"unlike specpress's DeepSeek-style mtp); export the public layout instead")
    if getattr(config, "markov_rank", None):
        return (f"speculators' {form.model_type} layout has no place for a Markov head (markov_rank "
                f"{config.markov_rank}); export the public layout instead")
    return None


def check_taps(family: str, config: Any, num_target_layers: int | None) -> None:
    """Refuse an eagle3 tap vLLM cannot reproduce: hidden_states[L] (the last layer's output) is taken after
    the final norm here, while vLLM takes tap j as the residual stream after j layers, hidden + residual before
    any norm, j = L included (vLLM 0.34 model_executor/models/llama.py LlamaModel.forward with
    model_executor/models/interfaces.py _maybe_add_hidden_state, aux_hidden_state_layers)."""
    form = form_of(family)
    taps = getattr(config, "target_layer_ids", None) if form is not None and form.residual_taps else None
    n = getattr(config, "num_target_layers", None) or num_target_layers
    if taps is None or n is None or max(taps) < n:
        return
    raise ConfigError(f"this {family} drafter taps hidden_states[{n}], the target's last layer output, which "
                      f"specpress takes after the final norm; vLLM takes tap {n} before the final norm (the residual "
                      f"stream after {n} layers), so it would feed this drafter another feature. Re-distill it with "
                      f"taps below {n}")


def proposal(tokens: int) -> dict[str, Any]:
    return {"proposal_type": "greedy", "speculative_tokens": int(tokens), "verifier_accept_k": 1,
            "accept_tolerance": 0.0}


def build_config(family: str, config: Any, public: Mapping[str, Any], verifier: Mapping[str, Any],
                 tokens: int) -> dict[str, Any]:
    """config.json of the speculators layout. public: the family's public config.json (fam.writer)."""
    from specpress.models.drafter import get_family

    form = form_of(family)
    assert form is not None, family  # cannot_hold refused it before
    reduced = get_family(family).draft_vocab == "reduced"  # its own head over a subset of the vocabulary
    layer_keys = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta",
                  "rope_parameters", "attention_bias", "attention_dropout", "num_hidden_layers")
    tlc = {k: public[k] for k in layer_keys if k in public}
    tlc.update(model_type=form.layer_model_type, mlp_bias=False, tie_word_embeddings=False)
    if "torch_dtype" in public:
        tlc["torch_dtype"] = public["torch_dtype"]
    out: dict[str, Any] = {
        "architectures": [form.architecture],
        "speculators_model_type": form.model_type,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {"algorithm": form.model_type, "proposal_methods": [proposal(tokens)],
                               "default_proposal_method": "greedy", "verifier": dict(verifier)},
        "transformer_layer_config": tlc,
        "draft_vocab_size": config.draft_vocab_size if reduced else config.vocab_size,
        "target_hidden_size": getattr(config, "target_hidden_size", None) or config.hidden_size,
    }
    out.update(form.write(config, public, tlc))
    return out


# Linears speculators' own model builds that no checkpoint stores (speculators 0.9.0 model.py DraftVocabMixin:
# the verifier's head, loaded from the verifier at from_pretrained): a compressed-tensors config must ignore
# them, or transformers' loader quantizes the empty Linear and load_verifier_weights finds no `weight`.
MODEL_ONLY_LINEARS = ("verifier_lm_head",)


def model_only_linears(family: str) -> tuple[str, ...]:
    return MODEL_ONLY_LINEARS if form_of(family) is not None else ()


def rename_out(family: str, name: str) -> str:
    """specpress public key -> speculators key."""
    form = form_of(family)
    return name if form is None else form.rename_out(name)


def rename_in(model_type: str, name: str) -> str:
    """speculators key -> specpress public key."""
    form = FORMS.get(model_type)
    return name if form is None else form.rename_in(name)


def drop_on_write(family: str, config: Any, name: str) -> bool:
    """Tensors speculators keeps no place for: eagle3's identity vocab maps."""
    form = form_of(family)
    return (form is not None and form.identity_maps_dropped and config.draft_vocab_size == config.vocab_size
            and name in ("d2t", "t2d"))


def check_fields(cfg: Mapping[str, Any], source: str) -> str:
    """The speculators model type of `cfg`; unknown or unsupported fields are ConfigErrors."""
    mtype = cfg.get("speculators_model_type")
    if mtype not in FORMS:
        raise ConfigError(f"{source}: speculators_model_type {mtype!r} is not read by specpress (it reads "
                          f"{', '.join(FORMS)})")
    allowed = set(SHARED_FIELDS) | set(FORMS[mtype].fields) | set(BOILERPLATE)
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {', '.join(unknown)} in a speculators {mtype} config; "
                          f"known: {', '.join(sorted(allowed))}")
    sc = cfg.get("speculators_config")
    if not isinstance(sc, Mapping) or not isinstance(sc.get("verifier"), Mapping):
        raise ConfigError(f"{source}: speculators_config.verifier {{name_or_path, architectures}} is missing")
    tlc = cfg.get("transformer_layer_config")
    if not isinstance(tlc, Mapping):
        raise ConfigError(f"{source}: transformer_layer_config must be an object (the draft layers' HF config)")
    for flag in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "sample_from_anchor",
                 "sliding_window_non_causal"):
        if cfg.get(flag):
            raise ConfigError(f"{source}: {flag} = true is a variant specpress does not compute (only false)")
    return str(mtype)


def to_public_config(cfg: Mapping[str, Any], source: str, num_target_layers: int | None) -> dict[str, Any]:
    """A speculators config.json -> the family's public config.json that specpress's readers parse."""
    mtype = check_fields(cfg, source)
    form = FORMS[mtype]
    tlc = dict(cfg["transformer_layer_config"])
    want = form.layer_model_type
    if tlc.get("model_type", want) != want:
        raise ConfigError(f"{source}: a {mtype} transformer_layer_config of model_type {tlc.get('model_type')!r} "
                          f"is not computed by specpress (only {want!r})")
    tlc.pop("model_type", None)
    return form.read(cfg, tlc, source, num_target_layers)


def to_public_weights(model_type: str, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """speculators tensors -> specpress public keys (shared embed/head are dropped later by the loader;
    speculators' verifier_* copies are never specpress's)."""
    return {rename_in(model_type, k): v for k, v in weights.items() if not k.startswith("verifier_")}


def verifier_block(name_or_path: str, architectures: list[str]) -> dict[str, Any]:
    return {"name_or_path": name_or_path, "architectures": list(architectures)}
