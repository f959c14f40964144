"""What a drafter family IS: one registered descriptor per family (models/drafter.py keeps the registry).

Everything outside models/ that depends on the family reads it from here, never from the family's name:

  session         how the runtime drafts with it: "feature" (reads target features, chained steps: eagle,
                  eagle3, mtp), "lm" (an independent LM) or "block" (one pass over a block: dflash)
  policies        the draft policy kinds it runs ("chain", "tree", "dynamic", "mtp", "block"), by name:
                  runtime/ maps the names to its policy classes; default_policy is a policy string
  teacher_forced  its teacher-forced forward (models/forced.py): the one function distillation, importance
                  scoring and quantization calibration run it through
  loss            the name of its distillation loss ("chain", "block", "lm"; compress/losses.py maps names
                  to functions)
  distill         its distillation defaults (DistillDefaults) and the class of the family-only options it takes
                  (a DistillOptions subclass defined in its own module: eagle3's taps, dflash's taps, gamma,
                  markov_rank and tv_weight)
  prunable        the structured pruning stages it supports ("ffn", "heads", "layers", "vocab", and for a
                  family that owns its head "head_rank": a low-rank draft head, and with a reduced draft
                  vocabulary "share_head": the target's head rows instead), its layer stack's module path and
                  the layers that must stay
  student         its fresh student's config for distill: student(shape, spec, target config, teacher config)
  draft_vocab     how it drafts tokens: "target" (through the target's own head), "reduced" (its own head
                  over a subset of the target's vocabulary, mapped by d2t / t2d: eagle3) or "own" (its own
                  embeddings and head over the target's token ids: lm)
  speculators     the speculators model type it is written as (models/formats/speculators.py FORMS: eagle3,
                  dflash), None when speculators has no layout for it (optional; an "lm" session is written as
                  a plain HF decoder instead)
  detection       how a public checkpoint (a config.json without a `specpress` block) is told to be this
                  family (Detection: the architectures it answers to, its telltale config fields and tensor
                  names, its place in the order families are asked); None: only its own artifacts load as it

Adding a family = one file in models/ that defines its config and module and calls register_family with
these traits (see models/eagle.py), `detection` included: drafter_io.detect_family asks the families' rules
and knows none of them. What the serving engines do with it is its serving facet, one module in
export/hf/facets/ (registered from the export layer: models/ imports nothing above it); without one, every
engine refuses it as a family it has no route for.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping

from specpress.errors import ConfigError
from specpress.models.forced import TeacherForced
from specpress.models.target import ARCHITECTURES as DECODERS

if TYPE_CHECKING:
    from specpress.models.drafter import Drafter, DrafterConfig

SESSIONS = ("feature", "lm", "block")
POLICY_KINDS = ("chain", "tree", "dynamic", "mtp", "block")
LOSSES = ("chain", "block", "lm")
PRUNE_STAGES = ("layers", "heads", "ffn", "vocab", "head_rank", "share_head")
DRAFT_VOCABS = ("target", "reduced", "own")
STEP_WEIGHTS = ("decay", "mean")
OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True)
class DistillOptions:
    """The distill options only some families take, held by DistillConfig as `options`; this base takes none.

    A family that takes some subclasses it in its own module (a frozen dataclass, every field defaulted to
    "not set", values checked in __post_init__ with a ConfigError naming the field) and names the class in its
    DistillDefaults(options=...). DistillConfig's record (to_dict) writes the fields flat beside its own, and
    an option given to a family whose class lacks it is refused naming the families that take it.
    """

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def student_spec(self) -> dict[str, Any]:
        """What these options ask of distill's fresh student: their fields that are StudentSpec fields."""
        spec = {f.name for f in fields(StudentSpec)}
        return {n: getattr(self, n) for n in self.names() if n in spec}


def positive_option(name: str, v: Any, *, integer: bool = False) -> None:
    """Refuse an option that is set (not None) and not a positive number (with `integer`, a positive int)."""
    if v is None:
        return
    kind = int if integer else (int, float)
    if not isinstance(v, kind) or isinstance(v, bool) or not v > 0:
        raise ConfigError(f"distill config field {name!r} must be a positive {'integer' if integer else 'number'}, "
                          f"found {v!r}")


@dataclass(frozen=True)
class DistillDefaults:
    """How `distill` trains the family unless told otherwise.

    lr / optimizer / grad_clip: the defaults; ttt_steps: unrolled draft steps of the chain loss (None = one
    per draft module, read from the drafter or --layers); step_weights: weight of unrolled step i, "decay"
    (step_decay^i, EAGLE-3) or "mean" (1/K, DeepSeek's MTP); feature_regression: each step also regresses the
    target's next feature (feature_weight SmoothL1 + ce_weight CE, feature noise on the inputs: EAGLE-1); options: the class of the
    family-only options it takes (DistillOptions: none). published: what the defaults follow (paper or reference code); measured: flags measured
    better than the defaults on the zoo (BENCHMARKS.md), and `regenerate`: the target-regenerated data
    they were measured on (RegenConfig fields), {} when the defaults are the best known.
    """

    lr: float = 1e-3
    optimizer: str = "adamw"
    grad_clip: float = 1.0
    ttt_steps: int | None = 1
    step_weights: str = "decay"
    feature_regression: bool = False
    options: type[DistillOptions] = DistillOptions
    published: str = ""
    measured: Mapping[str, Any] = field(default_factory=dict)
    regenerate: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"distill optimizer {self.optimizer!r}: must be one of {', '.join(OPTIMIZERS)}")
        if self.step_weights not in STEP_WEIGHTS:
            raise ValueError(f"step_weights {self.step_weights!r}: must be one of {', '.join(STEP_WEIGHTS)}")
        opts = self.options
        if not (isinstance(opts, type) and issubclass(opts, DistillOptions)
                and getattr(opts, "__dataclass_params__", None) is not None and opts.__dataclass_params__.frozen):
            raise ValueError(f"distill options {opts!r}: must be a frozen dataclass subclassing DistillOptions")


@dataclass(frozen=True)
class StudentSpec:
    """What distill asks of a fresh student beyond the shared layer shape (None = the family's default).

    shape (the other argument of Family.student): vocab_size, hidden_size, intermediate_size,
    num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, max_position_embeddings, rope.
    """

    layers: int | None = None
    draft_vocab: int | None = None
    taps: tuple[int, ...] | None = None
    block_size: int = 8
    mask_token_id: int | None = None
    markov_rank: int | None = None


@dataclass(frozen=True)
class Detection:
    """How a public checkpoint (a config.json without a `specpress` block) is told to be this family.

    drafter_io.detect_family asks the families that have a rule in `priority` order (lowest first; no two
    alike) and the first that claims the config wins. A rule claims a config whose first architecture `arch`
    ("" when none) is one of `architectures`; else, when it names `weights` and the checkpoint's tensor names
    are known (non-empty), one whose tensors include one of them (the tensors decide, its fields are not
    read); else one that holds one of the telltale config `fields` - with `fields_need_decoder`, only if
    `arch` is "" or a supported target decoder's (models/target.py ARCHITECTURES: the same field beside an
    unknown name is some other model). `decoder`: it also claims any supported target decoder, by
    architecture or model_type (a plain HF LM).
    """

    priority: int
    architectures: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    fields_need_decoder: bool = False
    weights: tuple[str, ...] = ()
    decoder: bool = False

    def __post_init__(self) -> None:
        if not (self.architectures or self.fields or self.weights or self.decoder):
            raise ValueError("a detection rule must name architectures, fields or weights, or claim decoders")
        if self.fields_need_decoder and not self.fields:
            raise ValueError("fields_need_decoder without telltale fields")

    def claims(self, cfg: Mapping[str, Any], arch: Any, weight_names: Collection[str] | None) -> bool:
        """Whether a config.json whose first architecture is `arch` ("" when none) is this family's."""
        if arch in self.architectures:
            return True
        if self.weights and weight_names:  # the tensor names are known: they decide, not the config fields
            if any(w in weight_names for w in self.weights):
                return True
        elif any(f in cfg for f in self.fields) and (not self.fields_need_decoder or not arch or arch in DECODERS):
            return True
        return self.decoder and (arch in DECODERS or cfg.get("model_type") in {v[0] for v in DECODERS.values()})

    def known_architectures(self) -> set[str]:
        """The architecture names this rule answers to (for the message when no family claims a config)."""
        return {*self.architectures, *(DECODERS if self.decoder else ())}


StudentFn = Callable[[Mapping[str, Any], StudentSpec, Any, Any], "DrafterConfig"]  # (shape, spec, target cfg, teacher cfg)


@dataclass(frozen=True)
class Family:
    """One drafter family: how it is stored (config, module, reader, writer) and what it is (the traits)."""

    name: str
    config_cls: type["DrafterConfig"]
    model_cls: type["Drafter"]
    reader: Callable[[Mapping[str, Any], str], "DrafterConfig"]  # public config.json -> config
    writer: Callable[[Any], dict[str, Any]]  # config -> public config.json (without the specpress block)
    session: str
    policies: tuple[str, ...]
    default_policy: str
    teacher_forced: TeacherForced
    loss: str
    distill: DistillDefaults
    prunable: tuple[str, ...]
    draft_vocab: str
    student: StudentFn
    layer_stack: str | None = None  # module path of its layer stack (when "layers" is prunable)
    pinned_layers: tuple[int, ...] = ()  # layers of the stack pruning must keep
    note: str = ""  # why a stage is not prunable, shown with the error
    speculators: str | None = None  # the speculators model type it is written as (None: no speculators layout)
    detection: Detection | None = None  # how a public checkpoint is told to be this family (None: never)

    def __post_init__(self) -> None:
        checks = (("session", (self.session,), SESSIONS), ("policies", self.policies, POLICY_KINDS),
                  ("loss", (self.loss,), LOSSES), ("prunable", self.prunable, PRUNE_STAGES),
                  ("draft_vocab", (self.draft_vocab,), DRAFT_VOCABS))
        for what, values, known in checks:
            bad = [v for v in values if v not in known]
            if bad or not values:
                raise ValueError(f"family {self.name!r}: {what} {list(values)} must be among {', '.join(known)}")
        kind = self.default_policy.partition(":")[0]
        if kind not in self.policies:
            raise ValueError(f"family {self.name!r}: default_policy {self.default_policy!r} is not one of its "
                             f"policy kinds {list(self.policies)}")
        if ("layers" in self.prunable) != (self.layer_stack is not None):
            raise ValueError(f"family {self.name!r}: give layer_stack exactly when 'layers' is prunable")
        if ("vocab" in self.prunable) != (self.draft_vocab == "reduced"):
            raise ValueError(f"family {self.name!r}: draft-vocabulary pruning needs draft_vocab 'reduced'")
        if "share_head" in self.prunable and self.draft_vocab != "reduced":
            raise ValueError(f"family {self.name!r}: sharing the target's head rows needs draft_vocab 'reduced'")
        if "head_rank" in self.prunable and self.draft_vocab == "target":
            raise ValueError(f"family {self.name!r}: a low-rank head needs a head of its own (draft_vocab 'reduced' "
                             f"or 'own'); it drafts through the target's")
        if self.speculators is not None:
            from specpress.models.formats.speculators import FORMS

            if self.speculators not in FORMS:
                raise ValueError(f"family {self.name!r}: speculators {self.speculators!r} must be among "
                                 f"{', '.join(FORMS)} (or None)")
        for what in ("teacher_forced", "student"):
            if not callable(getattr(self, what)):
                raise ValueError(f"family {self.name!r}: {what} must be a function")

    def takes(self, option: str) -> bool:
        """Whether distill's family-only `option` (a field of its DistillOptions class) applies to this family."""
        return option in self.distill.options.names()


STORAGE = ("name", "config_cls", "model_cls", "reader", "writer")
TRAITS = tuple(f.name for f in fields(Family) if f.name not in STORAGE)
REQUIRED_TRAITS = ("session", "policies", "default_policy", "teacher_forced", "loss", "distill", "prunable",
                   "draft_vocab", "student")
