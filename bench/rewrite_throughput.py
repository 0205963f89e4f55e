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
import resource
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


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the CLI's pool workers are joined, so reaped)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(function):
    """(wall seconds, CPU seconds, result) of calling function()."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = function()
    return time.perf_counter() - wall, cpu_seconds() - cpu, result


def timed_cli(args):
    """Run the CLI in this process; return (wall, cpu, note with exit status and summary line)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        wall, cpu, code = timed(lambda: cli.main([str(a) for a in args]))
    lines = [line for line in err.getvalue().splitlines() if line.startswith("msprobe-rewrite: ") and "," in line]
    summary = lines[-1][len("msprobe-rewrite: ") :] if lines else err.getvalue().strip()
    return wall, cpu, f"exit {code}: {summary}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="tree to measure (default: the installed megatron/core)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N files (sorted by path)")
    parser.add_argument("--jobs", type=int, default=0, help="the parallel run's --jobs (default: the CLI's default)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument(
        "--assert-targets",
        action="store_true",
        help="exit 1 when a target is missed (cold default-jobs run > 2x, warm > 5%% of first)",
    )
    args = parser.parse_args(argv)

    root = args.root or megatron_core_dir()
    rels = [entry.rel for entry in discover([root]) if entry.kind == PYTHON]
    if args.limit:
        rels = rels[: args.limit]
    sources = [open(os.path.join(root, *rel.split("/")), "rb").read() for rel in rels]
    jobs_args = ["--jobs", str(args.jobs)] if args.jobs else []
    jobs_label = f"--jobs {args.jobs}" if args.jobs else f"--jobs default ({cli._default_jobs()})"
    print(
        f"{len(rels)} files, {sum(map(len, sources)) / 1e6:.1f} MB, from {root}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )

    def bare_parse_codegen():
        for source in sources:
            libcst.parse_module(source).code

    bare, bare_cpu, _ = timed(bare_parse_codegen)
    rows = [("bare libcst parse+codegen, 1 process", bare, bare_cpu, None)]
    with tempfile.TemporaryDirectory(prefix="msprobe-bench-") as scratch:
        os.environ["MSPROBE_REWRITE_CACHE_DIR"] = os.path.join(scratch, "cache")

        def fresh(name):
            return copy_files(root, rels, os.path.join(scratch, name))

        for label, extra in (
            ("cold rewrite, --jobs 1", ["--no-cache", "--jobs", "1"]),
            ("cold rewrite, --jobs 1 --no-verify", ["--no-cache", "--jobs", "1", "--no-verify"]),
            (f"cold rewrite, {jobs_label}", ["--no-cache", *jobs_args]),
        ):
            rows.append((label, *timed_cli([fresh(label.replace(" ", "_")), *extra])))

        tree = fresh("cached")
        rows.append((f"first run with cache, {jobs_label}", *timed_cli([tree, *jobs_args])))
        rows.append(("second run (cache), in process", *timed_cli([tree, *jobs_args])))
        command = [sys.executable, "-m", "msprobe_rewrite", tree, *jobs_args]
        wall, cpu, result = timed(lambda: subprocess.run(command, capture_output=True, text=True))
        rows.append(
            (
                "second run (cache), new process",
                wall,
                cpu,
                f"exit {result.returncode}: {result.stderr.strip().splitlines()[-1][17:]}",
            )
        )

    width = max(len(row[0]) for row in rows)
    print(f"{'':<{width}}  {'wall':>9}  {'/bare':>6}  {'CPU':>9}  {'/bare':>6}")
    for label, wall, cpu, note in rows:
        print(
            f"{label:<{width}}  {wall:8.3f}s  {wall / bare:5.2f}x  {cpu:8.3f}s  {cpu / bare_cpu:5.2f}x"
            + (f"   [{note}]" if note else "")
        )
    first, warm, warm_process = rows[4][1], rows[5][1], rows[6][1]
    cold_default = rows[3][1]
    print(
        f"second run / first run (wall): {warm / first:.1%} in process, {warm_process / first:.1%} with start-up "
        f"(target <= 5%); cold {jobs_label} / bare (wall): {cold_default / bare:.2f}x (target <= 2x); "
        f"cold --jobs 1 / bare (CPU): {rows[1][2] / bare_cpu:.2f}x"
    )
    print("CPU time is the figure to trust on a busy machine; wall time is what a user waits.")

    figures = {
        "files": len(rels),
        "bytes": sum(map(len, sources)),
        "root": root,
        "wall_seconds": {row[0]: row[1] for row in rows},
        "cpu_seconds": {row[0]: row[2] for row in rows},
        "wall_ratio_to_bare": {row[0]: row[1] / bare for row in rows},
        "cpu_ratio_to_bare": {row[0]: row[2] / bare_cpu for row in rows},
        "warm_over_first": warm / first,
        "warm_process_over_first": warm_process / first,
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
