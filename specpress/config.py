"""Strict loading shared by every frozen, versioned config dataclass (drafters, distill, prune, quantize,
recipes): a newer version or an unknown key is an error that says what is allowed."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Collection, Mapping

from specpress.errors import ConfigError


def config_kwargs(cls: type, d: Mapping[str, Any], what: str,
                  allowed: Collection[str] | None = None) -> dict[str, Any]:
    """`d` minus its "version" (checked against `cls.version`), with every key a field of `cls` (or one of
    `allowed` when given: a config whose record holds more than its fields)."""
    d = dict(d)
    ver = d.pop("version", cls.version)  # type: ignore[attr-defined]
    if ver != cls.version:  # type: ignore[attr-defined]
        raise ConfigError(f"{what} version {ver} is not readable; this specpress reads version "
                          f"{cls.version}")  # type: ignore[attr-defined]
    allowed = set(allowed) if allowed is not None else {f.name for f in fields(cls)}
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(map(repr, unknown))} in {what}; "
                          f"allowed: {', '.join(sorted(allowed))}")
    return d
