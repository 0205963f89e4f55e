"""``msprobe-rewrite check PATH...``: the lint as a command, with ruff's exit codes.

Exit status: 0 no findings, 1 findings, 2 an error (bad arguments, a missing PATH, a bad catalogue, a file
that cannot be read or parsed; every other file is still checked and its findings printed).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

from ..files import PYTHON, PathNotFound, discover
from .checker import CheckError, Finding, Linter
from .output import write_json, write_statistics, write_text
from .rules import RULES, RuleSelectionError, enabled_codes, split_selectors

PROG = "msprobe-rewrite check"
EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    rules = "; ".join(f"{r.code} {r.name}{'' if r.default else ' (off by default)'}" for r in RULES.values())
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Report constructs that hide PyTorch API calls from static instrumentation.",
        epilog=f"Rules: {rules}. Suppress one finding with `# msprobe: noqa[CODE]` on its line. "
        "Exit status: 0 clean, 1 findings, 2 error.",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files and folders to check")
    parser.add_argument(
        "--select",
        action="append",
        default=None,
        metavar="CODES",
        help="comma-separated rule codes or prefixes (or ALL) to enable, replacing the defaults",
    )
    parser.add_argument(
        "--extend-select",
        action="append",
        default=[],
        metavar="CODES",
        help="rule codes or prefixes to enable in addition (e.g. MSP901)",
    )
    parser.add_argument(
        "--ignore", action="append", default=[], metavar="CODES", help="rule codes or prefixes to disable"
    )
    parser.add_argument(
        "--output-format",
        choices=("text", "json"),
        default="text",
        help="text: path:line:col: CODE message (default); json: a list of objects",
    )
    parser.add_argument("--statistics", action="store_true", help="print the number of findings per rule instead")
    parser.add_argument(
        "--exclude",
        metavar="GLOB",
        action="append",
        default=[],
        help="skip files and folders whose relative path or name matches GLOB; repeatable",
    )
    parser.add_argument(
        "--catalogue",
        metavar="FILE",
        action="append",
        default=[],
        help="a catalogue YAML added on top of the shipped one, as for the rewrite; repeatable",
    )
    parser.add_argument(
        "--skip-decorator",
        metavar="NAME",
        action="append",
        default=[],
        help="a decorator whose bodies the rewrite leaves alone (as configured for it); repeatable",
    )
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even with findings (errors still exit 2)")
    parser.add_argument("--list-rules", action="store_true", help="list the rules and exit")
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary line on stderr")
    return parser


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def _list_rules() -> int:
    for rule in RULES.values():
        print(f"{rule.code}\t{rule.name}\t{'on' if rule.default else 'off'}\t{rule.summary}")
    return EXIT_CLEAN


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.list_rules:
        return _list_rules()
    if not args.paths:
        parser.error("at least one PATH is required")
    try:
        codes = enabled_codes(
            None if args.select is None else split_selectors(args.select),
            split_selectors(args.ignore),
            split_selectors(args.extend_select),
        )
    except RuleSelectionError as error:
        _error(str(error))
        return EXIT_ERROR
    try:
        entries = [e for e in discover(args.paths, args.exclude) if e.kind == PYTHON]
    except PathNotFound as missing:
        _error(f"{missing}: no such file or folder")
        return EXIT_ERROR

    from msprobe_runtime.catalogue import CatalogueError, load_catalogue

    try:
        catalogue = load_catalogue(args.catalogue)
    except CatalogueError as error:
        _error(f"bad catalogue: {error}")
        return EXIT_ERROR

    linter = Linter(catalogue, codes, args.skip_decorator)
    findings: List[Finding] = []
    errors = 0
    for entry in entries:
        try:
            with open(entry.path, "rb") as handle:
                source = handle.read()
            findings.extend(linter.check(source, entry.path))
        except OSError as error:
            _error(f"{entry.path}: cannot read: {error.strerror}")
            errors += 1
        except CheckError as error:
            _error(str(error))
            errors += 1

    out = sys.stdout
    if args.statistics:
        write_statistics(findings, out, args.output_format == "json")
    elif args.output_format == "json":
        write_json(findings, out)
    else:
        write_text(findings, out)
    out.flush()
    if not args.quiet:
        files = len({f.path for f in findings})
        print(
            f"{PROG}: {len(findings)} finding{'s' * (len(findings) != 1)} in {files} of {len(entries)} "
            f"file{'s' * (len(entries) != 1)}" + (f", {errors} not checked" if errors else ""),
            file=sys.stderr,
        )
    if errors:
        return EXIT_ERROR
    return EXIT_FINDINGS if findings and not args.exit_zero else EXIT_CLEAN
