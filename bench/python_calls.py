"""Python calls per recorded entry on megatron's tiny GPT: what the runtime costs, counted rather than timed.

A step's host time on this machine varies by 10-50 % from minute to minute (a shared 2-core VM), more than a
change to the per-entry path moves it; the number of Python functions the runtime enters is the same in
every run, within a dozen calls (where the step's flush meets its writing process). One steady training step (after
``--warmup`` steps, called from the same line, so that its call
stacks are those of the steps before) is counted with ``sys.setprofile``: every Python function entered
(``call``), and every builtin called (``c_call``), split into the runtime's own and the rest (megatron,
torch's Python). Each variant's figures are given per recorded entry (the entries of that step's dump.json)
and as a ratio to the same step's count with collection off (rewritten copy, no debugger).

    python bench/python_calls.py [--config fused|unfused] [--top 12] [--json FILE]
"""

import argparse
import collections
import glob
import json
import os
import shutil
import sys

import megatron_step

LEVELS = ("off", "L1", "mix")


def count_step(step, warmup):
    """(Python calls by (file, function), C calls) of the step after ``warmup`` steps."""
    python, builtin = collections.Counter(), [0]

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            python[(code.co_filename, code.co_name)] += 1
        elif event == "c_call":
            builtin[0] += 1

    for index in range(warmup + 1):
        if index == warmup:
            sys.setprofile(profile)
        step()  # one line for every step: the counted step's call stacks are the ones of the steps before
    sys.setprofile(None)
    return python, builtin[0]


def worker(args):
    make_step, root = megatron_step.step_factory(args)
    import msprobe_runtime
    from msprobe_runtime import PrecisionDebugger

    runtime_dir = os.path.dirname(msprobe_runtime.__file__)  # the package this process imported

    results = {}
    for level in LEVELS:
        if level == "off":
            step = make_step()
            debugger = None
        else:
            debugger = PrecisionDebugger(dump_path=os.path.join(root, level), level=level, task="statistics")

            def end(debugger=debugger):
                debugger.stop()
                debugger.step()

            step = make_step(begin=lambda model, d=debugger: d.start(model=model), end=end)
        python, builtin = count_step(step, args.warmup)
        entries = 0
        if debugger is not None:
            debugger.wait()
            dumps = glob.glob(os.path.join(root, level, f"step{args.warmup}", "*", "dump.json"))
            with open(dumps[0], encoding="utf-8") as handle:
                entries = len(json.load(handle)["data"])
        ours = {
            f"{os.path.basename(path)}:{name}": count
            for (path, name), count in python.items()
            if path.startswith(runtime_dir)
        }
        results[level] = {
            "python": sum(python.values()),
            "runtime": sum(ours.values()),
            "builtin": builtin,
            "entries": entries,
            "top": collections.Counter(ours).most_common(args.top),
        }
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(results))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=12, help="the runtime's functions entered most, at mix")
    args = megatron_step.tiny_bench_arguments(parser)
    if args.worker:
        return worker(args)
    results = megatron_step.run_in_rewritten_copy(
        __file__, ["--config", args.config, "--warmup", str(args.warmup), "--top", str(args.top)], "counting"
    )
    off = results["off"]
    print(f"tiny megatron GPT ({args.config}), one steady step, counted with sys.setprofile")
    print(
        f"  {'':4s} {'Python calls':>13s} {'of them ours':>13s} {'builtin calls':>14s} {'entries':>8s} "
        f"{'ours/entry':>11s} {'Python calls / off':>19s}"
    )
    for level, row in results.items():
        per_entry = f"{row['runtime'] / row['entries']:.1f}" if row["entries"] else "-"
        print(
            f"  {level:4s} {row['python']:13d} {row['runtime']:13d} {row['builtin']:14d} {row['entries']:8d} "
            f"{per_entry:>11s} {row['python'] / off['python']:18.2f}x"
        )
    print("  the runtime's functions entered most at mix:")
    for name, count in results["mix"]["top"]:
        print(f"    {count:6d}  {name}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"config": args.config, "levels": results}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
