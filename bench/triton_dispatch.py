"""Host time of one launch of the statistics kernels, through Triton's run and straight to the compiled kernel.

Triton's ``JITFunction.run`` against ``triton_launch.KernelLaunch``'s launch straight to the compiled kernel, without
a GPU.

Triton's real dispatch runs (its binder, its specialisation, its cache key, its kernel cache), through a fake CUDA
driver whose compiled kernels do nothing but count (fixtures/fake_triton_driver.py): so the figures are Triton's
Python and ours per launch (its CUDA launcher's Python ``__call__`` included, which a launch straight to the compiled
kernel skips where the fake has Triton's launcher: 3.6 and 3.9), not the C launcher's nor the driver's, which only a
GPU measures. The fake kernel's own ``run`` call through Triton's launcher is given first.

    python bench/triton_dispatch.py [--launches 20000] [--rounds 5]
"""

import argparse
import os
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)  # Triton's compiled-kernel path, not its interpreter
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from fixtures.fake_triton_driver import install

    install(keep=False)
    import torch

    from msprobe_runtime import triton_launch
    from msprobe_runtime import triton_stats as ts

    if not triton_launch.direct_on():
        print(f"launches straight to compiled kernels are off here (Triton {triton_launch.triton.__version__})")
        return 0
    part = torch.empty((64, 6), dtype=torch.float64)
    meta = torch.empty((16, 8), dtype=torch.int64)
    x = torch.zeros(1024)
    one = (x, 1024, 1, part, meta, 0, 0, 4, 1, 0, 1, 1, 1, 0, 0, 0, 0)
    one_constants = (True, False, ts._BLOCK, 0, 0.0)
    few = (part, meta, x, x, x, x, 16, 17, 1024, 1, 1, 1, 1, 1, 2, 0, 0, 0) + (1, 2, 3, 0, 1, 2, 3, 1, 1, 1, 1, 0, 0)
    launch_one = triton_launch.KernelLaunch(
        vars(ts), "_partials", ("CONTIGUOUS", "WIDE", "BLOCK", "LOW", "TOP"), enable_fp_fusion=False
    )
    launch_few = triton_launch.KernelLaunch(vars(ts), "_partials_few", ("BLOCK",), enable_fp_fusion=False)
    kept = launch_one(4, one, one_constants)  # the first launch of each: compiled (here, faked) and kept
    launch_few(4, few, (ts._BLOCK,))
    compiled = kept[0]
    n = args.launches

    def seconds(body):
        best = float("inf")
        for _ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(n):
                body()
            best = min(best, time.perf_counter() - start)
        return best / n

    tail = kept[1]
    floor = seconds(lambda: compiled.run(4, 1, 1, 7000, None, None, None, None, None, *one, *tail))
    rows = {
        "_partials, one tensor (17 arguments)": (
            lambda: ts._partials[(4,)](
                *one, CONTIGUOUS=True, WIDE=False, BLOCK=ts._BLOCK, LOW=0, TOP=0.0, enable_fp_fusion=False
            ),
            lambda: launch_one(4, one, one_constants),
        ),
        "_partials_few, four tensors (31 arguments)": (
            lambda: ts._partials_few[(4,)](*few, BLOCK=ts._BLOCK, enable_fp_fusion=False),
            lambda: launch_few(4, few, (ts._BLOCK,)),
        ),
    }
    print(f"the fake kernel's run alone: {floor * 1e6:.2f} us\n")
    print(f"{'host time per launch':44s} {'Triton run':>12s} {'straight':>12s} {'saved':>7s}")
    for name, (through_triton, straight) in rows.items():
        a, b = seconds(through_triton), seconds(straight)
        print(f"  {name:42s} {a * 1e6:9.2f} us {b * 1e6:9.2f} us {a / b:6.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
