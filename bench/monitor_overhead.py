"""The monitor's cost (msprobe_runtime.TrainerMon, docs/monitor.md): one training step of an MLP (``--layers`` x
(Linear(width, width) + GELU), batch ``--batch``, AdamW, CPU, one thread), plain and with the monitor collecting
every step, as a ratio to the plain step measured in the same run (variants take turns, bench/timing.py).

    python bench/monitor_overhead.py [--width 512] [--layers 8] [--batch 64] [--steps 10] [--rounds 3]
                                     [--ops min,max,norm,zeros,nans,mean] [--clock wall|process]

Variants: plain; wg+param+mv (weight gradients before and after reduction, weights before and after the step,
Adam's moments: 6 figure kinds, ``--ops`` each); the same with the NaN and turbulence rules; wg alone; activations
(xy_distribution, every module's inputs and outputs and their gradients; and forward_only). Each op is a
pass over every parameter-sized tensor of a kind, so the cost grows with the ops and kinds asked for, and shrinks
relative to the step as the batch grows (the step's matmuls grow with it, the monitor's passes do not).
"""

import argparse
import json
import logging
import os
import sys
import tempfile
import time

import torch

from timing import measure_interleaved

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ["min", "max", "norm", "zeros", "nans", "mean"]
RULES = [{"rule_name": "AnomalyNan"}, {"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}}]


def make_step(width, layers, batch, config, folder):
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randn(batch, width)
    if config is not None:
        from msprobe_runtime import TrainerMon

        path = os.path.join(folder, f"config{len(os.listdir(folder))}.json")
        with open(path, "w") as handle:
            json.dump(config, handle)
        TrainerMon(path, params_have_main_grad=False).set_monitor(model, optimizer)

    def step():
        optimizer.zero_grad()
        model(data).pow(2).mean().backward()
        optimizer.step()

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ops", default=",".join(OPS), help="msprobe's ops, comma separated")
    parser.add_argument(
        "--clock",
        choices=("wall", "process"),
        default="wall",
        help="process: this process's CPU time (one thread), steadier on a shared machine",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("msprobe_runtime").setLevel(logging.ERROR)  # the rules' log lines: not what is measured
    sys.path.insert(0, ROOT)
    with tempfile.TemporaryDirectory() as folder:
        os.environ["MONITOR_OUTPUT_DIR"] = os.path.join(folder, "out")
        configs = os.path.join(folder, "configs")
        os.makedirs(configs)
        ops = args.ops.split(",")
        figures = {"wg_distribution": True, "param_distribution": True, "mv_distribution": True, "ops": ops}
        variants = {
            "plain": make_step(args.width, args.layers, args.batch, None, configs),
            "monitor wg+param+mv": make_step(args.width, args.layers, args.batch, figures, configs),
            "monitor wg+param+mv, rules": make_step(
                args.width, args.layers, args.batch, dict(figures, alert={"rules": RULES}), configs
            ),
            "monitor wg": make_step(
                args.width, args.layers, args.batch, {"wg_distribution": True, "ops": ops}, configs
            ),
            # activations of every module (targets empty: msprobe's all_xy), forward and backward
            "monitor xy": make_step(
                args.width, args.layers, args.batch, {"xy_distribution": True, "ops": ops}, configs
            ),
            "monitor xy forward_only": make_step(
                args.width,
                args.layers,
                args.batch,
                {"xy_distribution": True, "forward_only": True, "ops": ops},
                configs,
            ),
        }
        clock = time.process_time if args.clock == "process" else time.perf_counter
        times = measure_interleaved(variants, args.steps, args.rounds, clock=clock)
    base = times["plain"]
    print(
        f"MLP {args.layers} x Linear({args.width}, {args.width}) + GELU, batch {args.batch}, AdamW, CPU, 1 thread, "
        f"ops {args.ops}"
    )
    print(f"plain step: {base * 1e3:.2f} ms ({args.clock} clock)")
    for name, seconds in times.items():
        print(f"{name:30s} {seconds / base:6.3f}x")


if __name__ == "__main__":
    main()
