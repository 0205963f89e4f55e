"""The monitor's cost (msprobe_runtime.TrainerMon, docs/monitor.md): one training step of an MLP (``--layers`` x
(Linear(width, width) + GELU), batch ``--batch``, AdamW, CPU, one thread), plain and with the monitor collecting
every step, as a ratio to the plain step measured in the same run (variants take turns, bench/timing.py).

    python bench/monitor_overhead.py [--width 512] [--layers 8] [--batch 64] [--steps 10] [--rounds 3]
                                     [--ops min,max,norm,zeros,nans,mean] [--model mlp|megatron-wide]

--model megatron-wide: instead of the MLP, megatron-core's GPTModel of bench/megatron_step.py's ``--size wide``
(2 layers, hidden 512, 8 heads, sequence 128, vocabulary 1024; fused bias-gelu; gloo world of one, megatron's
CPU stand-ins, set up as that bench does), forward with labels and backward on ``--batch`` sequences (default 4,
that bench's), then AdamW (that bench steps SGD, which has no moments for ``mv_distribution``).

Variants: plain; wg+param+mv (weight gradients before and after reduction, weights before and after the step,
Adam's moments: 6 figure kinds, ``--ops`` each); the same with the NaN and turbulence rules; wg alone; activations
(xy_distribution: every module's inputs and outputs and their gradients; and forward_only); wg+param+mv by the
torch-op path with no reuse (runtime/monitor/metrics.py's fallback: the monitor as it was before the
one-pass paths, measured in the same run). A CPU tensor's figures are one pass of the native op for all ops
(torch ops: one pass per op); with reuse (MSPROBE_MONITOR_REUSE=1, opt-in) a gradient or weight read twice
unchanged is read once (reuse.py). The cost
grows with the kinds asked for and shrinks relative to the step as the batch grows (the step's matmuls grow with
it, the monitor's passes do not). Each variant's step is timed in wall-clock and in CPU time of the training
thread (the one torch thread: less disturbed by the other jobs of a shared machine), and the CPU time spent inside
the monitor's hooks is given as a share of the plain step's.
"""

import argparse
import json
import logging
import os
import statistics
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
    monitor, clock = attach(model, optimizer, config, folder)

    def step():
        optimizer.zero_grad()
        model(data).pow(2).mean().backward()
        optimizer.step()

    step.monitor, step.clock = monitor, clock
    return step


def megatron_factory(batch):
    """``make(config, folder)``: a step of the wide megatron GPT with AdamW, monitored with ``config`` (None:
    plain); the process's gloo world and megatron's CPU stand-ins are set up at the first call."""
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # eager, as bench/megatron_step.py runs megatron
    import megatron_step

    gpt = megatron_step._fixture()
    for name, value in megatron_step.SIZES["wide"].items():
        setattr(gpt, name, value)
    gpt.BATCH = batch
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(gpt.free_port())
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    gpt.parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    gpt.cpu_stand_ins(1234)
    setup = argparse.Namespace(bias_activation_fusion=True, gated_linear_unit=False, tp=1)
    tokens = torch.randint(0, gpt.VOCAB, (gpt.BATCH, gpt.SEQ + 1), generator=torch.Generator().manual_seed(42))
    position_ids = torch.arange(gpt.SEQ).unsqueeze(0).expand(gpt.BATCH, gpt.SEQ)
    mask = torch.tril(torch.ones(1, 1, gpt.SEQ, gpt.SEQ)) < 0.5

    def make(config, folder):
        torch.manual_seed(1234)
        model = gpt.build_model(setup)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        monitor, clock = attach(model, optimizer, config, folder)

        def step():
            optimizer.zero_grad(set_to_none=True)
            model(tokens[:, :-1], position_ids, mask, labels=tokens[:, 1:]).float().mean().backward()
            optimizer.step()

        step.monitor, step.clock = monitor, clock
        return step

    return make


def attach(model, optimizer, config, folder):
    """Monitor ``model`` and ``optimizer`` with ``config`` (None: not at all); the monitor (or None) and its
    clock: [seconds inside its hooks, optimizer steps]."""
    clock = [0.0, 0]
    if config is None:
        return None, clock
    from msprobe_runtime import TrainerMon

    path = os.path.join(folder, f"config{len(os.listdir(folder))}.json")
    with open(path, "w") as handle:
        json.dump(config, handle)
    monitor = TrainerMon(path, params_have_main_grad=False)
    # the hooks are registered as these bound methods (set_monitor): timed here, the monitor's own seconds
    for name in ("_on_grad", "_pre_step", "_post_step"):
        setattr(monitor, name, timed(getattr(monitor, name), clock, name == "_post_step"))
    monitor.set_monitor(model, optimizer)
    activations = getattr(monitor, "activations", None)
    if activations is not None:  # xy_distribution: its hooks look these up at each call (activations.py)
        for name in ("_forward", "_output_grad", "_input_grads"):
            setattr(activations, name, timed(getattr(activations, name), clock, False))
    return monitor, clock


def timed(function, clock, counts_step):
    def wrapper(*args, **kwargs):
        start = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            clock[0] += time.thread_time() - start
            clock[1] += counts_step

    return wrapper


def cpu_timed(step, seconds):
    """``step``, appending each call's CPU seconds of this thread to ``seconds`` (torch runs on one thread here:
    every op of the step and of the monitor is this thread's)."""

    def run():
        start = time.thread_time()
        step()
        seconds.append(time.thread_time() - start)

    run.monitor, run.clock = step.monitor, step.clock
    return run


def torch_ops(step):
    """``step`` with the monitor's figures as before its one-pass paths: the torch-op path, no reuse."""
    from msprobe_runtime.monitor import metrics

    step.monitor._figures.enabled = False

    def run():
        saved, metrics._native[0] = metrics._native[0], False
        try:
            step()
        finally:
            metrics._native[0] = saved

    run.monitor, run.clock = step.monitor, step.clock
    return run


def reused(make, config, folder):
    """A variant with MSPROBE_MONITOR_REUSE=1 (runtime/monitor/reuse.py, opt-in): read when the monitor is made."""
    os.environ["MSPROBE_MONITOR_REUSE"] = "1"
    try:
        return make(config, folder)
    finally:
        del os.environ["MSPROBE_MONITOR_REUSE"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, help="batch (default 64 for the MLP, 4 for megatron-wide)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ops", default=",".join(OPS), help="msprobe's ops, comma separated")
    parser.add_argument("--model", default="mlp", choices=("mlp", "megatron-wide"))
    parser.add_argument(
        "--only", default="", help="variants to run besides plain, comma separated (e.g. 'xy,xy forward_only')"
    )
    args = parser.parse_args()
    if args.batch is None:
        args.batch = 64 if args.model == "mlp" else 4
    torch.set_num_threads(1)
    logging.getLogger("msprobe_runtime").setLevel(logging.ERROR)  # the rules' log lines: not what is measured
    sys.path.insert(0, ROOT)
    if args.model == "mlp":

        def make(config, folder):
            return make_step(args.width, args.layers, args.batch, config, folder)

        title = f"MLP {args.layers} x Linear({args.width}, {args.width}) + GELU, batch {args.batch}"
    else:
        make = megatron_factory(args.batch)
        title = "megatron-core GPT wide (2 layers, hidden 512, sequence 128, vocabulary 1024), batch " + str(args.batch)
    with tempfile.TemporaryDirectory() as folder:
        os.environ["MONITOR_OUTPUT_DIR"] = os.path.join(folder, "out")
        configs = os.path.join(folder, "configs")
        os.makedirs(configs)
        ops = args.ops.split(",")
        figures = {"wg_distribution": True, "param_distribution": True, "mv_distribution": True, "ops": ops}
        makers = {
            "plain": lambda: make(None, configs),
            "monitor wg+param+mv": lambda: make(figures, configs),
            "monitor wg+param+mv, rules": lambda: make(dict(figures, alert={"rules": RULES}), configs),
            "monitor wg+param+mv, reuse": lambda: reused(make, figures, configs),
            "monitor wg": lambda: make({"wg_distribution": True, "ops": ops}, configs),
            # activations of every module (targets empty: msprobe's all_xy), forward and backward, and forward only
            "monitor xy": lambda: make({"xy_distribution": True, "ops": ops}, configs),
            "monitor xy forward_only": lambda: make(
                {"xy_distribution": True, "forward_only": True, "ops": ops}, configs
            ),
            "monitor wg+param+mv, torch ops": lambda: torch_ops(make(figures, configs)),
        }
        only = [part.strip() for part in args.only.split(",") if part.strip()]
        variants = {
            name: maker()
            for name, maker in makers.items()
            if name == "plain" or not only or any(part == name.removeprefix("monitor ") for part in only)
        }
        cpu = {name: [] for name in variants}
        variants = {name: cpu_timed(step, cpu[name]) for name, step in variants.items()}
        warmup = 5
        times = measure_interleaved(variants, args.steps, args.rounds, warmup=warmup)
    cpu_times = {name: statistics.median(seconds[warmup:]) for name, seconds in cpu.items()}
    base, cpu_base = times["plain"], cpu_times["plain"]
    print(f"{title}, AdamW, CPU, 1 thread, ops {args.ops}")
    print(f"plain step: {base * 1e3:.2f} ms wall, {cpu_base * 1e3:.2f} ms CPU")
    print(f"{'':34s} {'wall':>7s} {'CPU':>7s} {'hooks':>8s}")
    for name, seconds in times.items():
        seconds_in, steps = variants[name].clock
        hooks = f"{seconds_in / steps / cpu_base * 100:7.2f}%" if steps else ""
        print(f"{name:34s} {seconds / base:6.3f}x {cpu_times[name] / cpu_base:6.3f}x {hooks}")
    print(
        "wall, CPU: the median step (wall-clock, and CPU time of the training thread, which a shared machine's "
        "other jobs disturb far less) as a ratio to the plain one; hooks: the mean CPU time a step spends inside "
        "the monitor's hooks (figures, flush and writing), as a share of the plain step's"
    )


if __name__ == "__main__":
    main()
