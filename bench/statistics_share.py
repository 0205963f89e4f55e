"""Time spent in the statistics engine per step of bench/overhead.py's MLP (8 x (Linear(512,512)+GELU),
batch 64, one CPU thread): the wall time inside ``StatBuffer.native``, ``add`` and ``take`` of each collected
step, with the fused native op and with the torch-op fallback, with and without NaN/Inf counts.

Unlike the step ratios of bench/overhead.py, this times only the statistics, so it stays readable on a busy
machine: median and minimum over the steps, in milliseconds per step.

    python bench/statistics_share.py [--steps 15]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from overhead import MODEL_SOURCE, load  # noqa: E402


def timed(buffer, clock):
    add, take, native = buffer.add, buffer.take, buffer.native

    def timed_native(t):
        # the collector's first call for a plain CPU float tensor; counted where the op served it (add also
        # asks it first, and is timed whole below)
        start = time.perf_counter()
        done = native(t)
        if done is not None:
            clock["seconds"] += time.perf_counter() - start
            clock["adds"] += 1
        return done

    def timed_add(t, kind):
        start = time.perf_counter()
        try:
            return add(t, kind)
        finally:
            clock["seconds"] += time.perf_counter() - start
            clock["adds"] += 1

    def timed_take():
        start = time.perf_counter()
        try:
            return take()
        finally:
            clock["seconds"] += time.perf_counter() - start

    buffer.add, buffer.take, buffer.native = timed_add, timed_take, timed_native


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    import torch

    from msprobe_rewrite.api import rewrite_source
    from msprobe_runtime import PrecisionDebugger, native_stats

    torch.set_num_threads(1)
    rewritten = load(rewrite_source(MODEL_SOURCE.encode()).decode(), "rewritten_mlp")
    torch.manual_seed(0)
    x = torch.randn(64, 512)
    root = tempfile.mkdtemp(prefix="msprobe-bench-")
    real_load = native_stats.load
    try:
        for path in ("native", "fallback"):
            native_stats.load = real_load if path == "native" else (lambda: None)
            if path == "native" and real_load() is None:
                print("native: the op cannot be built here")
                continue
            for level in ("L1", "mix"):
                for counts in (False, True):
                    debugger = PrecisionDebugger(dump_path=os.path.join(root, f"{path}-{level}-{counts}"), level=level)
                    debugger.config.nan_inf_count = counts
                    model = rewritten.MLP()
                    rewritten.collected_step(debugger, model, x)  # makes the collector and its StatBuffer
                    clock = {"seconds": 0.0, "adds": 0}
                    timed(debugger._collector.stats, clock)
                    per_step = []
                    for _ in range(args.steps):
                        clock["seconds"], clock["adds"] = 0.0, 0
                        rewritten.collected_step(debugger, model, x)
                        per_step.append(clock["seconds"])
                    debugger.wait()
                    label = f"{path} {level}" + (" + NaN/Inf counts" if counts else "")
                    median = statistics.median(per_step) * 1e3
                    print(
                        f"  {label:34s} {clock['adds']:3d} tensors/step  median {median:6.2f} ms"
                        f"  min {min(per_step) * 1e3:6.2f} ms"
                    )
    finally:
        native_stats.load = real_load
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
