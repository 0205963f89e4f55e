"""How low the tiny GPT's mix step could go if the module path cost nothing but its native calls: an upper bound.

Issue 14 asks the tiny megatron GPT's mix step for at most 1.2x our L1 step. Mix adds to L1 a record for
each module call (its forward hooks, its backward hooked on the module's part of the graph) and each
parameter's gradient. This bench times, in one process and interleaved step by step (this machine's step
time moves by 10-50 % from minute to minute, so variants run in turn and their lowest, 10th-percentile and
median steps are compared):

- ``off``: the rewritten copy, no debugger started; ``L1`` and ``mix``: the runtime as it is;
- ``bound: forward``: mix, with ``Collector.module_forward_begin`` and ``module_forward_end`` replaced by
  their least Python: the name counted, the records made by the native op in one call per field, the call
  stack captured, the backward hooked by the native op, and nothing else (no selection, no tensor files, no
  wait for the parameters' gradients, declined records left empty);
- ``bound: forward, no parameters``: that, and no parameter hooked at all (no ``parameters_grad`` entry).

The bounds write incomplete dumps: they are what no implementation of the module path can beat while it
makes the same records, not a runtime. Needs the native op (a C++ compiler); without it the bench says so.

    python bench/module_path_bound.py [--config fused|unfused] [--steps 200]
"""

import argparse
import collections
import glob
import json
import os
import shutil
import sys
import time

import megatron_step

VARIANTS = ("off", "L1", "mix", "bound: forward", "bound: forward, no parameters")


def bounds():
    """``use(forward, no_parameters)``: put the bounds of the module path's forward hooks, and of the
    parameters' hooks, in the runtime's place, or the runtime's own back: swapped between steps, so that the
    runtime's variants run its functions as they are, with no wrapper frame."""
    import torch
    from msprobe_runtime import backward, collector
    from msprobe_runtime.open_calls import BackwardWait, ModuleCall

    tensor = torch.Tensor
    later = collector.LATER
    begin, end, hook_parameters = (
        collector.Collector.module_forward_begin,
        collector.Collector.module_forward_end,
        backward.hook_parameters,
    )

    def records(recorder, values):
        made, todo = recorder.records(values)
        return [None if record is later else record for record in made] if todo else made

    def bound_begin(self, module, args):
        known = self.modules.get(id(module))
        if known is None or known[0] is not module:
            return None
        prefix = known[1]
        step = self.step
        index = step.module_counts.get(prefix, 0)
        step.module_counts[prefix] = index + 1
        name = f"{prefix}forward.{index}"
        parent = self.module_stack[-1] if self.module_stack else None
        step.construct[name] = parent
        self.module_stack.append(name)
        entry = {"input_args": records(self.recorder, args), "input_kwargs": {}}
        step.stacks[name] = self.anchors.capture(sys._getframe(1))
        return ModuleCall(name, entry, parent, (args, f"{prefix}backward.{index}"))

    def bound_end(self, record, module, kwargs, result):
        name, entry, parent, (args, backward_name) = record
        self.module_stack.pop()
        recorder = self.recorder
        if kwargs:
            entry["input_kwargs"] = dict(zip(kwargs, records(recorder, list(kwargs.values()))))
        kind = type(result)
        outputs = [result] if kind is tensor else list(result) if kind is tuple or kind is list else [None]
        entry["output"] = records(recorder, outputs)
        listed = self.hooked_parameters.get(id(module))
        if listed is not None and listed.own:
            entry["parameters"] = dict(zip([n for n, _ in listed.own], records(recorder, [p for _, p in listed.own])))
        step = self.step
        step.data[name] = entry
        inputs = [a if type(a) is tensor else None for a in args]
        if kwargs:
            inputs += [v if type(v) is tensor else None for v in kwargs.values()]
        step.backward_parents[backward_name] = parent
        wait = BackwardWait(backward_name)
        index = self.number_module_backward(wait)
        hooked = recorder.hook_module(index, inputs, outputs, True, 20000)
        if hooked is not None and hooked[0]:
            wait.n_out, wait.n_in = hooked[0], hooked[1]
            wait.parts = hooked[0] + hooked[1]

    def no_parameters(collector_):
        collector_.set_hooked_parameters({})
        return []

    def use(forward, no_parameters_hooked):
        collector.Collector.module_forward_begin = bound_begin if forward else begin
        collector.Collector.module_forward_end = bound_end if forward else end
        # debugger.start() imports it from the module at every call
        backward.hook_parameters = no_parameters if no_parameters_hooked else hook_parameters

    return use


def worker(args):
    make_step, root = megatron_step.step_factory(args)
    from msprobe_runtime import PrecisionDebugger, native_stats

    if native_stats.load() is None:
        print(json.dumps({"skipped": "the native op is not built here (no C++ compiler?): the bound needs it"}))
        return 0
    use = bounds()
    debuggers = {
        level: PrecisionDebugger(dump_path=os.path.join(root, level), level=level, task="statistics")
        for level in ("L1", "mix")
    }
    current = [None]

    def begin(model):
        if current[0] is not None:
            current[0].start(model=model)

    def end():
        if current[0] is not None:
            current[0].stop()
            current[0].step()

    step = make_step(begin=begin, end=end)  # one model for every variant: they differ only in what collects
    settings = {
        "off": (None, False, False),
        "L1": ("L1", False, False),
        "mix": ("mix", False, False),
        "bound: forward": ("mix", True, False),
        "bound: forward, no parameters": ("mix", True, True),
    }
    times = collections.defaultdict(list)
    steps_taken = collections.Counter()  # a debugger's steps so far: its dump folder's number
    last_step = {}
    for round_ in range(args.steps + args.warmup):
        shift = round_ % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            level, forward, no_parameters = settings[variant]
            use(forward, no_parameters)
            current[0] = debuggers[level] if level else None
            start = time.perf_counter()
            step()
            elapsed = time.perf_counter() - start
            if round_ >= args.warmup:
                times[variant].append(elapsed)
            if level:
                last_step[variant] = steps_taken[level]
                steps_taken[level] += 1
    for debugger in debuggers.values():
        debugger.wait()
    forward_entries = {
        variant: module_forward_entries(os.path.join(root, "mix", f"step{last_step[variant]}"))
        for variant in VARIANTS[2:]
    }
    shutil.rmtree(root, ignore_errors=True)
    if len(set(forward_entries.values())) != 1 or not forward_entries["mix"]:
        # a hook's error is logged and its record skipped, never raised: a bound that no longer fits the
        # collector would be timed doing less, so it is checked by what it wrote
        print(f"the bounds no longer make the runtime's module records: {forward_entries}", file=sys.stderr)
        return 1
    print(json.dumps(times))
    return 0


def module_forward_entries(step_dir):
    """The module forward entries of a step's dump.json (0 where it was not written)."""
    paths = glob.glob(os.path.join(step_dir, "*", "dump.json"))
    if not paths:
        return 0
    with open(paths[0], encoding="utf-8") as handle:
        names = json.load(handle)["data"]
    return sum(1 for name in names if name.startswith("Module.") and ".forward." in name)


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps of each variant")
    args = megatron_step.tiny_bench_arguments(parser)
    if args.worker:
        return worker(args)
    times = megatron_step.run_in_rewritten_copy(
        __file__, ["--config", args.config, "--steps", str(args.steps), "--warmup", str(args.warmup)], "timing"
    )
    if "skipped" in times:
        print(f"module path bound: skipped: {times['skipped']}")
        return 0
    print(f"tiny megatron GPT ({args.config}), {args.steps} steps of each variant, interleaved in one process")
    figures = {}
    for label, q in (("lowest", 0.0), ("10th percentile", 0.1), ("median", 0.5)):
        step = {variant: quantile(times[variant], q) for variant in VARIANTS}
        figures[label] = {
            variant: {
                "ms": step[variant] * 1e3,
                "to off": step[variant] / step["off"],
                "to L1": step[variant] / step["L1"],
            }
            for variant in VARIANTS
        }
        print(f"  {label} step (off {step['off'] * 1e3:.2f} ms):")
        for variant in VARIANTS[1:]:
            row = figures[label][variant]
            print(f"    {variant:31s} {row['to off']:6.3f}x off  {row['to L1']:6.3f}x our L1")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"config": args.config, "steps": args.steps, "figures": figures}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
