"""Every benchmark once, in small sizes (``make bench``); pass ``--full`` for the sizes the docs report.

Each script prints its figures as ratios to a baseline measured in the same run; this only runs them in turn.
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

SMALL = [
    ("overhead.py", ["--steps", "5", "--rounds", "2"]),
    ("rewrite_throughput.py", ["--limit", "40"]),
    ("rewrite_memory.py", []),
    ("import_time.py", ["--repeat", "1", "--module", "megatron.core.transformer.mlp"]),
    ("compare_dumps.py", ["--entries", "5000"]),
    ("megatron_step.py", ["--steps", "3", "--rounds", "1"]),
    ("llama_step.py", ["--small"]),
    ("gpu_llama.py", ["--device", "cpu", "--size", "tiny"]),
    # the same step on the device path (the native lane, Triton's kernels through a fake driver), in bf16
    ("gpu_llama.py", ["--device", "cpu", "--size", "tiny", "--stats", "triton-dispatch"]),
    ("triton_launches.py", ["--hidden", "64", "--steps", "2"]),
    ("triton_launches.py", ["--hidden", "64", "--steps", "2", "--summary-mode", "fingerprint"]),
    ("python_path_records.py", ["--models", "llama"]),
    ("checksums.py", ["--sizes", "1024,262144", "--steps", "3", "--rounds", "1"]),
    ("statistics_pass.py", []),
    ("statistics_share.py", ["--steps", "5"]),
    ("per_entry.py", ["--calls", "300", "--rounds", "3"]),
    # the device path's host work with Triton's dispatch (a fake driver: no GPU), launched straight where it can
    ("per_entry.py", ["--calls", "300", "--rounds", "3", "--stats", "triton-dispatch"]),
    ("triton_dispatch.py", ["--launches", "2000", "--rounds", "3"]),
    ("per_module.py", ["--cells", "10", "--rounds", "10"]),
    ("python_calls.py", ["--warmup", "3"]),
    ("compiled_step.py", ["--steps", "3", "--rounds", "1", "--warmup", "2"]),
    ("module_path_bound.py", ["--steps", "10", "--warmup", "3"]),
    ("gc_share.py", ["--steps", "10"]),
    ("precheck_replay.py", ["--calls", "100", "--tokens", "64", "--hidden", "128"]),
    ("monitor_overhead.py", ["--width", "256", "--steps", "3", "--rounds", "1"]),
]
FULL_OPTIONS = {
    "rewrite_memory.py": ["--full"],  # its own default is the small sizes
    "gpu_llama.py": ["--device", "cpu", "--size", "small"],  # its own default is CUDA
    "triton_launches.py": ["--hidden", "128", "--steps", "3"],
}
FULL = [(script, FULL_OPTIONS.get(script, [])) for script in dict.fromkeys(script for script, _ in SMALL)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full sizes (tens of minutes on 2 cores)")
    args = parser.parse_args()
    failed = []
    for script, options in FULL if args.full else SMALL:
        print(f"\n=== bench/{script} {' '.join(options)}", flush=True)
        if subprocess.run([sys.executable, os.path.join(HERE, script), *options]).returncode != 0:
            failed.append(script)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
