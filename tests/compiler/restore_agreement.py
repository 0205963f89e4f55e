"""The text restore against the libcst restore (its reference), for the golden and corpus tests.

A plain module, so that the corpus check's spawned workers import it by name, as they do ``corpus_check``.
"""

from __future__ import annotations

from typing import List

from msprobe_rewrite import text_restore
from msprobe_rewrite.api import restore_report, restore_report_cst


def restore_disagreement(out: bytes, path: str, may_fall_back: bool = False) -> List[str]:
    """What is wrong with the text restore of ``out`` (``text_restore``): a result other than the libcst
    restore's (bytes and notes), or, unless ``may_fall_back`` (input Python's own parser rejects), a fall back
    to libcst, which the rewrite's own output never needs."""
    before = sum(text_restore.FALLBACKS.values())
    try:
        text, reference = restore_report(out, path), restore_report_cst(out, path)
    except Exception as error:
        return [f"a restore crashed: {type(error).__name__}: {error}"]
    problems = []
    if sum(text_restore.FALLBACKS.values()) != before and not may_fall_back:
        problems.append(f"the text restore fell back to libcst: {sorted(text_restore.FALLBACKS)}")
    if text != reference:
        problems.append(
            "the text restore differs from the libcst restore"
            + (
                first_difference(text[0], reference[0])
                if text[0] != reference[0]
                else f": notes {text[1]} != {reference[1]}"
            )
        )
    return problems


def first_difference(got: bytes, want: bytes) -> str:
    """Where ``got`` first differs from ``want``, as a suffix for a message."""
    got_lines, want_lines = got.splitlines(True), want.splitlines(True)
    for number, (a, b) in enumerate(zip(got_lines, want_lines), 1):
        if a != b:
            return f" (line {number}: {b!r} came back as {a!r})"
    return f" ({len(want_lines)} lines came back as {len(got_lines)})"
