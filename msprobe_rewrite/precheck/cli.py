"""``msprobe-rewrite precheck DUMP [-o DIR]``: replay every API call of a task 'tensor' dump and grade it.

Prints the failing APIs and the counts. With ``-o DIR`` (optional, as for ``compare``) it also writes
``DIR/precheck_result.csv`` (one row per API, tensor and metric), ``DIR/precheck_summary.json`` and
``DIR/precheck_report.html`` (failing APIs first, with an error-distribution plot each). Exit status: 0 every
replayed API passed (warnings included), 1 some API failed, 2 the dump cannot be checked or some of its
files are bad (missing or truncated tensors, API names the catalogue does not know; the reports are still
written for the rest).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from typing import Optional, Sequence

from ..progress import Progress
from . import fp8, report_csv, report_html, report_json, runner, standards
from .errors import PrecheckError
from .summary import verdicts

PROG = "msprobe-rewrite precheck"


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="API accuracy pre-check: replay each dumped API call on the CPU in float64 and in "
        "its own dtype, and grade the dumped result (criteria below).",
        epilog=f"{standards.criteria_text()}\n\n"
        + textwrap.fill(
            "Exit status: 0 every replayed API passed (warnings included), 1 some API failed, 2 the dump cannot "
            "be checked or some of its files are bad.",
            100,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "dump",
        metavar="DUMP",
        help="a task 'tensor' dump (ours or msprobe's): the dump directory, a step or rank directory, or a dump.json",
    )
    # Optional, as compare's -o: without it the terminal shows the verdicts and no file is written
    # (test_precheck_without_out_prints_the_verdicts_and_writes_nothing).
    parser.add_argument(
        "-o",
        "--out",
        metavar="DIR",
        help="write precheck_result.csv, precheck_summary.json and precheck_report.html into DIR "
        "(without it, only the terminal report)",
    )
    parser.add_argument(
        "-j", "--jobs", type=int, default=None, metavar="N", help="worker processes (default: all available cores)"
    )
    parser.add_argument(
        "--catalogue",
        metavar="FILE",
        action="append",
        default=[],
        help="a catalogue YAML that names APIs beyond the shipped one (as for the rewrite); repeatable",
    )
    parser.add_argument(
        "--api",
        metavar="TEXT",
        action="append",
        default=[],
        help="check only APIs whose dump name contains TEXT; repeatable",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="run the CPU replay in the original dtype for every API (by default only where it can "
        "change the verdict: a device result within the dtype's floors passes whatever the "
        "CPU reaches), so that every row has its CPU figure",
    )
    parser.add_argument(
        "--fp8-saturated",
        type=_share,
        default=fp8.SATURATED,
        metavar="SHARE",
        help="float8 records: an error when more than this share of the elements sit at the "
        f"format's max (fp8_saturated_fraction; default {fp8.SATURATED:g})",
    )
    parser.add_argument(
        "--fp8-zero",
        type=_share,
        default=fp8.ZERO,
        metavar="SHARE",
        help="float8 records: a warning when more than this share of the elements are zero, "
        f"underflowed or zero before the cast (fp8_zero_fraction; default {fp8.ZERO:g})",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    return parser


def _write_reports(args: argparse.Namespace, checked, summary) -> None:
    report_csv.write(os.path.join(args.out, "precheck_result.csv"), checked)
    report_json.write(os.path.join(args.out, "precheck_summary.json"), summary)
    report_html.write(os.path.join(args.out, "precheck_report.html"), args.dump, checked, summary)


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.jobs is not None and args.jobs < 1:
        _error("--jobs must be at least 1")
        return 2
    from msprobe_runtime.catalogue import CatalogueError

    from . import apis, source

    started = time.monotonic()
    try:
        table = apis.load_table(args.catalogue)
        work, no_tensor = [], 0
        for _dump, found, skipped in source.all_items(args.dump):
            limits = {"fp8_saturated_fraction": args.fp8_saturated, "fp8_zero_fraction": args.fp8_zero}
            work += [
                dict(item, full=args.full, fp8_limits=limits)
                for item in found
                if not args.api or any(text in item["name"] for text in args.api)
            ]
            no_tensor += skipped
    except (PrecheckError, CatalogueError) as error:
        _error(str(error))
        return 2
    try:
        if args.out is not None:
            os.makedirs(args.out, exist_ok=True)
    except OSError as error:
        _error(f"-o {args.out}: {error.strerror or error}")
        return 2
    jobs = args.jobs or runner.default_jobs()
    progress = Progress(len(work), enabled=False if args.quiet else None)
    try:
        results = runner.run(work, table, jobs, on_done=lambda done, label: progress.update(done, label))
    except PrecheckError as error:  # no worker process could start
        progress.clear()
        _error(str(error))
        return 2
    finally:
        progress.clear()
    checked = verdicts(results)
    summary = report_json.build(args.dump, checked, no_tensor, time.monotonic() - started, jobs)
    try:
        if args.out is not None:
            _write_reports(args, checked, summary)
    except OSError as error:
        _error(f"cannot write the reports into {args.out}: {error.strerror or error}")
        return 2
    problems = [api for api in checked if api.get("problem")]
    for api in problems:
        _error(f"{api['api']} ({api['label']}): {api['problem']}")
    counts = summary["counts"]
    if not args.quiet:
        for api in checked:
            if api["status"] == standards.ERROR:
                print(f"error   {api['api']} ({api['label']}): {api['reason']}", file=sys.stderr)
        where = f"reports in {args.out}" if args.out is not None else "no report files (-o DIR writes them)"
        print(
            f"{PROG}: {len(checked)} APIs: {counts['pass']} pass, {counts['warning']} warning, "
            f"{counts['error']} error, {counts['skip']} not replayed; {where}",
            file=sys.stderr,
        )
    if problems:
        return 2
    return 1 if counts["error"] else 0
