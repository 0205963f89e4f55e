"""The lint's rules, and ruff-style selection among them (``--select``, ``--extend-select``, ``--ignore``).

A selector is ``ALL`` or a prefix of codes (``MSP``, ``MSP00``, ``MSP003``). When several selectors match a
code the longest one decides, and an ``--ignore`` beats a ``--select`` of the same length, as in ruff.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, Optional


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    default: bool  # enabled without --select
    summary: str


RULES: Dict[str, Rule] = {
    rule.code: rule
    for rule in (
        Rule(
            "MSP001",
            "getattr-api",
            True,
            "an API fetched with getattr() from a catalogued namespace: no static name, only run-time identity",
        ),
        Rule(
            "MSP002",
            "star-import-api",
            True,
            "a star import from a catalogued module: its names, and every builtin after it, resolve only at run time",
        ),
        Rule(
            "MSP003",
            "api-in-kernel",
            True,
            "a catalogued API called in a JIT/kernel-decorated body, which is never instrumented: not recorded",
        ),
        Rule(
            "MSP004",
            "api-in-container",
            True,
            "an API stored in a container at import time and reached through it: no static name",
        ),
        # Informational and off by default: most of these are module calls and Tensor methods, which the
        # runtime's identity check handles; the count says how much of a file relies on that check.
        Rule(
            "MSP901",
            "unresolved-call",
            False,
            "a call the resolver could not resolve, in a file that imports torch (informational)",
        ),
    )
}


class RuleSelectionError(ValueError):
    """A selector that matches no rule (a typo would otherwise silently turn a check off)."""


def _matches(selector: str, code: str) -> bool:
    return selector == "ALL" or code.startswith(selector)


def _weight(selector: str) -> int:
    return 0 if selector == "ALL" else len(selector)


def enabled_codes(
    select: Optional[Iterable[str]] = None, ignore: Iterable[str] = (), extend_select: Iterable[str] = ()
) -> FrozenSet[str]:
    """The codes that are on. ``select=None`` starts from the defaults; a given ``select`` replaces them."""
    chosen = None if select is None else [s.strip().upper() for s in select if s.strip()]
    ignore = [s.strip().upper() for s in ignore if s.strip()]
    extra = [s.strip().upper() for s in extend_select if s.strip()]
    for selector in (chosen or []) + ignore + extra:
        if not any(_matches(selector, code) for code in RULES):
            raise RuleSelectionError(f"unknown rule selector {selector!r}; rules: {', '.join(RULES)}")
    on = set()
    for code, rule in RULES.items():
        weight, state = -1, rule.default if chosen is None else False
        for selector in (chosen or []) + extra:
            if _matches(selector, code) and _weight(selector) > weight:
                weight, state = _weight(selector), True
        for selector in ignore:
            if _matches(selector, code) and _weight(selector) >= weight:
                weight, state = _weight(selector), False
        if state:
            on.add(code)
    return frozenset(on)


def split_selectors(values: Iterable[str]) -> list:
    """``--select A,B --select C`` -> ``[A, B, C]``."""
    return [part for value in values for part in value.split(",") if part.strip()]
