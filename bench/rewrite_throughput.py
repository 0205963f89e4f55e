"""Rewrite throughput of ``msprobe-rewrite`` against bare libcst parse+codegen of the same files, in one run.

    python bench/rewrite_throughput.py                 # the installed megatron-core (pip install megatron-core)
    python bench/rewrite_throughput.py --limit 40      # a quick run for CI
    python bench/rewrite_throughput.py --root DIR      # any tree

Every figure is printed as a ratio to the bare parse+codegen time (libcst.parse_module(src).code per file,
one process), which is the floor for any libcst-based rewriter. Targets (issue 2): the cold rewrite at most
2x that, and a second run over the unchanged tree at most 5 % of the first run. Each CLI run works in place
on a fresh copy of the files, exactly as a user's run would, in this process (interpreter start-up and
imports excluded, as for the bare figure); the warm run is also timed as a subprocess, start-up included.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import libcst

from msprobe_rewrite import cli
from msprobe_rewrite.files import PYTHON, discover


def megatron_core_dir() -> str:
    spec = importlib.util.find_spec("megatron.core")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("megatron-core is not installed (pip install megatron-core==0.16.1), or pass --root DIR")
    return list(spec.submodule_search_locations)[0]


def copy_files(root: str, rels, dest: str) -> str:
    for rel in rels:
        target = os.path.join(dest, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(root, *rel.split("/")), target)
    return dest


def timed_cli(args):
    """Run the CLI in this process; return (seconds, exit status, its summary line)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        start = time.perf_counter()
        code = cli.main([str(a) for a in args])
        seconds = time.perf_counter() - start
    lines = [line for line in err.getvalue().splitlines() if line.startswith("msprobe-rewrite: ") and "," in line]
    return seconds, code, lines[-1][len("msprobe-rewrite: "):] if lines else err.getvalue().strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="tree to measure (default: the installed megatron/core)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N files (sorted by path)")
    parser.add_argument("--jobs", type=int, default=0, help="the parallel run's --jobs (default: the CLI's default)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--assert-targets", action="store_true",
                        help="exit 1 when a target is missed (cold default-jobs run > 2x, warm > 5%% of first)")
    args = parser.parse_args(argv)

    root = args.root or megatron_core_dir()
    rels = [entry.rel for entry in discover([root]) if entry.kind == PYTHON]
    if args.limit:
        rels = rels[: args.limit]
    sources = [open(os.path.join(root, *rel.split("/")), "rb").read() for rel in rels]
    jobs_args = ["--jobs", str(args.jobs)] if args.jobs else []
    jobs_label = f"--jobs {args.jobs}" if args.jobs else f"--jobs default ({cli._default_jobs()})"
    print(f"{len(rels)} files, {sum(map(len, sources)) / 1e6:.1f} MB, from {root}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

    start = time.perf_counter()
    for source in sources:
        libcst.parse_module(source).code
    bare = time.perf_counter() - start

    rows = [("bare libcst parse+codegen, 1 process", bare, None)]
    with tempfile.TemporaryDirectory(prefix="msprobe-bench-") as scratch:
        os.environ["MSPROBE_REWRITE_CACHE_DIR"] = os.path.join(scratch, "cache")

        def fresh(name):
            return copy_files(root, rels, os.path.join(scratch, name))

        for label, extra in (
            ("cold rewrite, --jobs 1", ["--no-cache", "--jobs", "1"]),
            ("cold rewrite, --jobs 1 --no-verify", ["--no-cache", "--jobs", "1", "--no-verify"]),
            (f"cold rewrite, {jobs_label}", ["--no-cache", *jobs_args]),
        ):
            seconds, code, summary = timed_cli([fresh(label.replace(" ", "_")), *extra])
            rows.append((label, seconds, f"exit {code}: {summary}"))

        tree = fresh("cached")
        first, code, summary = timed_cli([tree, *jobs_args])
        rows.append((f"first run with cache, {jobs_label}", first, f"exit {code}: {summary}"))
        warm, code, summary = timed_cli([tree, *jobs_args])
        rows.append(("second run (cache), in process", warm, f"exit {code}: {summary}"))
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "msprobe_rewrite", tree, *jobs_args],
                                capture_output=True, text=True)
        warm_process = time.perf_counter() - start
        rows.append(("second run (cache), new process", warm_process,
                     f"exit {result.returncode}: {result.stderr.strip().splitlines()[-1][17:]}"))

    width = max(len(label) for label, _, _ in rows)
    for label, seconds, note in rows:
        print(f"{label:<{width}}  {seconds:8.3f} s  {seconds / bare:6.2f}x bare" + (f"   [{note}]" if note else ""))
    cold_default = rows[3][1]
    print(f"second run / first run: {warm / first:.1%} in process, {warm_process / first:.1%} with start-up "
          f"(target <= 5%); cold {jobs_label} / bare: {cold_default / bare:.2f}x (target <= 2x)")

    figures = {
        "files": len(rels), "bytes": sum(map(len, sources)), "root": root,
        "seconds": {label: seconds for label, seconds, _ in rows},
        "ratio_to_bare": {label: seconds / bare for label, seconds, _ in rows},
        "warm_over_first": warm / first, "warm_process_over_first": warm_process / first,
    }
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)
    if args.assert_targets and (cold_default / bare > 2 or warm_process / first > 0.05):
        print("target missed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
