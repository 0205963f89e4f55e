"""Per-tensor statistics on one CPU thread: the fused native op (runtime/native_stats.py) against the torch-op
fallback (amax, amin, mean, norm, stack; isnan/isinf sums for the counts), per dtype and size. Best of 7
rounds, microseconds per tensor.

Then the same passes over tensors that are not in cache, as a step meets a weight or its gradient: 1 MiB
tensors taken in turn from a working set larger than this machine's caches, median microseconds per tensor,
with ``torch.sum`` (one read of the data by torch's own kernel) as the baseline of the same run.

    python bench/statistics_pass.py [--threads 1] [--cold-mib 64]
"""

import argparse
import sys
import time


def best_us(fn, t, calls, rounds=7):
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn(t)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def cold_us(fns, pool, rounds=5):
    """Median µs per tensor of each of ``fns`` over ``pool``, taken in turn round by round (these machines drift
    over seconds); each tensor is read again only after the whole pool, so it comes from memory, not cache."""
    times = [[] for _ in fns]
    for fn in fns:  # first use: page faults, the op's dispatch warmed
        for t in pool:
            fn(t)
    for _ in range(rounds):
        for fn, out in zip(fns, times):
            for t in pool:
                start = time.perf_counter()
                fn(t)
                out.append(time.perf_counter() - start)
    return [sorted(out)[len(out) // 2] * 1e6 for out in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cold-mib", type=int, default=64, help="working set of the out-of-cache rows")
    args = parser.parse_args()
    import torch

    from msprobe_runtime import native_stats

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    native = native_stats.load()
    print(f"native op loaded in {time.perf_counter() - start:.2f} s from {native_stats.build_directory()}")
    if native is None:
        print("the native op cannot be built here")
        return 1

    def four(t):
        if t.dtype is torch.float32:
            flat = t.reshape(-1)
            norm = torch.dot(flat, flat).sqrt()
        else:
            norm = torch.linalg.vector_norm(t)
        return torch.stack((t.amax(), t.amin(), t.mean(), norm))

    def counts(t):
        return torch.stack((torch.isnan(t).sum(), torch.isinf(t).sum()))

    print(f"{'dtype':10s} {'elements':>9s} {'native':>9s} {'+counts':>9s} {'torch 4':>9s} {'torch cnt':>9s}  (µs)")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for numel in (512, 4096, 262_144, 1 << 20, 4 << 20):
            t = torch.randn(numel).to(dtype)
            calls = 1000 if numel < 10_000 else max(3, 2_000_000 // numel)
            row = [
                best_us(lambda t: native.stats(t, False), t, calls),
                best_us(lambda t: native.stats(t, True), t, calls),
                best_us(four, t, calls),
                best_us(counts, t, calls),
            ]
            print(f"{str(dtype).replace('torch.', ''):10s} {numel:9d} " + " ".join(f"{v:9.1f}" for v in row))

    print(f"\nout of cache: 1 MiB tensors in turn from {args.cold_mib} MiB, median µs per tensor")
    print(
        f"{'dtype':10s} {'elements':>9s} {'native':>9s} {'+counts':>9s} {'torch 4':>9s} {'torch.sum':>9s} "
        f"{'native/sum':>10s}"
    )
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        numel = (1 << 20) // torch.empty((), dtype=dtype).element_size()
        pool = [torch.randn(numel).to(dtype) for _ in range(args.cold_mib)]
        row = cold_us([lambda t: native.stats(t, False), lambda t: native.stats(t, True), four, torch.sum], pool)
        print(
            f"{str(dtype).replace('torch.', ''):10s} {numel:9d} "
            + " ".join(f"{v:9.1f}" for v in row)
            + f" {row[0] / row[3]:9.2f}x"
        )
        del pool
    return 0


if __name__ == "__main__":
    sys.exit(main())
