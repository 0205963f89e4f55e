"""Time and peak memory of ``msprobe-rewrite compare`` against ``msprobe compare`` on the same two dumps.

    python bench/compare_dumps.py                        # two synthetic dumps of 100 000 entries each
    python bench/compare_dumps.py --entries 5000         # a quick run
    python bench/compare_dumps.py --msprobe-python PATH  # msprobe's interpreter (default /tmp/msprobe-venv)

The two dumps are synthetic, level L1, task statistics, in msprobe's format: a transformer-like pattern of
APIs (forward entries, then backward entries in reverse), 1-3 input tensors and one output each, with
stack.json call sites; run B is run A with a 1 % error injected at the middle entry and everything after it
moved by up to 1e-4. Each tool runs as its own process (interpreter start-up and imports included) and is
measured from outside: wall time, CPU time (robust on a shared machine) and peak resident memory, from
``os.wait4``'s rusage of that child.
Figures are printed as ratios of ours to msprobe's. msprobe's row is "not yet" when its interpreter is
missing (install it with: python -m venv --system-site-packages /tmp/msprobe-venv &&
/tmp/msprobe-venv/bin/pip install mindstudio-probe==26.2.0).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERN = [
    ("Functional.linear", 3),
    ("Functional.gelu", 1),
    ("Tensor.__add__", 2),
    ("Functional.layer_norm", 3),
    ("Torch.matmul", 2),
    ("Functional.softmax", 1),
    ("Tensor.__mul__", 2),
    ("Functional.dropout", 1),
    ("Tensor.view", 1),
    ("Torch.tanh", 1),
]


def _record(rng, scale=1.0, numel=4096):
    norm = rng.uniform(10, 100)
    return {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": [64, numel // 64],
        "Max": rng.uniform(1, 5) * scale,
        "Min": -rng.uniform(1, 5) * scale,
        "Mean": rng.uniform(-0.1, 0.1) * scale,
        "Norm": norm * scale,
        "requires_grad": True,
    }


def write_dump(directory, entries, seed=0, fault_at=None):
    """A dump of ``entries`` entries; with ``fault_at``, that entry's output is 1 % off and later ones drift."""
    rank = os.path.join(directory, "step0", "rank0")
    os.makedirs(rank)
    forward = entries // 2
    names = []
    counts = {}
    for index in range(forward):
        api, inputs = PATTERN[index % len(PATTERN)]
        call = counts.get(api, 0)
        counts[api] = call + 1
        names.append((api, call, inputs, index % len(PATTERN)))
    order = [(api, call, inputs, line, "forward") for api, call, inputs, line in names]
    order += [(api, call, inputs, line, "backward") for api, call, inputs, line in reversed(names)]
    order = order[:entries]
    rng = random.Random(seed)
    drift = random.Random(seed + 1)
    with open(os.path.join(rank, "dump.json"), "w") as dump, open(os.path.join(rank, "stack.json"), "w") as stack:
        dump.write('{"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": null, "data": {')
        stack.write("{")
        for position, (api, call, inputs, line, direction) in enumerate(order):
            name = f"{api}.{call}.{direction}"
            ins = [_record(rng) for _ in range(inputs)]
            out = _record(rng)
            if fault_at is not None and position >= fault_at:
                factor = 1.01 if position == fault_at else 1 + drift.uniform(-1e-4, 1e-4)
                for key in ("Max", "Min", "Mean", "Norm"):
                    out[key] *= factor
                if position > fault_at:
                    for record in ins:
                        record["Norm"] *= 1 + drift.uniform(-1e-4, 1e-4)
            if direction == "forward":
                entry = {"input_args": ins, "input_kwargs": {}, "output": [out]}
            else:
                entry = {"input": [out], "output": ins}
            dump.write(("," if position else "") + json.dumps(name) + ":" + json.dumps(entry))
            if direction == "forward":
                frames = [
                    f"File /work/model/layers.py, line {100 + line}, in forward, \n x = op(x)",
                    "File /work/train.py, line 42, in step, \n loss = model(batch)",
                ]
                stack.write(("," if position else "") + json.dumps(str(position)) + ":" + json.dumps([[name], frames]))
        dump.write("}}")
        stack.write("}")
    with open(os.path.join(rank, "construct.json"), "w") as handle:
        handle.write("{}")
    return rank


def measure(command, cwd=None):
    """(wall seconds, peak RSS in MiB, exit status, output tail, CPU seconds) of one child process."""
    start = time.perf_counter()
    child = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
    )
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - start
    return (
        elapsed,
        usage.ru_maxrss / 1024,
        child.returncode,
        output.decode(errors="replace")[-2000:],
        usage.ru_utime + usage.ru_stime,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--msprobe-python", default="/tmp/msprobe-venv/bin/python")
    parser.add_argument("--keep", help="write the dumps and reports under this directory and keep them")
    args = parser.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="compare-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        started = time.perf_counter()
        run_a = write_dump(os.path.join(work, "a"), args.entries, seed=0, fault_at=args.entries // 4)
        run_b = write_dump(os.path.join(work, "b"), args.entries, seed=0)
        size = os.path.getsize(os.path.join(run_a, "dump.json")) / 2**20
        print(
            f"two synthetic dumps of {args.entries} entries ({size:.0f} MiB of dump.json each), "
            f"written in {time.perf_counter() - started:.1f} s"
        )

        ours = measure(
            [sys.executable, "-m", "msprobe_rewrite", "compare", run_a, run_b, "-q", "-o", os.path.join(work, "ours")]
        )
        if ours[2] not in (0, 1):
            print(ours[3])
            return 2
        with open(os.path.join(work, "ours", "compare_summary.json")) as handle:
            first = json.load(handle)["first_divergence"]
        print(
            f"ours:    {ours[0]:8.1f} s wall {ours[4]:8.1f} s CPU {ours[1]:8.0f} MiB peak RSS   first divergence: "
            f"{first['entry'] if first else None}"
        )

        python = args.msprobe_python
        cli = os.path.join(os.path.dirname(python), "msprobe")
        if not os.path.exists(python) or not os.path.exists(cli):
            print("msprobe: not yet (no interpreter with mindstudio-probe at --msprobe-python)")
            print("ratio ours/msprobe: not yet")
            return 0
        out = os.path.join(work, "msprobe")
        os.makedirs(out, exist_ok=True)
        theirs = measure(
            [
                cli,
                "compare",
                "-tp",
                os.path.join(run_a, "dump.json"),
                "-gp",
                os.path.join(run_b, "dump.json"),
                "-o",
                out,
            ],
            cwd=work,
        )
        rows = glob.glob(os.path.join(out, "compare_result_*.csv"))
        if theirs[2] != 0 or not rows:
            print(f"msprobe: failed (exit {theirs[2]}):\n{theirs[3]}")
            print("ratio ours/msprobe: not yet")
            return 0
        print(f"msprobe: {theirs[0]:8.1f} s wall {theirs[4]:8.1f} s CPU {theirs[1]:8.0f} MiB peak RSS")
        print(
            f"ratio ours/msprobe: wall time {ours[0] / theirs[0]:.3f}x, CPU time {ours[4] / theirs[4]:.3f}x, "
            f"peak memory {ours[1] / theirs[1]:.3f}x"
        )
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
