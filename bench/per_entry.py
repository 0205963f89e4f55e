"""Host time per recorded entry at L1, and its parts, on one CPU thread.

A call of one small tensor in and one out (``torch.relu`` on 16 floats, so the op itself costs about a
microsecond) is made ``--calls`` times from code that looks rewritten (its globals hold ``__msprobe__``, so no
observing mode is pushed), with collection off and on; the difference, per call, is what one entry costs the
training thread. Each figure is also given as a multiple of the plain call measured in the same run.

Scenarios: a shallow stack; ``--depth`` more Python frames under the call (a Megatron layer's API call sits
about 40 deep); the same depth outside a module whose forward makes the calls (the stack outside a running
module call is captured once: call_stacks.Anchors); an input that requires grad (the backward hook is
attached); a cast (``Tensor.to`` float32 to float16: a call's tensors of two dtypes); a slice (every other of 32
floats: an input whose elements do not fill a block, as rotary embeddings' halves); int64 ids (16 of them, as token
and position ids: an input and an output of ``relu``); a bool mask (16, as an attention mask: ``logical_not``'s input
and output); the backward entry
that such a call later records, timed over ``loss.backward()`` of a chain of calls, and the same with a transpose
after each call (its gradients transposed: attention's are, through its reshapes); and the flush of the shallow
stack's step (``debugger.stop(); debugger.step()``), per entry. Then the steady loop (``--steady`` seconds): the
shallow stack's steps one after another, each flushed, its mean time a call (not the best round: a full collection of
the garbage collector comes once in many steps, and the best rounds leave it out), with the collector's own share; and
the same with the chain's backward in each step (its time less the plain chain's forward and backward, per call).

Parts (the current runtime's own functions, called alone on a collecting collector): naming, the input and
output records (metadata, and the statistics by the native op where it serves; on a device path each record within
a call's ``begin``/``end``, so with its own launch, where a call's records share one), the call stack's capture at
``--depth``, and the backward attachment; "the rest" is the total less the parts (entry dicts, locks,
``in_api`` bookkeeping, the shim and the call itself).

    python bench/per_entry.py [--calls 2000] [--rounds 7] [--depth 40] [--device cpu] [--json FILE]
                              [--stats {default,torch-ops,triton-stub,triton-stub-python,triton-dispatch}]
                              [--before FILE --svg docs/per_entry.svg]

``--device cuda``: the tensors of the calls on that device (the accelerator's host path: the statistics launched
there, by the Triton kernels or the torch ops, where on the CPU the native op serves); the device is
synchronised after each timed body, so the time is the host's unless the device falls behind. Run it beside
``--device cpu`` on the same machine: issue 31 asks the device's per-entry time within 1.5x of the CPU's.

``--stats``: which statistics path the collector's ``StatBuffer`` takes. ``default``: as a run would (the native op on
CPU tensors where it builds). ``torch-ops``: the torch ops only (``native=False``), the path of an NPU or of a device
without Triton. ``triton-stub``: the host work of the device path measured on the CPU, where no GPU is:
``TRITON_INTERPRET=1`` is set before Triton's import, CPU tensors are taken as a CUDA tensor is (the native Recorder's
lane makes their records, ``triton_cpu="lane"``; ``triton-stub-python``: its Python path, as where the native op does
not build, ``native=False, triton_cpu=True``), and the kernels (``_partials``, ``_partials_few`` where the runtime has
it, ``_partials_many``, ``_finish``) are replaced by stubs that launch nothing, so what remains is our host work per
tensor and per call. Not in it: the Triton launcher's own cost per launch (binding and specialising its arguments, the
driver's launch), nor a pinned host-to-device copy's (``_partials_many``'s table); measure those with ``--device cuda``
where a GPU is. ``triton-dispatch``: as ``triton-stub``, but the kernels are Triton's ``JITFunction`` objects launched
as on a GPU, through a fake CUDA driver whose compiled kernels do nothing (fixtures/fake_triton_driver.py): Triton's
own dispatch per launch is in the figure (its binder, its key, and ``runtime/triton_launch.py``'s direct launches;
``MSPROBE_TRITON_DIRECT=0`` for Triton's run at every launch), and so is the Python part of Triton's CUDA launcher
(Triton 3.6 and 3.9: the fake's kernels are launched by Triton's own launcher class), its C part and the driver's launch
are not. Requires ``--device cpu``.

``--before FILE``: a ``--json`` of another runtime (run with that runtime first on ``PYTHONPATH``), drawn
beside this run's figures in ``--svg``, each as a multiple of its own run's plain call.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from charts import bar_chart

SOURCE = """
def calls(x, n):
    relu = torch.relu
    for _ in range(n):
        __msprobe__.call("Functional.relu", relu, x)


def negations(mask, n):
    negate = torch.logical_not
    for _ in range(n):
        __msprobe__.call("Torch.logical_not", negate, mask)


def casts(x, n):
    to = torch.Tensor.to
    for _ in range(n):
        __msprobe__.call("Tensor.to", to, x, torch.float16)


def nested(depth, x, n):
    if depth == 0:
        return calls(x, n)
    return nested(depth - 1, x, n)


class Layer(torch.nn.Module):
    def forward(self, x, n):
        return calls(x, n)


def in_module(depth, layer, x, n):
    if depth == 0:
        return layer(x, n)
    return in_module(depth - 1, layer, x, n)


def chain(x, n):
    relu = torch.relu
    for _ in range(n):
        x = __msprobe__.call("Functional.relu", relu, x)
    return x.sum()


def turned_chain(x, n):
    relu = torch.relu
    for _ in range(n):
        x = __msprobe__.call("Functional.relu", relu, x).t()
    return x.sum()


def start(debugger):
    debugger.start()


def finish(debugger):
    debugger.stop()
    debugger.step()
"""


def choose_stats(which):
    """Make the collector's StatBuffer take the statistics path ``which`` (``--stats``)."""
    if which == "default":
        return
    from msprobe_runtime import collector, statistics

    if which == "torch-ops":
        collector.StatBuffer = lambda counts: statistics.StatBuffer(counts, native=False)
        return
    from msprobe_runtime import triton_stats

    class Stub:
        """A kernel that launches nothing: ``kernel[grid](...)`` returns None."""

        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    class Finish:
        """``_finish`` stubbed: zeros for its numbers (written at the flush, outside the timed bodies), so that
        the dump is written as a run's, without the garbage of arenas no kernel filled."""

        def __getitem__(self, grid):
            return lambda part, meta, values, counts, **kwargs: (values.zero_(), counts.zero_())

    saved = {name: getattr(triton_stats, name, None) for name in ("_partials", "_partials_few", "_partials_many")}
    for name in ("_partials", "_partials_few", "_partials_many"):  # those of this runtime (an older has fewer)
        if hasattr(triton_stats, name):
            setattr(triton_stats, name, Stub())
    triton_stats._finish = Finish()

    class HashFinish:
        """The fingerprints' ``_hash_finish`` stubbed: zeros for their parts (written at the flush)."""

        def __getitem__(self, grid):
            return lambda part, meta, out, **kwargs: out.zero_()

    try:  # a checksum mode's kernels (runtime/triton_fingerprint.py), as those of the statistics
        from msprobe_runtime import triton_fingerprint
    except ImportError:
        triton_fingerprint = None
    if hasattr(triton_fingerprint, "_hash_few"):  # an older runtime launched other kernels
        triton_fingerprint._hash_finish = HashFinish()
        if which != "triton-dispatch":
            triton_fingerprint._hash_few = Stub()
            if hasattr(triton_fingerprint, "_partials_hash_few"):
                triton_fingerprint._partials_hash_few = Stub()
    if which == "triton-dispatch":  # Triton's dispatch kept (a fake driver's no-op kernels), _finish stubbed
        for name in ("_partials", "_partials_few", "_partials_many"):
            setattr(triton_stats, name, saved[name])
    if which in ("triton-stub", "triton-dispatch"):  # as a device's run takes it: the native Recorder's lane
        collector.StatBuffer = lambda counts: statistics.StatBuffer(counts, triton_cpu="lane")
    else:  # triton-stub-python: the Python path of the records (no native op, as where it fails to build)
        collector.StatBuffer = lambda counts: statistics.StatBuffer(counts, native=False, triton_cpu=True)


def new_debugger(PrecisionDebugger, dump, args):
    """A debugger of task statistics at L1 writing under ``dump``, with ``--summary-mode``."""
    config = tempfile.mktemp(suffix=".json", dir=dump)
    with open(config, "w") as handle:
        json.dump({"statistics": {"summary_mode": args.summary_mode}}, handle)
    return PrecisionDebugger(config_path=config, dump_path=tempfile.mkdtemp(dir=dump), task="statistics", level="L1")


def steady_figures(body, n, seconds, debugger, start, finish):
    """The shallow stack's steps one after another for ``seconds``, each flushed, as a run's steps are: ``(mean
    seconds a call, the training thread's; of it, the garbage collector's; its full collections; calls)``, or None
    where ``seconds`` is 0. The best-of rounds above leave out what comes once in many steps: a full collection of
    the heap, which a step's records bring on where they outlive its young collections (gc.callbacks times them)."""
    import gc

    if seconds <= 0:
        return None
    made = debugger()
    start(made)
    body()
    finish(made)
    made.wait()
    timed = {"gc": 0.0, "full": 0, "began": 0.0}

    def timing(phase, info):
        if phase == "start":
            timed["began"] = time.perf_counter()
        else:
            timed["gc"] += time.perf_counter() - timed["began"]
            timed["full"] += info["generation"] == 2

    gc.callbacks.append(timing)
    busy, calls, until = 0.0, 0, time.perf_counter() + seconds
    try:
        while time.perf_counter() < until:
            began = time.perf_counter()
            start(made)
            body()
            finish(made)
            busy += time.perf_counter() - began
            calls += n
    finally:
        gc.callbacks.remove(timing)
    made.wait()
    return busy / calls, timed["gc"] / calls, timed["full"], calls


def best_seconds(fn, rounds, sync=lambda: None):
    best = float("inf")
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--depth", type=int, default=40)
    parser.add_argument("--device", default="cpu", help="where the calls' tensors live (cpu, cuda, ...)")
    parser.add_argument(
        "--stats",
        choices=("default", "torch-ops", "triton-stub", "triton-stub-python", "triton-dispatch"),
        default="default",
        help="the statistics path: as a run takes it, the torch ops only, or the Triton host path with its kernels "
        "stubbed, or with Triton's dispatch through a fake driver (both on CPU tensors)",
    )
    parser.add_argument(
        "--summary-mode",
        default="statistics",
        help="statistics.summary_mode of the run (statistics, md5, fingerprint...): a checksum mode hashes every "
        "recorded tensor besides its statistics",
    )
    parser.add_argument(
        "--steady",
        type=float,
        default=3.0,
        help="seconds of the steady loop: the shallow stack's steps, each flushed, one after another (0: none)",
    )
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--before", help="figures of an earlier runtime (its --json), for --svg")
    parser.add_argument("--svg", help="a bar chart of the added time per entry, beside --before's")
    args = parser.parse_args()
    if args.stats.startswith("triton-"):
        if args.device != "cpu":
            parser.error(f"--stats {args.stats} runs on CPU tensors (--device cpu)")
    if args.stats.startswith("triton-stub"):
        os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported: before msprobe_runtime imports it
    elif args.stats == "triton-dispatch":  # Triton's JITFunction, launched through a driver that launches nothing
        os.environ.pop("TRITON_INTERPRET", None)
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from fixtures.fake_triton_driver import install

        install(keep=False)
    import torch

    import msprobe_runtime
    from msprobe_runtime import PrecisionDebugger

    choose_stats(args.stats)

    torch.set_num_threads(1)
    code = {"__msprobe__": msprobe_runtime, "torch": torch}
    exec(compile(SOURCE, "<instrumented>", "exec"), code)
    calls, nested, chain, start, finish = (code[name] for name in ("calls", "nested", "chain", "start", "finish"))
    turned_chain = code["turned_chain"]
    in_module, layer, casts, negations = code["in_module"], code["Layer"](), code["casts"], code["negations"]
    dump = tempfile.mkdtemp(prefix="per-entry-")
    n = args.calls
    x = torch.randn(16, device=args.device)
    xg = torch.randn(16, device=args.device, requires_grad=True)
    sliced = torch.randn(32, device=args.device)[::2]
    ids = torch.arange(16, device=args.device)  # int64, as token and position ids
    mask = ids % 3 == 0  # bool, as an attention mask
    square = torch.randn(4, 4, device=args.device, requires_grad=True)
    sync = getattr(torch, torch.device(args.device).type, None)
    sync = sync.synchronize if args.device != "cpu" and hasattr(sync, "synchronize") else (lambda: None)

    def collected(body, flushes=None):
        """Seconds of ``body`` while collecting: a fresh step each round, its files written after; the seconds of
        each round's flush (``finish``: the step's records handed to the writer) appended to ``flushes``."""

        def run():
            debugger = new_debugger(PrecisionDebugger, dump, args)
            start(debugger)
            sync()
            began = time.perf_counter()
            body()
            sync()
            elapsed = time.perf_counter() - began
            began = time.perf_counter()
            finish(debugger)
            if flushes is not None:
                flushes.append(time.perf_counter() - began)
            debugger.wait()
            return elapsed

        return min(run() for _ in range(args.rounds))

    def backward_seconds(collecting, chain=chain, xg=xg):
        def run():
            debugger = None
            if collecting:
                debugger = new_debugger(PrecisionDebugger, dump, args)
                # a first step, as a run's later steps are measured: the kernels (and, in a checksum mode, the
                # native hooks, which serve from the step after the fingerprints' kernels are made) in place
                start(debugger)
                chain(xg, 2).backward()
                finish(debugger)
                xg.grad = None
                start(debugger)
            loss = chain(xg, n)
            sync()
            began = time.perf_counter()
            loss.backward()
            sync()
            elapsed = time.perf_counter() - began
            if debugger is not None:
                finish(debugger)
                debugger.wait()
            xg.grad = None
            return elapsed

        return min(run() for _ in range(args.rounds))

    plain_call = best_seconds(lambda: calls(x, n), args.rounds, sync) / n
    scenarios = {
        "shallow stack": (lambda: calls(x, n), lambda: calls(x, n)),
        f"{args.depth} frames deeper": (lambda: nested(args.depth, x, n), lambda: nested(args.depth, x, n)),
        f"in a module {args.depth} frames down": (
            lambda: in_module(args.depth, layer, x, n),
            lambda: in_module(args.depth, layer, x, n),
        ),
        "input requires grad": (lambda: calls(xg, n), lambda: calls(xg, n)),
        "a cast (two dtypes)": (lambda: casts(x, n), lambda: casts(x, n)),
        "a slice": (lambda: calls(sliced, n), lambda: calls(sliced, n)),
        "int64 ids": (lambda: calls(ids, n), lambda: calls(ids, n)),
        "a bool mask": (lambda: negations(mask, n), lambda: negations(mask, n)),
    }
    entry = {}
    flushes: list = []
    for name, (plain_body, collected_body) in scenarios.items():
        plain = best_seconds(plain_body, args.rounds, sync)
        entry[name] = (collected(collected_body, flushes if name == "shallow stack" else None) - plain) / n
    entry["its backward entry"] = (backward_seconds(True) - backward_seconds(False)) / n
    turned = (backward_seconds(True, turned_chain, square) - backward_seconds(False, turned_chain, square)) / n
    entry["its backward entry, transposed"] = turned
    # the shallow stack's step (two records a call) handed to the writer, on the training thread: where every number
    # is on the host (the CPU, or CPU tensors taken as a device's) its files are made here too (Debugger._flush)
    entry["the step's flush"] = min(flushes) / n

    made = lambda: new_debugger(PrecisionDebugger, dump, args)  # noqa: E731
    steady = steady_figures(lambda: calls(x, n), n, args.steady, made, start, finish)
    # a chain of calls and its backward: two entries a call, the backward one filled by a hook
    steady_backward = steady_figures(lambda: chain(xg, n).backward(), n, args.steady, made, start, finish)
    if steady is not None:
        entry["steady: shallow stack, flushed, mean"] = steady[0] - plain_call
        plain_backward = best_seconds(lambda: chain(xg, n).backward(), args.rounds, sync) / n
        entry["steady: with its backward, mean"] = steady_backward[0] - plain_backward

    parts = measure_parts(torch, msprobe_runtime, PrecisionDebugger, start, finish, dump, args)
    shutil.rmtree(dump, ignore_errors=True)
    print(f"on {args.device}, statistics {args.stats}, summary_mode {args.summary_mode}: ", end="")
    print("one plain call (collection off, shim included): ", end="")
    print(f"{plain_call * 1e6:.2f} us\n")
    print(f"{'host time added per recorded entry':40s} {'us':>7s} {'x plain call':>13s}")
    for name, seconds in entry.items():
        print(f"  {name:38s} {seconds * 1e6:7.1f} {seconds / plain_call:13.1f}")
    for label, figures in (("steady", steady), ("with its backward", steady_backward)):
        if figures is not None:
            print(
                f"  ({label}: {figures[1] * 1e6:.2f} us a call in the garbage collector, {figures[2]} full "
                f"collections in {figures[3]} calls)"
            )
    if parts:
        total = entry["input requires grad"]
        print(f"\nparts of an entry whose input requires grad, stack {args.depth} frames deeper")
        total += parts.get("call stack", 0.0) - parts.get("call stack (shallow)", 0.0)
        for name, seconds in parts.items():
            if name != "call stack (shallow)":
                print(f"  {name:38s} {seconds * 1e6:7.1f} {seconds / plain_call:13.1f}")
        rest = total - sum(v for k, v in parts.items() if k != "call stack (shallow)")
        print(f"  {'the rest':38s} {rest * 1e6:7.1f} {rest / plain_call:13.1f}")
        print(f"  {'total':38s} {total * 1e6:7.1f} {total / plain_call:13.1f}")
    figures = {
        "device": args.device,
        "stats": args.stats,
        "summary_mode": args.summary_mode,
        "plain_call_us": plain_call * 1e6,
        "entry_us": {k: v * 1e6 for k, v in entry.items()},
        "parts_us": {k: v * 1e6 for k, v in parts.items()},
    }
    for label, made_figures in (("steady", steady), ("steady_backward", steady_backward)):
        if made_figures is not None:
            gc_us, full, count = made_figures[1] * 1e6, made_figures[2], made_figures[3]
            figures[label] = {"gc_us_per_call": gc_us, "full_collections": full, "calls": count}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)
    if args.svg:
        before = None
        if args.before:
            with open(args.before) as handle:
                before = json.load(handle)
        svg(figures, before, args.svg)
    return 0


def svg(after, before, path):
    """Horizontal bars: µs added per entry, each scenario before (grey) and after (green)."""
    rows = []
    for name, value in after["entry_us"].items():
        for label, figures, colour in (("before", before, "#999"), ("after", after, "#4a7")):
            if figures is None or name not in figures["entry_us"]:
                continue
            us = figures["entry_us"][name]
            rows.append(
                (
                    f"{name}, {label}" if before is not None else name,
                    us,
                    f"{us:.1f} µs ({us / figures['plain_call_us']:.0f} plain calls)",
                    colour,
                )
            )
    bar_chart(rows, "host time added per recorded entry, L1 (CPU, µs)", [(20.0, "20 µs (target)")], path)


def measure_parts(torch, runtime, PrecisionDebugger, start, finish, dump, args):
    """Seconds per call of each part, on the collector of a started debugger; {} where this runtime has no
    such functions (an older one, measured for its total only)."""
    try:
        from msprobe_runtime import backward, call_stacks, native_stats, shims
    except ImportError:
        return {}
    if os.path.dirname(call_stacks.__file__) != os.path.dirname(runtime.__file__):
        return {}  # an older runtime on PYTHONPATH, whose package has no call_stacks: the installed one answered
    debugger = new_debugger(PrecisionDebugger, dump, args)
    start(debugger)
    collector = shims._collector
    x = torch.randn(16, device=args.device, requires_grad=True)
    y = torch.relu(x)

    def deep(depth):
        return sys._getframe() if depth == 0 else deep(depth - 1)

    frame, shallow = deep(args.depth), sys._getframe()
    capture = call_stacks.capture_function(native_stats.load())  # the collector's: the native op's where it has one
    n = args.calls

    outputs = []  # a fresh output for each attachment, made before the round: one node, one hook, as in a step

    def attach():  # as Collector._finish_api attaches: the native op's hook where it serves, else torch's
        if getattr(collector, "native_backward", False):
            collector.recorder.hook_api([outputs.pop()], 0)
        else:
            backward.hook_api_backward(collector, "Functional.relu.0.backward", [outputs.pop()])

    stats = collector.stats
    fused = stats._fused

    def in_call(describe):  # a device path's record: within its call's records, launched at their end
        if not fused:
            return describe

        def record():
            fused.begin()
            describe()
            stats.end_call(fused)

        return record

    bodies = {
        # counted and named, its entry begun: the input's record, measured next, left out (no arguments)
        "naming": lambda: collector._begin_api("Functional.relu", (), None),
        "input record": in_call(lambda: collector.describe_seq((x,), None)),
        "output record": in_call(lambda: collector.describe_output(y, None)),
        "call stack": lambda: capture(frame, None, None, call_stacks.MAX_RAW),
        "call stack (shallow)": lambda: capture(shallow, None, None, call_stacks.MAX_RAW),
        "backward attachment": attach,
    }
    parts = {}
    try:
        for name, body in bodies.items():
            best = float("inf")
            for _ in range(args.rounds):
                if body is attach:
                    outputs[:] = [torch.relu(x) for _ in range(n)]
                begin = time.perf_counter()
                for _ in range(n):
                    body()
                best = min(best, time.perf_counter() - begin)
            parts[name] = best / n
    finally:
        finish(debugger)
        debugger.wait()
    return parts


if __name__ == "__main__":
    sys.exit(main())
