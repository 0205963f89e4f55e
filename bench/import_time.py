"""Import time of megatron-core: plain, under the import hook with a cold cache, and with a warm cache.

Every figure comes from the same run, each import in a fresh interpreter with torch already imported (torch's
own import time would swamp the difference), and is printed as a ratio to the plain import. The cold import
is compared with the CLI run on a copy of the same modules' files as a user runs it (a new process,
``--no-cache``, in place), with one job and with one per core, and with the compiler called on them in this
process (no start-up, no I/O); the hook's own rewrite of them (its ast path) is timed in process too.
Targets (issue 4): warm at most 1.1x plain; cold at most the CLI's rewrite time, compared on equal cores: the
cold import with prefetch off (``MSPROBE_REWRITE_PREFETCH=0``) with the one-job CLI, and with prefetch on
with the CLI using every core.

    python bench/import_time.py [--module megatron.core.models.gpt] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
import torch
hook = sys.argv[1] == "hook"
if hook:
    from msprobe_rewrite import install_import_hook
    install_import_hook(["megatron"])
start = time.perf_counter()
__import__(sys.argv[2])
elapsed = time.perf_counter() - start
files = sorted(m.__file__ for name, m in list(sys.modules.items())
               if name.split(".")[0] == "megatron" and getattr(m, "__file__", None))
print(json.dumps({"seconds": elapsed, "files": files}))
"""


def child(mode: str, module: str, prefix: str, prefetch: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "MSPROBE_REWRITE_PREFETCH")}
    # megatron's @jit_fuser loads torch._dynamo at import (about a second, with the hook or without): off, so that
    # the rewrite's share of the import shows
    env.update(PYTHONPYCACHEPREFIX=prefix, TORCHDYNAMO_DISABLE="1", PYTHONWARNINGS="ignore")
    if prefetch:
        env["MSPROBE_REWRITE_PREFETCH"] = prefetch
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, module], capture_output=True, text=True, env=env, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def rewrite_seconds(files) -> float:
    """The CLI's compiler (libcst) on the files, in this process."""
    from msprobe_rewrite.api import default_catalogue, rewrite_source

    catalogue = default_catalogue()
    start = time.perf_counter()
    for path in files:
        with open(path, "rb") as handle:
            rewrite_source(handle.read(), catalogue, path=path)
    return time.perf_counter() - start


def hook_rewrite_seconds(files) -> float:
    """What the hook does per module on a cache miss (the ast path, libcst where it defers), in this process."""
    from msprobe_rewrite.api import default_catalogue
    from msprobe_rewrite.import_hook import instrumented_code

    catalogue = default_catalogue()
    start = time.perf_counter()
    for path in files:
        with open(path, "rb") as handle:
            instrumented_code(handle.read(), path, None, catalogue, ())
    return time.perf_counter() - start


def cli_seconds(files, jobs) -> float:
    """The CLI as a user runs it (``msprobe-rewrite --no-cache --jobs N DIR``, a new process, files written in
    place) on a copy of the same files."""
    common = os.path.commonpath(files)
    with tempfile.TemporaryDirectory() as scratch:
        for path in files:
            target = os.path.join(scratch, os.path.relpath(path, common))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(path, target)
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "msprobe_rewrite", "--no-cache", "--jobs", str(jobs), scratch],
            capture_output=True,
            text=True,
        )
        elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"msprobe-rewrite failed: {done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="megatron.core.models.gpt")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    plain, cold, cold_alone, warm, compiler, hook_compiler, cli_one, cli_all = [], [], [], [], [], [], [], []
    files = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as prefix:
            child("plain", args.module, prefix)  # fills the normal bytecode cache under this prefix
            plain.append(child("plain", args.module, prefix)["seconds"])
            first = child("hook", args.module, prefix)
            cold.append(first["seconds"])
            warm.append(child("hook", args.module, prefix)["seconds"])
            files = first["files"]
        with tempfile.TemporaryDirectory() as prefix:
            child("plain", args.module, prefix)
            cold_alone.append(child("hook", args.module, prefix, prefetch="0")["seconds"])
        compiler.append(rewrite_seconds(files))
        hook_compiler.append(hook_rewrite_seconds(files))
        cli_one.append(cli_seconds(files, 1))
        cli_all.append(cli_seconds(files, jobs))
    median = statistics.median
    base = median(plain)
    rows = [
        ("plain import", median(plain)),
        ("hook, cold cache", median(cold)),
        ("hook, cold, no prefetch", median(cold_alone)),
        ("hook, warm cache", median(warm)),
        ("compiler on the same files", median(compiler)),
        ("hook's rewrite of them", median(hook_compiler)),
        ("CLI on them, --jobs 1", median(cli_one)),
        (f"CLI on them, --jobs {jobs}", median(cli_all)),
    ]
    print(
        f"import {args.module} ({len(files)} megatron modules), median of {args.repeat}, torch pre-imported, "
        f"{jobs} cores"
    )
    for label, seconds in rows:
        print(f"  {label:<28} {seconds:8.3f} s   {seconds / base:6.2f}x plain")
    print(f"  cold / compiler on the same files (one core, in-process, no I/O): {median(cold) / median(compiler):.2f}")
    print(
        f"  hook's rewrite (ast path) / compiler (libcst), in process: {median(hook_compiler) / median(compiler):.2f}"
    )
    print(
        f"  cold, no prefetch / CLI --jobs 1 (one core each): {median(cold_alone) / median(cli_one):.2f} (target <= 1)"
    )
    print(f"  cold / CLI --jobs {jobs} on the same files: {median(cold) / median(cli_all):.2f} (target <= 1)")
    print(f"  warm / plain: {statistics.median(warm) / base:.2f} (target <= 1.1)")


if __name__ == "__main__":
    main()
