"""Collection overhead on msprobe's FAQ-style benchmark: 8 x (Linear(512, 512) + GELU), batch 64,
forward + backward, one CPU thread.

Variants, all measured in this one process and printed as ratios to the plain step:
  plain        the model's source as written
  rewritten    the compiler's output, no debugger started (shims only forward)
  ours L1/L0/mix  rewritten, collecting statistics with msprobe_runtime (start/stop/step in every step)
msprobe's own L1/L0/mix need mindstudio-probe, which patches torch, so they run in their own process:
pass --msprobe-python PATH (an interpreter whose environment has mindstudio-probe) to add them; their
ratios are to a plain step measured in that process. Without it they are reported as "not run".

    python bench/overhead.py [--steps 10] [--rounds 3] [--counts] [--msprobe-python /tmp/msvenv/bin/python]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

from timing import measure_interleaved

MODEL_SOURCE = """
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, width=512, depth=8):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers.append(nn.Linear(width, width))
            layers.append(nn.GELU())
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x)


def train_step(model, x):
    loss = model(x).sum()
    loss.backward()
    return loss


def collected_step(debugger, model, x):
    # the whole training step is rewritten, start/stop/step included, as a user's script would be
    model.zero_grad(set_to_none=True)
    debugger.start(model)
    train_step(model, x)
    debugger.stop()
    debugger.step()
"""


def load(source, name):
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def ours(args):
    import torch

    from msprobe_rewrite.api import rewrite_source
    from msprobe_runtime import PrecisionDebugger

    torch.set_num_threads(1)
    plain = load(MODEL_SOURCE, "plain_mlp")
    rewritten_source = rewrite_source(MODEL_SOURCE.encode()).decode()
    rewritten = load(rewritten_source, "rewritten_mlp")
    torch.manual_seed(0)
    x = torch.randn(64, 512)

    def plain_step(module, model):
        def step():
            model.zero_grad(set_to_none=True)
            module.train_step(model, x)

        return step

    root = tempfile.mkdtemp(prefix="msprobe-bench-")
    variants = {
        "plain": plain_step(plain, plain.MLP()),
        "rewritten, collection off": plain_step(rewritten, rewritten.MLP()),
    }
    debuggers = []
    for level in ("L1", "L0", "mix"):
        for counts in (False, True) if args.counts else (False,):
            config = os.path.join(root, f"{level}-{counts}.json")
            with open(config, "w") as handle:
                json.dump(
                    {
                        "dump_path": os.path.join(root, f"{level}-{counts}"),
                        "level": level,
                        "statistics": {"nan_inf_count": counts},
                    },
                    handle,
                )
            debugger = PrecisionDebugger(config_path=config)
            debuggers.append(debugger)
            model = rewritten.MLP()
            name = f"ours {level}" + (" + NaN/Inf counts" if counts else "")
            variants[name] = lambda debugger=debugger, model=model: rewritten.collected_step(debugger, model, x)
    # Diagnostic: L1 and mix with every statistics op skipped (records, names, stacks and hooks only). The
    # native op reads each tensor where it makes its record and its backward hook, so skipping the reads means
    # leaving it: these rows take the collector's Python paths (records, torch's Python backward hooks), and
    # show that bookkeeping alone, not the native L1 less its passes.
    from msprobe_runtime.statistics import KIND_FLOAT, Slot

    nothing = Slot(None, 4)
    no_numbers = (KIND_FLOAT, [0.0] * 4)  # what the native op's path takes instead of a pass
    for level in ("L1", "mix"):
        config = os.path.join(root, f"{level}-nostats.json")
        with open(config, "w") as handle:
            json.dump({"dump_path": os.path.join(root, f"{level}-nostats"), "level": level}, handle)
        debugger = PrecisionDebugger(config_path=config)
        debuggers.append(debugger)
        model = rewritten.MLP()
        rewritten.collected_step(debugger, model, x)  # builds the collector, whose statistics are then skipped
        debugger._collector.stats.add = lambda t, kind: (nothing, None)
        debugger._collector.stats.native = lambda t: no_numbers
        debugger._collector.recorder = None  # the native records (describe_seq) read tensors too
        variants[f"ours {level}, Python paths, no statistics ops"] = lambda debugger=debugger, model=model: (
            rewritten.collected_step(debugger, model, x)
        )
    try:
        results = measure_interleaved(variants, args.steps, args.rounds)
        for debugger in debuggers:
            debugger.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


MSPROBE_SIDE = """
import json, os, statistics, sys, tempfile, time, types
import torch
torch.set_num_threads(1)
steps, rounds = int(sys.argv[1]), int(sys.argv[2])
source = sys.stdin.read()
module = types.ModuleType("mlp")
exec(compile(source, "<mlp>", "exec"), module.__dict__)
x = torch.randn(64, 512)

def measure(step):
    for _ in range(5):
        step()
    medians = []
    for _ in range(rounds):
        times = []
        for _ in range(steps):
            start = time.perf_counter(); step(); times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return min(medians)

results = {}
model = module.MLP()
def plain():
    model.zero_grad(set_to_none=True); module.train_step(model, x)
results["plain"] = measure(plain)
from msprobe.pytorch import PrecisionDebugger
level = sys.argv[3]
root = tempfile.mkdtemp(prefix="msprobe-bench-msprobe-")
debugger = PrecisionDebugger(dump_path=os.path.join(root, "dump"), level=level, task="statistics")
model = module.MLP()
def step():
    model.zero_grad(set_to_none=True)
    debugger.start(model)
    module.train_step(model, x)
    debugger.stop()
    debugger.step()
results["msprobe " + level] = measure(step)
print(json.dumps(results))
"""


def msprobe_side(python, args):
    """msprobe's levels, each in its own process (it patches torch at construction and never unpatches)."""
    out = {}
    for level in ("L1", "L0", "mix"):
        done = subprocess.run(
            [python, "-c", MSPROBE_SIDE, str(args.steps), str(args.rounds), level],
            input=MODEL_SOURCE,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode != 0:
            out[f"msprobe {level}"] = f"failed: {done.stderr.strip().splitlines()[-1:]}"
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        out[f"msprobe {level}"] = result[f"msprobe {level}"] / result["plain"]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--counts", action="store_true", help="also measure with exact NaN/Inf counts")
    parser.add_argument("--msprobe-python", help="interpreter with mindstudio-probe installed")
    args = parser.parse_args()
    results = ours(args)
    base = results["plain"]
    print(f"plain step: {base * 1e3:.2f} ms (8 x (Linear(512,512)+GELU), batch 64, fwd+bwd, 1 thread)")
    for name, seconds in results.items():
        print(f"  {name:28s} {seconds * 1e3:8.2f} ms  {seconds / base:5.2f}x")
    if args.msprobe_python:
        for name, ratio in msprobe_side(args.msprobe_python, args).items():
            text = f"{ratio:5.2f}x (to its own plain step)" if isinstance(ratio, float) else ratio
            print(f"  {name:28s} {'':8s}     {text}")
    else:
        print("  msprobe L1/L0/mix            not run (pass --msprobe-python)")


if __name__ == "__main__":
    sys.exit(main())
