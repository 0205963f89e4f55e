"""Peak memory of rewriting and restoring one large module, against a bare ``libcst.parse_module`` of it.

    python bench/rewrite_memory.py            # generated modules of 100 kB and 250 kB (what CI runs)
    python bench/rewrite_memory.py --full     # 1 MB and 5 MB (about 15 minutes, 7.5 GB at peak)
    python bench/rewrite_memory.py --file PATH

Each case runs in a fresh subprocess, which imports everything and reads its input first, then resets its
peak-RSS mark (``/proc/self/clear_refs``) and measures the peak resident memory the one operation adds. The
cases: a bare libcst parse of the original; ``rewrite_source`` of the original; ``restore_report`` of the
rewritten text (what ``restore_source`` and ``--restore`` run: the forms inverted on text,
``msprobe_rewrite.text_restore``); and the libcst restore of
the same text (``api.restore_report_cst``, the reference it is tested against); both restores must give back
the original bytes, the text one without falling back to libcst. Every figure is printed as a ratio to the
bare parse measured in the same run. Targets (issue 13): rewrite within 1.5x, restore well below (0.5x);
the exit status is 1 when one is missed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from generated_module import generate  # noqa: E402

CASES = ("parse", "rewrite", "restore", "restore_cst")
TARGETS = {"rewrite": 1.5, "restore": 0.5}  # the most each may add, as a ratio to the bare parse (issue 13)


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux 4.0+); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _child(case: str, path: str, output: str) -> None:
    """Run one case on the file at ``path`` and print its figures as JSON (this is the subprocess); the
    rewrite writes its result to ``output``, for the restores."""
    import gc
    import hashlib

    import libcst

    from msprobe_rewrite import api, text_restore

    with open(path, "rb") as handle:
        source = handle.read()
    operation = {
        "parse": lambda: libcst.parse_module(source),
        "rewrite": lambda: api.rewrite_source(source, path="<bench>"),
        "restore": lambda: api.restore_report(source, "<bench>")[0],
        "restore_cst": lambda: api.restore_report_cst(source, "<bench>")[0],
    }[case]
    api.rewrite_source(b"import torch\ny = torch.relu(x)\n")  # the catalogue and the lazy imports, outside
    api.restore_source(api.rewrite_source(b"import torch\ny = -x\n"))
    gc.collect()
    base = _rss_kib("VmRSS")
    reset = _reset_peak()
    start = time.perf_counter()
    result = operation()
    seconds = time.perf_counter() - start
    peak = _rss_kib("VmHWM")
    digest = hashlib.sha256(result).hexdigest() if isinstance(result, bytes) else None
    if case == "rewrite":
        with open(output, "wb") as handle:
            handle.write(result)
    print(
        json.dumps(
            {
                "case": case,
                "base_kib": base,
                "peak_kib": peak,
                "added_kib": peak - base,
                "exact": reset,
                "seconds": seconds,
                "sha256": digest,
                "fallbacks": sum(text_restore.FALLBACKS.values()),
            }
        )
    )


def _measure(case: str, path: str, output: str) -> dict:
    completed = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", case, path, output], capture_output=True, text=True
    )
    if completed.returncode != 0:
        sys.exit(f"{case} failed:\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def run(label: str, source: bytes, directory: str) -> bool:
    """Measure every case on ``source``, print the figures, and say whether each met its target."""
    original = os.path.join(directory, "original.py")
    rewritten = os.path.join(directory, "rewritten.py")
    with open(original, "wb") as handle:
        handle.write(source)
    figures = {}
    for case in CASES:  # in this order: the rewrite writes what the restores read
        figures[case] = _measure(case, rewritten if case.startswith("restore") else original, rewritten)
    # Both restores must give back the original, and the text one without falling back to libcst.
    want = hashlib.sha256(source).hexdigest()
    if figures["restore"]["sha256"] != want or figures["restore_cst"]["sha256"] != want:
        sys.exit(f"{label}: a restore did not give back the original")
    if figures["restore"]["fallbacks"]:
        sys.exit(f"{label}: the text restore fell back to libcst")
    bare = figures["parse"]["added_kib"]
    print(f"\n{label}: {len(source) / 1e6:.2f} MB of source, {os.path.getsize(rewritten) / 1e6:.2f} MB rewritten")
    print(f"  {'case':<14}{'added peak RSS':>16}{'ratio':>8}{'seconds':>10}")
    for case in CASES:
        figure = figures[case]
        ratio = figure["added_kib"] / bare if bare else float("nan")
        print(f"  {case:<14}{figure['added_kib'] / 1024:>13.0f} MB{ratio:>7.2f}x{figure['seconds']:>10.1f}")
    if not all(figure["exact"] for figure in figures.values()):
        print("  (peak RSS could not be reset: figures include the interpreter's own peak)")
    missed = [case for case, most in TARGETS.items() if figures[case]["added_kib"] > most * bare]
    for case in missed:
        print(f"  {case}: target missed (at most {TARGETS[case]}x the bare parse)")
    return not missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="1 MB and 5 MB modules instead of 100 kB and 250 kB")
    parser.add_argument("--file", help="measure this file instead of generated ones")
    parser.add_argument("--child", nargs=3, metavar=("CASE", "PATH", "OUTPUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return 0
    with tempfile.TemporaryDirectory() as directory:
        if args.file:
            with open(args.file, "rb") as handle:
                return 0 if run(args.file, handle.read(), directory) else 1
        met = [
            run(f"generated module of {size / 1e6:g} MB", generate(size), directory)
            for size in ((1_000_000, 5_000_000) if args.full else (100_000, 250_000))
        ]
    return 0 if all(met) else 1


if __name__ == "__main__":
    sys.exit(main())
