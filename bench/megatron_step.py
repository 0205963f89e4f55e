"""Collection overhead on megatron-core's GPTModel: the tiny GPT of fixtures/megatron_gpt (2 layers, hidden 64,
4 heads, vocabulary 128, sequence 16, batch 2, local layer spec, gloo world of one, CPU, one thread), one
training step = forward with labels, backward, SGD step. Every figure is a ratio to the plain step.

    python bench/megatron_step.py [--steps 20] [--rounds 3] [--msprobe-python /tmp/msprobe-venv/bin/python]
                                  [--json FILE] [--svg docs/megatron_step.svg] [--throughput]
                                  [--size tiny|wide] [--configs fused,unfused] [--microbatches 1]

--microbatches N runs N forward and backward passes a step before the SGD step, gradients accumulated, as
megatron's schedules do over their microbatches (one debugger step: the weights are the same in each).

Variants (each process loads megatron once, so a variant group is one subprocess; within a group the variants
take turns every round, and every group runs twice, the lower median kept):
  plain                    the unmodified megatron-core, no collection            (group "plain")
  DIY TorchFunctionMode    the same, with the minimal collector below: per-call Max/Min/Mean/Norm of every
                           floating output, on the device, forward only (a mode cannot see backward)
  rewritten, off           megatron-core rewritten by the CLI (--out), no debugger  (group "rewritten")
  ours L1 / ours mix       the rewritten copy, msprobe_runtime.PrecisionDebugger start/stop/step every step
  msprobe L1 / mix         mindstudio-probe in its own process (it patches torch at construction and never
                           restores), ratio to a plain step measured in that process first
Two configurations: bias_activation_fusion=True (megatron's fused bias-gelu, what Megatron users run) and
False. msprobe raises on the first one; the error is reported as the result.

--throughput also runs bench/rewrite_throughput.py on the installed megatron-core (the CLI against bare libcst
parse + codegen) and adds its figures.
"""

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from charts import bar_chart
from timing import measure_interleaved

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "fixtures", "megatron_gpt", "train_gpt.py")
CONFIGS = {"fused": True, "unfused": False}  # bias_activation_fusion
# --size: the fixture's tiny GPT, or a wider one where each call does more work (same number of calls)
SIZES = {
    "tiny": dict(HIDDEN=64, HEADS=4, SEQ=16, BATCH=2, VOCAB=128),
    "wide": dict(HIDDEN=512, HEADS=8, SEQ=128, BATCH=4, VOCAB=1024),
}


# ----------------------------------------------------------------------------------------- worker side


def _fixture():
    spec = importlib.util.spec_from_file_location("train_gpt", FIXTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class DIYCollector:
    """What a user writes in an afternoon: a TorchFunctionMode that records Max/Min/Mean/Norm of every floating
    tensor output of every torch call, kept on the device, written as JSON at the end of the step."""

    def __init__(self, path):
        import torch

        class Mode(torch.overrides.TorchFunctionMode):
            def __torch_function__(mode, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                outs = out if isinstance(out, (tuple, list)) else (out,)
                for t in outs:
                    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                        d = t.detach()
                        self.records.append(
                            (getattr(func, "__name__", "?"), torch.stack([d.max(), d.min(), d.mean(), d.norm()]))
                        )
                return out

        self.mode_class = Mode
        self.path = path
        self.records = []
        self.step_index = 0

    @contextlib.contextmanager
    def collecting(self):
        with self.mode_class():
            yield

    def flush(self):
        import torch

        if self.records:
            names = [name for name, _ in self.records]
            values = torch.stack([v for _, v in self.records]).tolist()
            with open(os.path.join(self.path, f"step{self.step_index}.json"), "w") as handle:
                json.dump({f"{n}.{i}": v for i, (n, v) in enumerate(zip(names, values))}, handle)
        self.records = []
        self.step_index += 1


def step_factory(args):
    """``make_step(begin=None, end=None, around=nullcontext)``: a fresh model and optimizer of ``args.size`` and
    ``args.config`` (the process's gloo world and megatron's CPU stand-ins set up at the first call), and a
    folder for the dumps; ``make_step`` returns the step function."""
    # eager: the msprobe and do-it-yourself TorchFunctionMode steps measured beside ours run eagerly (under
    # torch.compile Dynamo would trace msprobe's wrappers and the mode into megatron's @jit_fuser functions), so
    # all of them do; the compiled step is bench/compiled_step.py
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    import torch

    torch.set_num_threads(1)
    gpt = _fixture()
    for name, value in SIZES[args.size].items():
        setattr(gpt, name, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(gpt.free_port())
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    gpt.parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    gpt.cpu_stand_ins(1234)
    config = argparse.Namespace(bias_activation_fusion=CONFIGS[args.config], gated_linear_unit=False, tp=1)
    tokens = torch.randint(0, gpt.VOCAB, (gpt.BATCH, gpt.SEQ + 1), generator=torch.Generator().manual_seed(42))
    position_ids = torch.arange(gpt.SEQ).unsqueeze(0).expand(gpt.BATCH, gpt.SEQ)
    mask = torch.tril(torch.ones(1, 1, gpt.SEQ, gpt.SEQ)) < 0.5
    root = tempfile.mkdtemp(prefix="megatron-step-bench-")

    def make_step(begin=None, end=None, around=contextlib.nullcontext):
        torch.manual_seed(1234)
        model = gpt.build_model(config)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            optimizer.zero_grad(set_to_none=True)
            if begin:
                begin(model)
            with around():
                for _ in range(args.microbatches):  # gradients accumulate, as over megatron's microbatches
                    loss = model(tokens[:, :-1], position_ids, mask, labels=tokens[:, 1:]).float().mean()
                    loss.backward()
            if end:
                end()
            optimizer.step()

        return step

    return make_step, root


def worker(args):
    make_step, root = step_factory(args)
    variants = {}
    if args.worker == "plain":
        variants["plain"] = make_step()
        diy = DIYCollector(tempfile.mkdtemp(dir=root))
        variants["DIY TorchFunctionMode"] = make_step(around=diy.collecting, end=diy.flush)
    elif args.worker == "rewritten":
        from msprobe_runtime import PrecisionDebugger

        variants["rewritten, off"] = make_step()
        for level in ("L1", "mix"):
            debugger = PrecisionDebugger(dump_path=os.path.join(root, level), level=level, task="statistics")

            def end(debugger=debugger):
                debugger.stop()
                debugger.step()

            variants[f"ours {level}"] = make_step(begin=lambda model, d=debugger: d.start(model=model), end=end)
    else:  # msprobe-L1, msprobe-mix: the plain step first, then msprobe patches torch for good
        # one model, built before the debugger as a training script does (the TransformerConfig and the MLP
        # then hold the original F.gelu, which megatron compares with the patched one)
        level = args.worker.split("-", 1)[1]
        hooks = {}
        step = make_step(
            begin=lambda model: hooks["begin"](model) if hooks else None, end=lambda: hooks["end"]() if hooks else None
        )
        results = {"plain": measure_interleaved({"plain": step}, args.steps, args.rounds, warmup=3)["plain"]}
        from msprobe.pytorch import PrecisionDebugger

        debugger = PrecisionDebugger(dump_path=os.path.join(root, "msprobe"), level=level, task="statistics")

        def end():
            debugger.stop()
            debugger.step()

        hooks.update(begin=lambda model: debugger.start(model=model), end=end)
        try:
            results[f"msprobe {level}"] = measure_interleaved({"m": step}, args.steps, args.rounds, warmup=3)["m"]
        except Exception as error:  # noqa: BLE001 - the error is the result
            results[f"msprobe {level}"] = f"raises {type(error).__name__}: {str(error).splitlines()[0]}"
        print(json.dumps(results))
        return
    print(json.dumps(measure_interleaved(variants, args.steps, args.rounds, warmup=3)))


# ----------------------------------------------------------------------------------------- driver side


def rewritten_copy(out):
    spec = importlib.util.find_spec("megatron.core")
    source = os.path.dirname(list(spec.submodule_search_locations)[0])
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "--out", os.path.join(out, "megatron"), "--jobs", "2", "-q", source],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"rewrite failed: {done.stderr[-2000:]}")
    return time.perf_counter() - start


def tiny_bench_arguments(parser):
    """The parsed options of a bench on the tiny GPT that runs its worker in a rewritten copy
    (``python_calls.py``, ``module_path_bound.py``): its own, added to ``parser`` already, and these."""
    parser.add_argument("--config", choices=CONFIGS, default="fused")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.size, args.microbatches = "tiny", 1
    return args


def run_in_rewritten_copy(script, options, what):
    """``script --worker *options`` in a process whose megatron is a rewritten copy made for it (deleted
    after); its last stdout line, as JSON. ``what`` names the process in the message if it fails."""
    copy = tempfile.mkdtemp(prefix="megatron-rewritten-")
    try:
        rewritten_copy(copy)
        # eager, as step_factory says why
        # the caller's PYTHONPATH after the copy: the runtime measured is the one the caller imports
        path = os.pathsep.join(filter(None, (copy, os.environ.get("PYTHONPATH"))))
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCHDYNAMO_DISABLE": "1", "PYTHONPATH": path}
        done = subprocess.run(
            [sys.executable, os.path.abspath(script), "--worker", *options],
            capture_output=True,
            text=True,
            env=env,
            timeout=3600,
        )
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    if done.returncode != 0:
        sys.exit(f"the {what} process failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_worker(python, group, config, args, pythonpath=None):
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCHDYNAMO_DISABLE": "1"}  # eager: step_factory says why
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [
            python,
            os.path.abspath(__file__),
            "--worker",
            group,
            "--config",
            config,
            "--steps",
            str(args.steps),
            "--rounds",
            str(args.rounds),
            "--size",
            args.size,
            "--microbatches",
            str(args.microbatches),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if done.returncode != 0:
        last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:]
        return {"error": f"failed: {last[0] if last else done.returncode}"}
    # msprobe logs to stdout, also after our line
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def svg(table, path, title="tiny megatron-core GPT"):
    """A horizontal bar chart of the ratios (bench/charts.py)."""
    rows = []
    for config, results in table.items():
        for name, value in results.items():
            if isinstance(value, float):
                colour = "#4a7" if name.startswith(("ours", "rewritten")) else "#999"
                rows.append((f"{config}: {name}", value, f"{value:.2f}x", colour))
            else:
                rows.append((f"{config}: {name}", None, value[:70], None))
    bar_chart(rows, f"step time / plain step ({title}, CPU)", [(1.0, "1x"), (1.5, "1.5x")], path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--msprobe-python",
        help="interpreter with mindstudio-probe (default: /tmp/msprobe-venv/bin/python when it exists)",
    )
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--svg", help="write a bar chart here")
    parser.add_argument("--throughput", action="store_true", help="also bench/rewrite_throughput.py")
    parser.add_argument(
        "--size",
        choices=SIZES,
        default="tiny",
        help="tiny: the fixture's GPT (hidden 64, sequence "
        "16, batch 2); wide: hidden 512, 8 heads, sequence 128, batch 4, vocabulary 1024",
    )
    parser.add_argument("--configs", default="fused,unfused", help="bias_activation_fusion on (fused), off")
    parser.add_argument(
        "--microbatches",
        type=int,
        default=1,
        help="forward and backward passes a step, gradients accumulated (megatron's microbatches; one debugger step)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="fused", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    msprobe_python = args.msprobe_python or (
        "/tmp/msprobe-venv/bin/python" if os.path.exists("/tmp/msprobe-venv/bin/python") else None
    )
    copy = tempfile.mkdtemp(prefix="megatron-rewritten-")
    rewrite_seconds = rewritten_copy(copy)
    print(f"megatron-core rewritten into {copy} in {rewrite_seconds:.1f} s (the CLI's cache may serve it)")
    table, absolute = {}, {}
    for config in args.configs.split(","):
        best = {}
        for _ in range(2):  # every group twice, interleaved, the lower median kept
            for group, pythonpath in (("plain", None), ("rewritten", copy)):
                for name, value in run_worker(sys.executable, group, config, args, pythonpath).items():
                    best[name] = min(best.get(name, value), value) if isinstance(value, float) else value
        base = best["plain"]
        absolute[config] = {"plain step (ms)": base * 1e3}
        table[config] = {name: value / base if isinstance(value, float) else value for name, value in best.items()}
        for level in ("L1", "mix"):
            name = f"msprobe {level}"
            if not msprobe_python:
                table[config][name] = "not run (no --msprobe-python)"
                continue
            result = run_worker(msprobe_python, f"msprobe-{level}", config, args)
            if "error" in result:
                table[config][name] = result["error"]
            elif isinstance(result[name], str):
                table[config][name] = result[name]
            else:
                table[config][name] = result[name] / result["plain"]
        print(
            f"\n{config} (bias_activation_fusion={CONFIGS[config]}), {args.size} {SIZES[args.size]}, "
            f"{args.microbatches} microbatch{'es' if args.microbatches > 1 else ''} a step: "
            f"plain step {base * 1e3:.2f} ms"
        )
        for name, value in table[config].items():
            print(f"  {name:24s} " + (f"{value:5.2f}x" if isinstance(value, float) else value))
    figures = {
        "size": SIZES[args.size],
        "microbatches": args.microbatches,
        "steps": args.steps,
        "rounds": args.rounds,
        "ratios": table,
        "absolute": absolute,
    }
    if args.throughput:
        out = os.path.join(copy, "throughput.json")
        subprocess.run(
            [sys.executable, os.path.join(ROOT, "bench", "rewrite_throughput.py"), "--json", out], check=True
        )
        with open(out) as handle:
            figures["rewrite_throughput"] = json.load(handle)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)
    if args.svg:
        svg(table, args.svg, f"{args.size} megatron-core GPT")


if __name__ == "__main__":
    sys.exit(main())
