"""Printing findings: ``path:line:col: CODE message`` (what editors and CI annotators parse), JSON in the
shape of ruff's ``--output-format json``, and ``--statistics`` counts by rule."""

from __future__ import annotations

import collections
import json
from typing import IO, List, Sequence

from .checker import Finding
from .rules import RULES


def write_text(findings: Sequence[Finding], stream: IO[str]) -> None:
    for finding in findings:
        stream.write(f"{finding.path}:{finding.line}:{finding.column}: {finding.code} {finding.message}\n")


def as_json(finding: Finding) -> dict:
    return {
        "code": finding.code,
        "name": RULES[finding.code].name,
        "message": finding.message,
        "filename": finding.path,
        "location": {"row": finding.line, "column": finding.column},
        "end_location": {"row": finding.end_line, "column": finding.end_column},
        "noqa_row": finding.line,
    }


def write_json(findings: Sequence[Finding], stream: IO[str]) -> None:
    json.dump([as_json(f) for f in findings], stream, indent=2, ensure_ascii=False)
    stream.write("\n")


def statistics(findings: Sequence[Finding]) -> List[dict]:
    """Counts by rule, most frequent first (ties by code)."""
    counts = collections.Counter(f.code for f in findings)
    return [
        {"code": code, "name": RULES[code].name, "count": count}
        for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]


def write_statistics(findings: Sequence[Finding], stream: IO[str], as_json_format: bool = False) -> None:
    rows = statistics(findings)
    if as_json_format:
        json.dump(rows, stream, indent=2)
        stream.write("\n")
        return
    for row in rows:
        stream.write(f"{row['count']:>7}\t{row['code']}\t{row['name']}\n")
