"""``# msprobe: noqa[CODE, ...]`` (or a bare ``# msprobe: noqa``) on a finding's line suppresses it.

Codes are exact, as in ruff's ``# noqa: CODE``. The comment is found with a regular expression on the
finding's line rather than with the tokenizer: only lines that have a finding are read, and a string
literal that happens to spell the marker is not worth a second pass over every file.
"""

from __future__ import annotations

import re
from typing import FrozenSet, List, Optional

NOQA = re.compile(r"#\s*msprobe:\s*noqa(?:\[(?P<codes>[^\]]*)\])?", re.IGNORECASE)


def suppressed_codes(line: str) -> Optional[FrozenSet[str]]:
    """None: no marker on the line; an empty set: a bare marker (every code); else the codes named."""
    codes: set = set()
    found = False
    for match in NOQA.finditer(line):
        found = True
        if match.group("codes") is None:
            return frozenset()
        codes.update(code.strip().upper() for code in re.split(r"[,\s]+", match.group("codes")) if code.strip())
    return frozenset(codes) if found else None


def is_suppressed(lines: List[str], line_number: int, code: str) -> bool:
    if not 1 <= line_number <= len(lines):
        return False
    codes = suppressed_codes(lines[line_number - 1])
    return codes is not None and (not codes or code in codes)
