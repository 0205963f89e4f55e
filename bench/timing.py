"""Step timing shared by the benchmarks: variants that take turns, so that drift of a shared machine falls on
all of them alike."""

import statistics
import time


def measure_interleaved(variants, steps, rounds, warmup=5, clock=time.perf_counter):
    """Median seconds per call of each variant (``{name: step}``): ``warmup`` calls each first, then in every
    round each variant runs ``steps`` times in turn. ``clock``: ``time.process_time`` counts this process's CPU
    time only, steadier than the wall clock on a shared machine for a one-thread CPU run."""
    times = {name: [] for name in variants}
    for step in variants.values():
        for _ in range(warmup):
            step()
    for _ in range(rounds):
        for name, step in variants.items():
            for _ in range(steps):
                start = clock()
                step()
                times[name].append(clock() - start)
    return {name: statistics.median(values) for name, values in times.items()}
