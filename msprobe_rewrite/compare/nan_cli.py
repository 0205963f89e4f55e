"""The command line of ``msprobe-rewrite nan DUMP``: where did the NaN (or Inf) start?

Exit status: 0 no NaN/Inf in any dump, 1 found (like a check that reports), 2 an error (a missing path, an
unreadable or malformed dump.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, Sequence

from .errors import CompareError
from .nan_origin import find_origin
from .summary import strict_json
from ..progress import Progress

PROG = "msprobe-rewrite nan"
SHORT = {
    "made": "made here (inputs finite)",
    "received": "already in its inputs",
    "gradient": "in a parameter gradient",
}
HOW = {
    "made": "made here: its inputs are finite, its output is not",
    "received": "already in its inputs: made by code the dump does not record (or by another rank)",
    "gradient": "a parameter gradient: made by a backward the dump does not record",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Name where NaN or Inf started in one run's dump (no second run needed): per step and "
        "rank, the first entry in execution order that holds one, and whether it made it (finite "
        "inputs, non-finite output) or received it; across the run, the earliest step and, within "
        "it, the rank that made it before a collective (Distributed.*) spread it to the others. "
        "As msprobe's overflow_check, from an ordinary statistics or tensor dump (ours or msprobe's).",
        epilog="DUMP is a dump directory (step*/rank*/ or step*/proc*/), a step directory, a rank directory "
        "or a dump.json. Exit status: 0 no NaN/Inf, 1 NaN/Inf found, 2 error (a missing path, an unreadable or "
        "malformed dump.json).",
    )
    parser.add_argument("dump", metavar="DUMP")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object instead")
    parser.add_argument(
        "--top",
        type=int,
        default=20,
        metavar="N",
        help="dumps listed with their first NaN/Inf (20; the origin is always shown)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return parser


def _where(dump: Dict[str, Any]) -> str:
    parts = []
    if dump.get("step") is not None:
        parts.append(f"step {dump['step']}")
    # a single process writes proc{pid}: its label's last part names it
    parts.append(f"rank {dump['rank']}" if dump.get("rank") is not None else dump["label"].rsplit("/", 1)[-1])
    return ", ".join(parts)


def _tensors(items: List[Dict[str, Any]]) -> str:
    out = []
    for item in items[:4]:
        numbers = " ".join(f"{key}={item[key]}" for key in ("Max", "Min", "NaN_count", "Inf_count") if key in item)
        out.append(f"{item['tensor']} ({numbers})")
    return ", ".join(out) + (f" and {len(items) - 4} more" if len(items) > 4 else "")


def report(result: Dict[str, Any], top: int) -> str:
    origin = result["origin"]
    dumps = result["dumps"]
    if origin is None:
        entries = sum(d["entries"] for d in dumps)
        return f"no NaN/Inf: {len(dumps)} dump(s), {entries} entries"
    lines = [f"NaN/Inf starts at {origin['entry']} ({_where(origin)})"]
    if origin.get("call_site"):
        lines.append(f"  at {origin['call_site']}")
    if origin.get("inside"):
        lines.append(f"  inside {origin['inside']}")
    lines.append(f"  {HOW[origin['how']]}")
    if origin["nonfinite_outputs"]:
        lines.append(f"  non-finite outputs: {_tensors(origin['nonfinite_outputs'])}")
    if origin["nonfinite_inputs"]:
        lines.append(f"  non-finite inputs: {_tensors(origin['nonfinite_inputs'])}")
    if origin["collective"]:
        lines.append(
            "  it first appears at a collective's output on every rank: the rank that made it is not in "
            "the dump, or made it in code the dump does not record"
        )
    elif origin.get("other_ranks"):
        lines.append(
            f"  before any collective spread it: {origin['collectives_before']} collective(s) completed "
            "on this rank before it; in the same step "
            + "; ".join(
                f"{_where(o)} first shows it at {o['entry']}"
                + (
                    " (received through the collective)"
                    if o["collective"]
                    else f" ({SHORT[o['how']]}, after {o['last_collective']})"
                    if o["last_collective"]
                    else f" ({SHORT[o['how']]})"
                )
                for o in origin["other_ranks"][:5]
            )
        )
    lines.append(f"first NaN/Inf per dump ({result['dumps_with_nonfinite']} of {len(dumps)} dumps hold one):")
    shown = [d for d in dumps if d["onset"] is not None]
    for dump in shown[:top]:
        onset = dump["onset"]
        how = "received through a collective" if onset["collective"] and onset["how"] == "made" else SHORT[onset["how"]]
        lines.append(
            f"  {dump['label']:<16} {onset['entry']:<44} {how}"
            + (f" ({onset['call_site']})" if onset.get("call_site") else "")
        )
    if len(shown) > top:
        lines.append(f"  (+{len(shown) - top} more; --top N lists more)")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        result = find_origin(args.dump, Progress())
    except CompareError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(strict_json(result), indent=1))  # strict JSON: statistics may be NaN
    elif not args.quiet:
        print(report(result, max(args.top, 0)))
    return 1 if result["origin"] is not None else 0
