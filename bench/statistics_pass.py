"""Per-tensor statistics on one CPU thread: the fused native op (runtime/native_stats.py) against the torch-op
fallback (amax, amin, mean, norm, stack; isnan/isinf sums for the counts), per dtype and size. Best of 7
rounds, microseconds per tensor.

    python bench/statistics_pass.py [--threads 1]
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
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
            row = [best_us(lambda t: native.stats(t, False), t, calls),
                   best_us(lambda t: native.stats(t, True), t, calls),
                   best_us(four, t, calls), best_us(counts, t, calls)]
            print(f"{str(dtype).replace('torch.', ''):10s} {numel:9d} " + " ".join(f"{v:9.1f}" for v in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
