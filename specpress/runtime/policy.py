"""Draft policies, parsed from the strings the CLI and recipes use.

    chain:K                           K draft tokens in a line (EAGLE-1 chain, an independent LM)
    tree:[[0],[1],[0,0],...]          a static tree, TensorRT-LLM / EAGLE `eagle_choices` form: each entry is
                                      the path of sibling ranks from the root ([0,1] = top-2 child of the
                                      top-1 child); vLLM's `speculative_token_tree` tuples work too
    dynamic:depth=D,topk=K,budget=N   EAGLE-2: D drafter expansions of the top-K frontier (paths up to D+1
                                      tokens deep), then the N best draft tokens by cumulative log-prob
    block:B                           DFlash: one pass over a block of B positions = anchor + B-1 drafts
    mtp:K                             DeepSeek-style MTP: K chained draft tokens

No torch here: the CLI validates `--policy` before it loads a model.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import ClassVar, Union

from specpress.errors import UsageError

MAX_DRAFT_TOKENS = 1024  # a verify forward over more nodes than this is a typo, not a policy

GRAMMAR = """a draft policy is one of:
  chain:K                          K chained draft tokens, e.g. chain:4
  tree:CHOICES                     static tree, each entry the path of sibling ranks from the root (prefix-closed),
                                   e.g. tree:[[0],[1],[0,0],[0,1],[0,0,0]]  (vLLM tuples: tree:[(0,),(1,),(0,0)])
  dynamic:depth=D,topk=K,budget=N  EAGLE-2 dynamic tree, e.g. dynamic:depth=5,topk=8,budget=48
  block:B                          DFlash block of B positions (anchor + B-1 drafts), e.g. block:16
  mtp:K                            K chained MTP draft tokens, e.g. mtp:3"""


def _check_int(name: str, value: object, lo: int, hi: int = MAX_DRAFT_TOKENS) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise UsageError(f"{name} must be an integer in [{lo}, {hi}], found {value!r}")


@dataclass(frozen=True)
class _LinePolicy:
    """K draft tokens in a line, each conditioned on the previous one (shared by chain and mtp)."""

    k: int
    kind: ClassVar[str] = ""
    what: ClassVar[str] = ""

    def __post_init__(self) -> None:
        _check_int(self.what, self.k, 1)

    @property
    def num_draft_tokens(self) -> int:
        return self.k

    @property
    def max_depth(self) -> int:
        return self.k

    def __str__(self) -> str:
        return f"{self.kind}:{self.k}"


@dataclass(frozen=True)
class ChainPolicy(_LinePolicy):
    """K draft tokens, each conditioned on the previous one."""

    kind: ClassVar[str] = "chain"
    what: ClassVar[str] = "chain length K"


@dataclass(frozen=True)
class TreePolicy:
    """A static tree. `choices` are root-to-node sibling-rank paths, stored sorted by (length, path)."""

    choices: tuple[tuple[int, ...], ...]
    kind: ClassVar[str] = "tree"

    def __post_init__(self) -> None:
        choices = validate_choices(self.choices)
        object.__setattr__(self, "choices", choices)

    @property
    def num_draft_tokens(self) -> int:
        return len(self.choices)

    @property
    def max_depth(self) -> int:
        return max(len(c) for c in self.choices)

    @property
    def max_topk(self) -> int:
        """How many top-k candidates the drafter must produce at a node (largest rank + 1)."""
        return 1 + max(c[-1] for c in self.choices)

    def __str__(self) -> str:
        return "tree:[" + ",".join("[" + ",".join(map(str, c)) + "]" for c in self.choices) + "]"


@dataclass(frozen=True)
class DynamicPolicy:
    """EAGLE-2's dynamic tree.

    `depth` counts drafter expansions, as EAGLE-2's `depth` does: the tree's paths hold up to depth+1
    draft tokens. `budget` counts draft tokens (the root excluded), as EAGLE's `total_tokens` does.
    """

    depth: int
    topk: int
    budget: int
    kind: ClassVar[str] = "dynamic"

    def __post_init__(self) -> None:
        _check_int("dynamic depth", self.depth, 1, 64)
        _check_int("dynamic topk", self.topk, 1, 64)
        most = min(self.max_candidates, MAX_DRAFT_TOKENS)
        _check_int(f"dynamic budget (at most topk + depth*topk^2 = {self.max_candidates} candidates exist)",
                   self.budget, 1, most)

    @property
    def max_candidates(self) -> int:
        return self.topk + self.depth * self.topk * self.topk

    @property
    def num_draft_tokens(self) -> int:
        return self.budget

    @property
    def max_depth(self) -> int:
        return self.depth + 1

    def __str__(self) -> str:
        return f"dynamic:depth={self.depth},topk={self.topk},budget={self.budget}"


@dataclass(frozen=True)
class BlockPolicy:
    """DFlash: one drafter pass over [anchor, MASK x (B-1)] drafts B-1 tokens."""

    block_size: int
    kind: ClassVar[str] = "block"

    def __post_init__(self) -> None:
        _check_int("block size B (anchor + B-1 drafts)", self.block_size, 2, MAX_DRAFT_TOKENS + 1)

    @property
    def num_draft_tokens(self) -> int:
        return self.block_size - 1

    @property
    def max_depth(self) -> int:
        return self.block_size - 1

    def __str__(self) -> str:
        return f"block:{self.block_size}"


@dataclass(frozen=True)
class MTPPolicy(_LinePolicy):
    """K MTP draft tokens (the MTP module applied K times, chained)."""

    kind: ClassVar[str] = "mtp"
    what: ClassVar[str] = "MTP depth K"


Policy = Union[ChainPolicy, TreePolicy, DynamicPolicy, BlockPolicy, MTPPolicy]


def validate_choices(choices: object) -> tuple[tuple[int, ...], ...]:
    """Check static-tree choices and return them sorted by (length, path).

    Each entry is a non-empty sequence of ranks >= 0; no duplicates; prefix-closed (the parent path of
    every entry is an entry too). Raises UsageError naming the first offending entry.
    """
    if not isinstance(choices, (list, tuple)) or not choices:
        raise UsageError(f"tree choices must be a non-empty list of rank paths, found {choices!r}")
    paths: list[tuple[int, ...]] = []
    for entry in choices:
        if (not isinstance(entry, (list, tuple)) or not entry
                or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in entry)):
            raise UsageError(f"tree choice {entry!r} must be a non-empty list of ranks >= 0, e.g. [0, 1]")
        paths.append(tuple(int(r) for r in entry))
    seen = set(paths)
    if len(seen) != len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise UsageError(f"tree choice {list(dup)} appears more than once")
    for p in paths:
        if len(p) > 1 and p[:-1] not in seen:
            raise UsageError(f"tree choices are not prefix-closed: {list(p)} needs its parent {list(p[:-1])}")
    if len(paths) > MAX_DRAFT_TOKENS:
        raise UsageError(f"a tree of {len(paths)} draft tokens exceeds the limit of {MAX_DRAFT_TOKENS}")
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


def _parse_int(body: str, what: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", body):
        raise UsageError(f"{what} must be a positive integer, found {body!r}")
    return int(body)


def _parse_dynamic(body: str) -> DynamicPolicy:
    allowed = ("depth", "topk", "budget")
    found: dict[str, int] = {}
    for item in body.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise UsageError(f"expected key=value in {item!r}")
        if key not in allowed:
            raise UsageError(f"unknown key {key!r}; allowed: {', '.join(allowed)}")
        if key in found:
            raise UsageError(f"key {key!r} given twice")
        found[key] = _parse_int(value, key)
    missing = [k for k in allowed if k not in found]
    if missing:
        raise UsageError(f"missing {', '.join(missing)}")
    return DynamicPolicy(**found)


def _parse_choices(body: str) -> TreePolicy:
    try:
        value = ast.literal_eval(body.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise UsageError(f"tree choices are not a list literal ({type(exc).__name__})") from None
    return TreePolicy(value)


def parse_policy(text: str | Policy) -> Policy:
    """Parse a policy string (see GRAMMAR); a Policy passes through. Raises UsageError with the grammar."""
    if isinstance(text, (ChainPolicy, TreePolicy, DynamicPolicy, BlockPolicy, MTPPolicy)):
        return text
    if not isinstance(text, str):
        raise UsageError(f"a draft policy is a string, found {type(text).__name__}\n{GRAMMAR}")
    kind, colon, body = text.strip().partition(":")
    kind = kind.strip().lower()
    try:
        if not colon:
            raise UsageError("expected KIND:SPEC")
        if kind == "chain":
            return ChainPolicy(_parse_int(body, "chain length K"))
        if kind == "mtp":
            return MTPPolicy(_parse_int(body, "MTP depth K"))
        if kind == "block":
            return BlockPolicy(_parse_int(body, "block size B"))
        if kind == "dynamic":
            return _parse_dynamic(body)
        if kind == "tree":
            return _parse_choices(body)
        raise UsageError(f"unknown policy kind {kind!r}; known: chain, tree, dynamic, block, mtp")
    except UsageError as exc:
        raise UsageError(f"cannot use draft policy {text!r}: {exc}\n{GRAMMAR}") from None
