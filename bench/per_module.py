"""Host time per recorded module call at mix, on one CPU thread.

A chain of ``--cells`` small modules (each a ``Linear(8, 8)`` and a ``torch.tanh``, on a 4 x 8 input, so the ops
themselves cost a few microseconds) is trained one step at a time, from code that looks rewritten (its globals
hold ``__msprobe__``), with collection off, at L1 and at mix, interleaved. A step makes 2 * cells + 1 module
calls (the chain, each cell, each Linear) and as many API calls (each Linear's ``linear``, each ``tanh``, the
loss's ``sum``), each with its backward, and 2 * cells parameter gradients.

What a module call costs the training thread at mix, its forward and backward entries and its parameters'
gradients included, is (mix - L1) / module calls; what an API call costs at L1, (L1 - off) / API calls (the
step's own costs, start, stop and the flush, are spread over its calls: a short chain shows more). Each is
also given as a multiple of the step with collection off, per call, measured in the same run. The garbage
collector is paused, and run once a round between the steps, untimed: its share is ``bench/gc_share.py``'s.

    python bench/per_module.py [--cells 50] [--rounds 150] [--json FILE]
"""

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

SOURCE = """
import torch


class Cell(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return __msprobe__.call("Torch.tanh", torch.tanh, self.fc(x))


class Chain(torch.nn.Module):
    def __init__(self, cells):
        super().__init__()
        self.cells = torch.nn.ModuleList([Cell() for _ in range(cells)])

    def forward(self, x):
        for cell in self.cells:
            x = cell(x)
        return x


def step(debugger, model, x):
    model.zero_grad(set_to_none=True)
    if debugger is not None:
        debugger.start(model)
    __msprobe__.call("Torch.sum", torch.sum, model(x)).backward()
    if debugger is not None:
        debugger.stop()
        debugger.step()
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    import torch

    import msprobe_runtime
    from msprobe_runtime import PrecisionDebugger

    torch.set_num_threads(1)
    namespace = {"__msprobe__": msprobe_runtime, "__name__": "per_module_chain"}
    exec(compile(SOURCE, "per_module_chain.py", "exec"), namespace)
    torch.manual_seed(0)
    model, x = namespace["Chain"](args.cells), torch.randn(4, 8)
    root = tempfile.mkdtemp(prefix="msprobe-bench-")
    debuggers = {"off": None}
    for level in ("L1", "mix"):
        debuggers[level] = PrecisionDebugger(dump_path=os.path.join(root, level), level=level, task="statistics")
    times = {name: [] for name in debuggers}
    gc.disable()
    try:
        names = list(debuggers)
        for round_ in range(args.rounds + 5):
            gc.collect()  # untimed, once a round: what the collector costs is bench/gc_share.py's figure
            for name in names[round_ % 3 :] + names[: round_ % 3]:  # each variant first in a third of the rounds
                debugger = debuggers[name]
                start = time.perf_counter()
                namespace["step"](debugger, model, x)
                if round_ >= 5:  # the first steps build the collectors and the native op's tables
                    times[name].append(time.perf_counter() - start)
        for debugger in debuggers.values():
            if debugger is not None:
                debugger.wait()
    finally:
        gc.enable()
        shutil.rmtree(root, ignore_errors=True)
    step = {name: statistics.median(values) for name, values in times.items()}
    calls = 2 * args.cells + 1  # module calls a step, and API calls a step
    per_call_off = step["off"] / calls
    module_us = (step["mix"] - step["L1"]) / calls * 1e6
    api_us = (step["L1"] - step["off"]) / calls * 1e6
    print(
        f"chain of {args.cells} cells: {calls} module calls and {calls} API calls a step, one thread; "
        f"median of {args.rounds} steps"
    )
    for name, seconds in step.items():
        print(f"  step, {name:4s} {seconds * 1e3:8.3f} ms   {seconds / step['off']:5.2f}x")
    print(
        f"  a module call at mix (mix - L1)  {module_us:6.1f} us   {module_us / (per_call_off * 1e6):5.2f}x "
        f"the step's time per call with collection off ({per_call_off * 1e6:.1f} us)"
    )
    print(f"  an API call at L1 (L1 - off)     {api_us:6.1f} us   {api_us / (per_call_off * 1e6):5.2f}x")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "cells": args.cells,
                    "rounds": args.rounds,
                    "step_ms": {k: v * 1e3 for k, v in step.items()},
                    "module_call_us": module_us,
                    "api_call_us": api_us,
                    "off_per_call_us": per_call_off * 1e6,
                },
                handle,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
