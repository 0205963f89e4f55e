"""Time of ``msprobe-rewrite precheck`` on a task 'tensor' dump of N API calls, against running those calls
once on the CPU in float64.

    python bench/precheck_replay.py                 # 1 000 calls, tokens 256, hidden 512
    python bench/precheck_replay.py --calls 200     # a quick run

The dump is synthetic, in msprobe's format (dump.json + dump_tensor_data/*.pt, forward entries): a
transformer-like pattern of float32 calls (linear, gelu, add, layer_norm, matmul, softmax, mul), real inputs
and outputs computed here, so every call passes. The reference is those calls run once in float64 in this
process (tensors already in memory, torch's default threads); the pre-check runs as its own process, from
interpreter start to written reports, with its default jobs (all available cores). The figures are the ratios
check / reference of wall time (the issue's bound: under 2) and of CPU time (robust on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pattern(tokens, hidden, generator):
    def t(*shape, scale=1.0):
        return torch.randn(*shape, generator=generator) * scale

    x = t(tokens, hidden)
    w1, w2 = t(hidden * 2, hidden, scale=hidden**-0.5), t(hidden, hidden * 2, scale=(2 * hidden) ** -0.5)
    q, k = t(tokens, hidden // 4), t(hidden // 4, tokens)
    return [
        ("Functional.linear", F.linear, [x, w1], {}),
        ("Functional.gelu", F.gelu, [t(tokens, hidden * 2)], {}),
        ("Functional.linear", F.linear, [t(tokens, hidden * 2), w2], {}),
        ("Tensor.__add__", torch.Tensor.__add__, [x, t(tokens, hidden)], {}),
        ("Functional.layer_norm", F.layer_norm, [x, [hidden]], {}),
        ("Torch.matmul", torch.matmul, [q, k], {}),
        ("Functional.softmax", F.softmax, [t(tokens, tokens)], {"dim": -1}),
        ("Tensor.__mul__", torch.Tensor.__mul__, [x, t(tokens, hidden)], {}),
    ]


def _record(value, data_name=None):
    if isinstance(value, torch.Tensor):
        record = {
            "type": "torch.Tensor",
            "dtype": str(value.dtype),
            "shape": list(value.shape),
            "Max": None,
            "Min": None,
            "Mean": None,
            "Norm": None,
            "requires_grad": False,
        }
        if data_name:
            record["data_name"] = data_name
        return record
    if isinstance(value, list):
        return [_record(v) for v in value]
    return {"type": type(value).__name__, "value": value}


def make_dump(root, calls, tokens, hidden):
    rank = os.path.join(root, "step0", "rank0")
    data_dir = os.path.join(rank, "dump_tensor_data")
    os.makedirs(data_dir)
    generator = torch.Generator().manual_seed(0)
    pattern = _pattern(tokens, hidden, generator)
    counts, data, replay = {}, {}, []
    for i in range(calls):
        api, fn, args, kwargs = pattern[i % len(pattern)]
        index = counts.get(api, 0)
        counts[api] = index + 1
        entry_name = f"{api}.{index}.forward"
        records = []
        for position, arg in enumerate(args):
            name = f"{entry_name}.input.{position}.pt" if isinstance(arg, torch.Tensor) else None
            if name:
                torch.save(arg, os.path.join(data_dir, name))
            records.append(_record(arg, name))
        out = fn(*args, **kwargs)
        torch.save(out, os.path.join(data_dir, f"{entry_name}.output.0.pt"))
        data[entry_name] = {
            "input_args": records,
            "input_kwargs": {k: _record(v) for k, v in kwargs.items()},
            "output": [_record(out, f"{entry_name}.output.0.pt")],
        }
        replay.append((fn, args, kwargs))
    with open(os.path.join(rank, "dump.json"), "w") as handle:
        json.dump(
            {"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}, handle
        )
    return replay


def reference_seconds(replay):
    """(wall, CPU) seconds of the calls run once in float64."""
    wide = [
        (fn, [a.double() if isinstance(a, torch.Tensor) else a for a in args], kwargs) for fn, args, kwargs in replay
    ]
    started, cpu = time.perf_counter(), time.process_time()
    for fn, args, kwargs in wide:
        fn(*args, **kwargs)
    return time.perf_counter() - started, time.process_time() - cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="precheck_bench_")
    try:
        replay = make_dump(os.path.join(root, "dump"), args.calls, args.tokens, args.hidden)
        reference, reference_cpu = min(reference_seconds(replay) for _ in range(2))
        command = [
            sys.executable,
            "-m",
            "msprobe_rewrite",
            "precheck",
            os.path.join(root, "dump"),
            "-o",
            os.path.join(root, "out"),
            "-q",
        ] + (["-j", str(args.jobs)] if args.jobs else [])
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        check = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        check_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        summary = json.load(open(os.path.join(root, "out", "precheck_summary.json")))
        print(
            f"calls {args.calls}, tokens {args.tokens}, hidden {args.hidden}, jobs {summary['jobs']}: "
            f"exit {done.returncode}, {summary['counts']}"
        )
        print(
            f"wall: float64 reference {reference:.2f} s, precheck {check:.2f} s: ratio {check / reference:.2f} "
            "(bound: < 2)"
        )
        # on a shared machine wall time measures the neighbours too; CPU time is the work done
        print(
            f"CPU:  float64 reference {reference_cpu:.2f} s, precheck {check_cpu:.2f} s (all its processes): "
            f"ratio {check_cpu / reference_cpu:.2f}"
        )
        return 0 if done.returncode == 0 else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
