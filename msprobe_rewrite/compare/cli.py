"""The command line of ``msprobe-rewrite compare``.

Exit status: 0 the runs agree, 1 a divergence was found, 2 an error (a missing path, an unreadable
dump.json, dumps of different levels or tasks).
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, Optional, Sequence

from . import HTML_FILE, SUMMARY_FILE, compare_runs
from .errors import CompareError
from ..progress import Progress
from .summary import terminal_summary

PROG = "msprobe-rewrite compare"


def _threshold(text: str):
    dtype, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not sep or not dtype or number < 0:
        raise argparse.ArgumentTypeError(f"expected DTYPE=VALUE (e.g. float32=1e-3 or default=1e-3), got {text!r}")
    return dtype, number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Align two runs' dumps (entries matched by API or module, direction, call site and order) "
        "and name the first divergence: the first entry, in execution order, whose outputs diverge "
        "while its inputs agree (or whose inputs already diverge, when the difference entered "
        "through code the dump does not record).",
        epilog="A run is a dump directory, a step directory, a rank directory or a dump.json; ranks are paired "
        "by number. Run A is msprobe's NPU (target) side, run B the Bench (golden) side. An entry's call "
        "site is the first frame of its stack.json stack outside torch and the tools: the line of your "
        "program that led to the call. Exit status: "
        "0 no divergence, 1 divergence found, 2 error.",
    )
    parser.add_argument("run_a", metavar="RUN_A")
    parser.add_argument("run_b", metavar="RUN_B")
    parser.add_argument(
        "-o", "--out", metavar="DIR", help=f"write {SUMMARY_FILE}, compare_result_*.csv and {HTML_FILE} into DIR"
    )
    parser.add_argument(
        "--threshold",
        metavar="DTYPE=VALUE",
        type=_threshold,
        action="append",
        default=[],
        help="decision threshold for a dtype (float32, bfloat16, ... or 'default'); repeatable. "
        "Defaults: float32 1e-3, float16 5e-3, bfloat16 2e-2, float64 1e-6, integers exact",
    )
    parser.add_argument("--top", type=int, default=10, metavar="N", help="divergences listed per pair (10)")
    parser.add_argument(
        "--bit-exact",
        action="store_true",
        help="compare bit for bit (dumps collected with summary_mode md5, msprobe's, or "
        "fingerprint): name the first operator whose inputs are identical in both runs "
        "and whose outputs are not",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.bit_exact:
        return _bit_exact(args)
    thresholds: Dict[str, float] = dict(args.threshold)
    try:
        summary = compare_runs(args.run_a, args.run_b, args.out, thresholds, max(args.top, 0), Progress())
    except CompareError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(terminal_summary(summary, args.top))
        if args.out:
            print(f"reports in {args.out}: {SUMMARY_FILE}, {HTML_FILE}, compare_result_*.csv")
    return 1 if summary["first_divergence"] is not None else 0


def _bit_exact(args) -> int:
    from .bit_exact import compare_runs_bit_exact, terminal_summary as bit_exact_summary

    try:
        summary = compare_runs_bit_exact(args.run_a, args.run_b, args.out, Progress())
    except CompareError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(bit_exact_summary(summary))
        if args.out:
            print(f"reports in {args.out}: {SUMMARY_FILE}, compare_result_*.csv")
    return 1 if summary["first_difference"] is not None else 0
