"""A whole model under ``torch.compile``: the step with collection on, against the same compiled step with it off.

Two models, each trained with ``torch.compile(model)`` (inductor) on one CPU thread:
  gpt    megatron-core's tiny GPT of fixtures/megatron_gpt/train_gpt.py (forward, backward, SGD);
  llama  a tiny transformers LlamaForCausalLM of fixtures/transformers_models/train_tiny.py (forward with labels,
         backward, AdamW).
The rewritten worker (megatron a rewritten copy, transformers instrumented on import) compiles once, then takes
turns, ``--rounds`` times, between ``--steps`` steps with collection off, at L1 and at mix (start/stop/step around
each), so that drift of a shared machine falls on all three alike: those ratios are to "off", measured in the same
process. Dynamo's counters after all of them show whether collection recompiled anything or broke a graph (the
same counters as the plain worker's: nothing). "plain", the model as shipped, compiled, runs in a process of its
own, whose step is set against "off" too (between processes: a noisier figure).

    python bench/compiled_step.py [--models gpt,llama] [--size tiny|wide] [--steps 20] [--rounds 5] [--warmup 5]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from fixtures.reproducible_env import REPRODUCIBLE  # noqa: E402

VARIANTS = ("off", "L1", "mix")
# the fixtures' own sizes (tiny: a step of a few ms, where the per-step work of start/stop/step shows) and one where
# a step does real work (wide: bench/megatron_step.py's wide GPT); set on the fixture modules before the model
SIZES = {"tiny": {}, "wide": dict(HIDDEN=512, HEADS=8, SEQ=128, BATCH=4, VOCAB=1024)}


# ------------------------------------------------------------------------------------------ the worker


def gpt_step_factory(size):
    """``(model, forward_backward(runner), optimizer_step())`` for megatron's GPT (train_gpt.py's model and data)."""
    sys.path.insert(0, os.path.join(ROOT, "fixtures", "megatron_gpt"))
    import torch

    import train_gpt

    for name, value in SIZES[size].items():
        setattr(train_gpt, name, value)

    train_gpt.init_distributed()
    train_gpt.cpu_stand_ins(1234)
    torch.manual_seed(1234)
    model = train_gpt.build_model(argparse.Namespace(bias_activation_fusion=True, gated_linear_unit=False, tp=1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(42)
    tokens = torch.randint(0, train_gpt.VOCAB, (train_gpt.BATCH, train_gpt.SEQ + 1), generator=data)
    position_ids = torch.arange(train_gpt.SEQ).unsqueeze(0).expand(train_gpt.BATCH, train_gpt.SEQ)
    mask = torch.tril(torch.ones(1, 1, train_gpt.SEQ, train_gpt.SEQ)) < 0.5

    def forward_backward(runner):
        optimizer.zero_grad(set_to_none=True)
        loss = runner(tokens[:, :-1], position_ids, mask, labels=tokens[:, 1:]).float().mean()
        loss.backward()

    return model, forward_backward, optimizer.step


def llama_step_factory(size):
    sys.path.insert(0, os.path.join(ROOT, "fixtures", "transformers_models"))
    import torch

    import train_tiny

    for name, value in SIZES[size].items():
        setattr(train_tiny, name, value)

    train_tiny.transformers.set_seed(1234)
    model, kind = train_tiny.ARCHS["llama"]()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = train_tiny.batches(kind, 1)[0]

    def forward_backward(runner):
        optimizer.zero_grad(set_to_none=True)
        runner(**batch).loss.backward()

    return model, forward_backward, optimizer.step


FACTORIES = {"gpt": gpt_step_factory, "llama": llama_step_factory}


def worker(model_name, size, variants, steps, rounds, warmup, dump):
    """Median step of each variant, Dynamo's counters; one JSON line."""
    if model_name == "llama" and "plain" not in variants:
        from msprobe_rewrite import install_import_hook

        install_import_hook(["transformers"])
    import torch

    torch.set_num_threads(1)
    model, forward_backward, optimizer_step = FACTORIES[model_name](size)
    runner = torch.compile(model)
    from torch._dynamo.utils import counters

    debuggers = {}
    if "L1" in variants or "mix" in variants:
        from msprobe_runtime import PrecisionDebugger

        debuggers = {
            level: PrecisionDebugger(dump_path=os.path.join(dump, level), level=level, task="statistics")
            for level in ("L1", "mix")
            if level in variants
        }

    def step(variant):
        debugger = debuggers.get(variant)
        began = time.perf_counter()
        if debugger is not None:
            debugger.start(runner)
        forward_backward(runner)
        if debugger is not None:
            debugger.stop()
            debugger.step()
        optimizer_step()
        return time.perf_counter() - began

    for variant in variants:
        for _ in range(warmup):
            step(variant)
    times = {variant: [] for variant in variants}
    for _ in range(rounds):
        for variant in variants:
            times[variant].extend(step(variant) for _ in range(steps))
    for debugger in debuggers.values():
        debugger.wait()
    print(
        json.dumps(
            {
                "median": {variant: statistics.median(values) for variant, values in times.items()},
                "dynamo": {
                    "frames": dict(counters["frames"]),
                    "graph_breaks": sum(counters["graph_break"].values()),
                    "unique_graphs": counters["stats"].get("unique_graphs", 0),
                },
            }
        )
    )


# ------------------------------------------------------------------------------------------ the driver


def run_worker(model_name, variants, args, pythonpath, dump):
    env = {**os.environ, **REPRODUCIBLE, "PYTHONWARNINGS": "ignore"}
    env.pop("TORCHDYNAMO_DISABLE", None)  # compiled: what this bench measures
    env["PYTHONPATH"] = os.pathsep.join(path for path in (pythonpath, ROOT) if path)
    done = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            model_name,
            "--size",
            args.size,
            "--variants",
            ",".join(variants),
            "--steps",
            str(args.steps),
            "--rounds",
            str(args.rounds),
            "--warmup",
            str(args.warmup),
            "--dump",
            dump,
        ],
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
    )
    if done.returncode != 0:
        sys.exit(f"the {model_name} worker ({','.join(variants)}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt,llama")
    parser.add_argument("--size", choices=SIZES, default="tiny")
    parser.add_argument("--steps", type=int, default=20, help="steps of a variant in each round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5, help="steps of each variant first (compilation)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--variants", help=argparse.SUPPRESS)
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.size, args.variants.split(","), args.steps, args.rounds, args.warmup, args.dump)
        return 0
    from megatron_step import rewritten_copy

    workdir = tempfile.mkdtemp(prefix="compiled-step-")
    try:
        copy = os.path.join(workdir, "copy")
        os.mkdir(copy)
        rewritten_copy(copy)
        for model_name in args.models.split(","):
            plain = run_worker(model_name, ["plain"], args, None, os.path.join(workdir, f"{model_name}-plain"))
            rewritten = run_worker(
                model_name,
                list(VARIANTS),
                args,
                copy if model_name == "gpt" else None,
                os.path.join(workdir, f"{model_name}-rewritten"),
            )
            off = rewritten["median"]["off"]
            print(
                f"\n{model_name} ({args.size}): torch.compile(model), {args.steps} steps x {args.rounds} rounds a "
                f"variant, median step; one CPU thread"
            )
            print(f"  {'variant':8s} {'ms':>8s} {'x off':>7s}")
            print(
                f"  {'plain':8s} {plain['median']['plain'] * 1e3:8.2f} {plain['median']['plain'] / off:6.2f}x"
                f"   (its own process)"
            )
            for variant in VARIANTS:
                median = rewritten["median"][variant]
                print(f"  {variant:8s} {median * 1e3:8.2f} {median / off:6.2f}x")
            same = "the same" if rewritten["dynamo"] == plain["dynamo"] else "DIFFERENT"
            print(
                f"  Dynamo, plain: {plain['dynamo']}; rewritten, off then L1 and mix in turn: "
                f"{rewritten['dynamo']} ({same})"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
