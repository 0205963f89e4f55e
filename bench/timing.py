"""Step timing shared by the benchmarks: variants that take turns, so that drift of a shared machine falls on
all of them alike."""

import statistics
import time


def measure_interleaved(variants, steps, rounds, warmup=5):
    """Median seconds per call of each variant (``{name: step}``): ``warmup`` calls each first, then in every
    round each variant runs ``steps`` times in turn."""
    times = {name: [] for name in variants}
    for step in variants.values():
        for _ in range(warmup):
            step()
    for _ in range(rounds):
        for name, step in variants.items():
            for _ in range(steps):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}
