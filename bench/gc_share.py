"""Garbage collection per training step on the tiny megatron-core GPT of bench/megatron_step.py: what the medians
of that bench do not show. Records live until their step is written, so the collector moves them to its oldest
generation, and a full collection walks the whole heap (megatron, torch: about 90 ms here).

One process per variant (collection off, ours L1, ours mix), each on the rewritten copy of megatron-core, N steps
after warm-up; ``gc.callbacks`` time every collection. Printed per variant: collections of each generation, GC
time per step on average, and the step's median and mean (the mean carries the full collections), each as a
ratio to the step with collection off of the same run.

    python bench/gc_share.py [--steps 60] [--json FILE]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import megatron_step  # noqa: E402


def worker(level, steps):
    import argparse as _argparse
    import gc

    # eager, as bench/megatron_step.py measures it (its comment says why); compiled: bench/compiled_step.py
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    import torch

    torch.set_num_threads(1)
    gpt = megatron_step._fixture()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(gpt.free_port())
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    gpt.parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    gpt.cpu_stand_ins(1234)
    config = _argparse.Namespace(bias_activation_fusion=False, gated_linear_unit=False, tp=1)
    tokens = torch.randint(0, gpt.VOCAB, (gpt.BATCH, gpt.SEQ + 1), generator=torch.Generator().manual_seed(42))
    position_ids = torch.arange(gpt.SEQ).unsqueeze(0).expand(gpt.BATCH, gpt.SEQ)
    mask = torch.tril(torch.ones(1, 1, gpt.SEQ, gpt.SEQ)) < 0.5
    torch.manual_seed(1234)
    model = gpt.build_model(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    debugger = None
    if level != "off":
        from msprobe_runtime import PrecisionDebugger

        debugger = PrecisionDebugger(dump_path=tempfile.mkdtemp(prefix="gc-share-"), level=level, task="statistics")

    def step():
        optimizer.zero_grad(set_to_none=True)
        if debugger:
            debugger.start(model=model)
        loss = model(tokens[:, :-1], position_ids, mask, labels=tokens[:, 1:]).float().mean()
        loss.backward()
        if debugger:
            debugger.stop()
            debugger.step()
        optimizer.step()

    for _ in range(5):
        step()
    events = []
    gc.callbacks.append(lambda phase, info: events.append((phase, info["generation"], time.perf_counter())))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    gc.callbacks.pop()
    if debugger:
        debugger.wait()
    counts, seconds = [0, 0, 0], 0.0
    for (phase, generation, begin), (_, _, end) in zip(events[::2], events[1::2]):
        counts[generation] += 1
        seconds += end - begin
    print(
        json.dumps(
            {
                "collections": counts,
                "gc_ms_per_step": seconds / steps * 1e3,
                "median_ms": statistics.median(times) * 1e3,
                "mean_ms": statistics.fmean(times) * 1e3,
            }
        )
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps)
    out = tempfile.mkdtemp(prefix="gc-share-megatron-")
    megatron_step.rewritten_copy(out)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCHDYNAMO_DISABLE": "1", "PYTHONPATH": out}  # eager, above
    results = {}
    for level in ("off", "L1", "mix"):
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--worker", level, "--steps", str(args.steps)],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        if done.returncode != 0:
            sys.exit(f"{level} failed: {done.stderr[-2000:]}")
        results[level] = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    shutil.rmtree(out, ignore_errors=True)
    plain = results["off"]
    print(
        f"tiny megatron GPT, rewritten copy, {args.steps} steps; ratios to collection off in this run "
        f"(median {plain['median_ms']:.2f} ms, mean {plain['mean_ms']:.2f} ms)"
    )
    for level, r in results.items():
        print(
            f"  {level:6s} collections gen0/1/2 {r['collections'][0]:4d} / {r['collections'][1]:3d} / "
            f"{r['collections'][2]:2d}   GC {r['gc_ms_per_step']:5.2f} ms/step   "
            f"median {r['median_ms'] / plain['median_ms']:.2f}x   mean {r['mean_ms'] / plain['mean_ms']:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
