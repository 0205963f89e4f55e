"""Launches the Triton statistics kernels add per recorded entry, counted on a transformers Llama in bfloat16 (issue
31: at most one per recorded call on average), and where in the collector each comes from.

    python bench/triton_launches.py                          # hidden 128, 2 layers, L1 and mix, 3 steps
    python bench/triton_launches.py --hidden 64 --steps 2    # what `make bench` runs
    python bench/triton_launches.py --json out.json
    python bench/triton_launches.py --path python            # the records made in Python (no native op)
    python bench/triton_launches.py --summary-mode fingerprint   # each tensor hashed too (its kernels counted)

Without a GPU the kernels run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set here before Triton
is imported; CPU tensors taken as a CUDA tensor is, as tests/runtime/test_native_lane.py runs them): the launches a GPU
would make, not its time. ``--path lane`` (the default): the records of device tensors made by the native op's Recorder
where it builds, as a GPU run makes them (``triton_cpu="lane"``); ``--path python``: by the runtime's Python path
(``native=False, triton_cpu=True``), as where the op does not build. With one (``--device cuda``), on the device,
compiled. A step is forward with labels, backward, AdamW (foreach) and zero_grad between ``start`` and ``stop``; the
first step is left out (it makes the kernels and has no earlier reads to serve again). Counted per launch: ``_partials``
(one tensor), ``_partials_few`` (two to four, by their addresses), ``_partials_many`` (more, from a table), ``_finish``
(one per arena at the flush), each under the collector's method that made it; with ``--summary-mode fingerprint``
the fingerprint's kernels too (``_hash_few``, ``_partials_hash_few`` with a call's statistics, ``_hash_finish``; an
older runtime's ``_hash``). Each level runs in its own process, so
that one level's state (the kernels made, the tensors remembered) is not the next's.
"""

import argparse
import collections
import glob
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

# the collector's methods a launch is attributed to: the first of these (in this order) on the stack of its launch
PHASES = {
    "_begin_api": "a call's inputs, before it",
    "_finish_api": "a call's output (and inputs read after it)",
    "module_forward_begin": "a module's inputs",
    "module_forward_end": "a module's output and parameters",
    "record_param_grad": "a parameter's gradient",
    "take": "the flush",
    "end_call": "a backward hook's gradients",
    "_lane_launch": "a backward hook's gradients (the native lane)",
}


def run_level(args):
    """One level in this process: ``{"entries": ..., "launches": ..., "by_phase": {...}}`` per step after the first."""
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton's first import: the kernels run on CPU tensors
    import torch
    import transformers

    import msprobe_runtime
    from msprobe_runtime import collector, statistics
    from msprobe_runtime import triton_stats as kernels

    torch.set_num_threads(1)
    if args.device == "cpu" and args.path == "lane":
        collector.StatBuffer = lambda counts: statistics.StatBuffer(counts, triton_cpu="lane")
    elif args.device == "cpu":
        collector.StatBuffer = lambda counts: statistics.StatBuffer(counts, native=False, triton_cpu=True)
    elif args.path == "python":
        os.environ["MSPROBE_NATIVE_LANE"] = "0"
    counted = collections.Counter()
    state = {"counting": False}

    def phase():
        names, frame = set(), sys._getframe(2)
        while frame is not None:
            names.add(frame.f_code.co_name)
            frame = frame.f_back
        # end_call last but one: the forward's records close their launches through it too
        return next((name for name in PHASES if name in names), "elsewhere (a record outside a batch)")

    class Counted:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            if state["counting"]:
                counted[(self.name, phase())] += 1
            return self.kernel[grid]

    for name in ("_partials", "_partials_few", "_partials_many", "_finish"):
        if hasattr(kernels, name):  # an older runtime (PYTHONPATH) has fewer kernels
            setattr(kernels, name, Counted(getattr(kernels, name), name))
    if args.summary_mode == "fingerprint":  # the fingerprint's kernels, this runtime's or an older one's
        from msprobe_runtime import triton_fingerprint

        for name in ("_hash", "_hash_finish", "_hash_few", "_partials_hash_few"):
            if hasattr(triton_fingerprint, name):
                setattr(triton_fingerprint, name, Counted(getattr(triton_fingerprint, name), name))
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.seq,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device=args.device, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    ids = torch.randint(3, 256, (2, args.seq), device=args.device)
    dump = tempfile.mkdtemp(prefix="triton_launches_")
    config = os.path.join(dump, "config.json")
    with open(config, "w") as handle:
        json.dump({"statistics": {"summary_mode": args.summary_mode}}, handle)
    debugger = msprobe_runtime.PrecisionDebugger(
        config_path=config, dump_path=os.path.join(dump, "dump"), level=args.level, task="statistics"
    )
    for step in range(args.steps):
        state["counting"] = step > 0
        debugger.start(model)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        debugger.stop()
        debugger.step()
    debugger.wait()
    paths = sorted(glob.glob(os.path.join(glob.escape(dump), "dump", "step*", "*", "dump.json")))
    with open(paths[-1]) as handle:
        data = json.load(handle)["data"]
    steps = args.steps - 1
    forward = sum(1 for name in data if name.endswith(".forward"))
    launches = sum(counted.values()) / steps
    by_phase = collections.Counter()
    for (kernel, where), count in counted.items():
        by_phase[f"{kernel} in {where}"] += count / steps
    return {
        "level": args.level,
        "entries": len(data),
        "forward entries": forward,
        "launches": launches,
        "per entry": round(launches / len(data), 3),
        "by phase": dict(by_phase.most_common()),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--levels", default="L1,mix")
    parser.add_argument("--path", default="lane", choices=("lane", "python"), help="who makes device tensors' records")
    parser.add_argument(
        "--summary-mode",
        default="statistics",
        choices=("statistics", "fingerprint"),
        help="statistics.summary_mode: fingerprint hashes every recorded tensor too (its kernels counted with them)",
    )
    parser.add_argument("--level", help=argparse.SUPPRESS)  # one level, in the worker process
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be 2 or more: the first step is left out")
    if args.level:
        print(json.dumps(run_level(args)))
        return 0
    if importlib.util.find_spec("triton") is None:
        print("skipped: Triton is not installed here (pip install triton)")
        return 0
    rows = []
    for level in args.levels.split(","):
        command = [sys.executable, os.path.abspath(__file__), "--level", level]
        for option in ("device", "hidden", "layers", "seq", "steps", "path", "summary_mode"):
            command += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            return 1
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(
        f"bf16 Llama, hidden {args.hidden}, {args.layers} layers, sequence {args.seq}, {args.device}, "
        f"records by the {'native lane' if args.path == 'lane' else 'Python path'}, summary_mode {args.summary_mode}"
    )
    print("| level | entries a step | forward entries | launches a step | launches per entry |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['level']} | {row['entries']} | {row['forward entries']} | {row['launches']:.0f} | "
            f"{row['per entry']:.2f} |"
        )
    for row in rows:
        print(f"\n{row['level']}, launches a step by where they are made:")
        for where, count in row["by phase"].items():
            kernel, _, method = where.partition(" in ")
            print(f"  {count:7.1f}  {kernel:15s} {PHASES.get(method, method)}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
