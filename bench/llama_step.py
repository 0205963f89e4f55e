"""Collection overhead and gradient fidelity on a mid-size transformers Llama: LlamaForCausalLM from a LlamaConfig
in code (hidden 512, 4 layers, 8 heads, intermediate 1376, vocabulary 1000, sequence 128, batch 2; no download),
CPU, one thread; one training step = forward with labels (the model's own loss), backward, AdamW step. Every
figure is a ratio to the plain step.

    python bench/llama_step.py [--steps 10] [--rounds 3] [--repeats 2] [--msprobe-python PATH] [--json FILE]
    python bench/llama_step.py --small          # tiny sizes, one repeat, no msprobe unless given (make bench)

Variants (each process imports transformers once, so a variant group is one subprocess; within a group the
variants take turns every round, and every group runs --repeats times, the lower median kept):
  plain                    transformers as installed, no collection                 (group "plain")
  DIY TorchFunctionMode    the same, with bench/megatron_step.py's DIYCollector: per-call Max/Min/Mean/Norm of
                           every floating output, on the device; pushed over backward too, where a mode sees
                           nothing, so forward only
  rewritten, off           the worker run as README tells transformers users, `python -m msprobe_rewrite run
                           --packages transformers -- bench/llama_step.py ...` (transformers and the script
                           instrumented on import), no debugger started                 (group "rewritten")
  ours L1 / ours mix       the same process, msprobe_runtime.PrecisionDebugger (task statistics, dump in a temp
                           dir) start/stop/step every step
  msprobe L1 / mix         mindstudio-probe in its own interpreter (--msprobe-python; it patches torch at
                           construction and never restores), one process per level: a plain step measured there
                           first, before its PrecisionDebugger is built; not run without --msprobe-python

Gradients: every variant's model is a deep copy of one model built with the same seed, fed the same batch; the
loss and every parameter's gradient of its first step are kept. Ours (off, L1, mix) and the DIY mode are
compared bit for bit with the plain group's; msprobe L1 / mix with the plain step of msprobe's own interpreter
(max absolute and relative difference per parameter, and how many differ at all), and that plain step with
ours (the same torch build in both interpreters, so it should be bit-identical). Exits 1 when ours is not
bit-identical to plain.
"""

import argparse
import contextlib
import copy
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from timing import measure_interleaved

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {
    "mid": dict(hidden=512, layers=4, heads=8, intermediate=1376, vocab=1000, seq=128, batch=2),
    "tiny": dict(hidden=64, layers=2, heads=4, intermediate=176, vocab=128, seq=16, batch=2),
}
OURS = ("rewritten, off", "ours L1", "ours mix")
# eager: msprobe and the do-it-yourself TorchFunctionMode measured beside us run eagerly; the compiled step is
# bench/compiled_step.py
ENV = {
    "PYTHONWARNINGS": "ignore",
    "TORCHDYNAMO_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}


# ----------------------------------------------------------------------------------------- worker side


def _entries(dump_root):
    """Entries of step 0's dump.json (msprobe's layout and ours: step0/<rank or proc>/dump.json)."""
    found = sorted(glob.glob(os.path.join(dump_root, "step0", "*", "dump.json")))
    if not found:
        return None
    with open(found[0]) as handle:
        return len(json.load(handle).get("data", {}))


def worker(args):
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    import torch
    import transformers

    torch.set_num_threads(1)
    size = SIZES[args.size]
    config = transformers.LlamaConfig(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["heads"],
        max_position_embeddings=2 * size["seq"],
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(1234)
    template = transformers.LlamaForCausalLM(config)
    template.train()
    ids = torch.randint(3, size["vocab"], (size["batch"], size["seq"]), generator=torch.Generator().manual_seed(42))
    root = tempfile.mkdtemp(prefix="llama_step_bench_")  # msprobe accepts only ^[a-zA-Z0-9_.:/-]+$
    first = {}  # variant -> loss and gradients of its first step

    def make_step(name, begin=None, end=None, around=contextlib.nullcontext):
        model = copy.deepcopy(template)  # every variant starts from the same weights
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            optimizer.zero_grad(set_to_none=True)
            if begin:
                begin(model)
            with around():
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            if end:
                end()
            if name not in first:
                first[name] = {
                    "loss": loss.detach().clone(),
                    "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()},
                }
            optimizer.step()

        return step

    info = {
        "attn_implementation": template.config._attn_implementation,
        "parameters": sum(p.numel() for p in template.parameters()),
        "instrumented": "__msprobe__" in vars(sys.modules[type(template).__module__]),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    results, entries = {}, {}
    if args.worker == "plain":
        from megatron_step import DIYCollector  # bench/ is sys.path[0]

        diy = DIYCollector(tempfile.mkdtemp(dir=root))
        variants = {
            "plain": make_step("plain"),
            "DIY TorchFunctionMode": make_step("DIY TorchFunctionMode", around=diy.collecting, end=diy.flush),
        }
        results = measure_interleaved(variants, args.steps, args.rounds, warmup=3)
    elif args.worker == "rewritten":
        from msprobe_runtime import PrecisionDebugger

        variants = {"rewritten, off": make_step("rewritten, off")}
        debuggers = {}
        for level in ("L1", "mix"):
            debugger = debuggers[level] = PrecisionDebugger(
                dump_path=os.path.join(root, level), level=level, task="statistics"
            )

            def end(debugger=debugger):
                debugger.stop()
                debugger.step()

            variants[f"ours {level}"] = make_step(
                f"ours {level}", begin=lambda model, d=debugger: d.start(model), end=end
            )
        results = measure_interleaved(variants, args.steps, args.rounds, warmup=3)
        for level, debugger in debuggers.items():
            debugger.wait()
            entries[f"ours {level}"] = _entries(os.path.join(root, level))
    else:  # msprobe-L1, msprobe-mix: the plain step first, then msprobe patches torch for good
        level = args.worker.split("-", 1)[1]
        name = f"msprobe {level}"
        hooks = {}
        plain = make_step("msprobe's plain")
        collected = make_step(name, begin=lambda model: hooks["begin"](model), end=lambda: hooks["end"]())
        results = measure_interleaved({"plain": plain}, args.steps, args.rounds, warmup=3)
        from msprobe.pytorch import PrecisionDebugger

        dump = os.path.join(root, "msprobe")
        debugger = PrecisionDebugger(dump_path=dump, level=level, task="statistics")

        def end():
            debugger.stop()
            debugger.step()

        hooks.update(begin=lambda model: debugger.start(model=model), end=end)
        try:
            results[name] = measure_interleaved({name: collected}, args.steps, args.rounds, warmup=3)[name]
        except Exception as error:  # noqa: BLE001 - the error is the result
            results[name] = f"raises {type(error).__name__}: {str(error).splitlines()[0]}"
        entries[name] = _entries(dump)
    if args.grads:
        torch.save(first, args.grads)
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"times": results, "entries": entries, "info": info}))


# ----------------------------------------------------------------------------------------- driver side


def run_worker(python, group, args, grads=None, hook=False):
    env = {**os.environ, **ENV}
    env.pop("PYTHONPATH", None)
    command = [python] + (["-m", "msprobe_rewrite", "run", "--packages", "transformers", "--"] if hook else [])
    command += [
        os.path.abspath(__file__),
        "--worker",
        group,
        "--size",
        args.size,
        "--steps",
        str(args.steps),
        "--rounds",
        str(args.rounds),
    ] + (["--grads", grads] if grads else [])
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:]
        return {"error": f"failed: {last[0] if last else done.returncode}"}
    # msprobe logs to stdout, also after our line
    return json.loads([line for line in done.stdout.splitlines() if line.startswith('{"times"')][-1])


def bits(t):
    """The tensor's bytes as integers, so that equality is bitwise (NaN, -0.0)."""
    import torch

    flat = t.detach().contiguous().view(-1)
    return flat.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()])


def compare(got, reference):
    """Loss and per-parameter gradient differences of ``got`` against ``reference`` ({"loss", "grads"})."""
    import torch

    rows = {}
    for name, ref in reference["grads"].items():
        value = got["grads"][name]
        same = torch.equal(bits(value), bits(ref))
        diff = (value.double() - ref.double()).abs()
        nonzero = ref != 0
        rows[name] = {
            "identical": same,
            "max_abs": diff.max().item(),
            "max_rel": (diff[nonzero] / ref.double().abs()[nonzero]).max().item() if nonzero.any() else 0.0,
            "norm_rel": (diff.norm() / ref.double().norm().clamp_min(1e-300)).item(),
            # the largest difference against the gradient's own scale (elementwise max_rel is large
            # where an element of the reference is near zero)
            "scaled": (diff.max() / ref.double().abs().max().clamp_min(1e-300)).item(),
            "elements_differing": int((diff != 0).sum()),
            "elements": ref.numel(),
        }
    loss, ref_loss = got["loss"].double().item(), reference["loss"].double().item()
    differing = [n for n, r in rows.items() if not r["identical"]]
    worst = max(rows, key=lambda n: rows[n]["max_rel"])
    return {
        "loss_identical": torch.equal(bits(got["loss"]), bits(reference["loss"])),
        "loss": got["loss"].item(),
        "loss_reference": reference["loss"].item(),
        "loss_abs": abs(loss - ref_loss),
        "loss_rel": abs(loss - ref_loss) / abs(ref_loss),
        "parameters": len(rows),
        "parameters_differing": len(differing),
        "max_abs": max(r["max_abs"] for r in rows.values()),
        "max_rel": max(r["max_rel"] for r in rows.values()),
        "max_norm_rel": max(r["norm_rel"] for r in rows.values()),
        "max_scaled": max(r["scaled"] for r in rows.values()),
        "elements_differing": sum(r["elements_differing"] for r in rows.values()),
        "elements": sum(r["elements"] for r in rows.values()),
        "worst_parameter": worst,
        "per_parameter": rows,
    }


def describe(c):
    if c["parameters_differing"] == 0 and c["loss_identical"]:
        return f"bit-identical (loss and all {c['parameters']} gradients)"
    loss = "loss identical" if c["loss_identical"] else f"loss differs by {c['loss_abs']:.3g} (rel {c['loss_rel']:.3g})"
    return (
        f"{c['parameters_differing']}/{c['parameters']} gradients differ "
        f"({c['elements_differing']}/{c['elements']} elements): max abs {c['max_abs']:.3g}, "
        f"max rel {c['max_rel']:.3g} (worst: {c['worst_parameter']}); per parameter at most "
        f"{c['max_scaled']:.3g} of its largest gradient, {c['max_norm_rel']:.3g} norm-wise; {loss}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--small",
        action="store_true",
        help="tiny sizes (hidden 64, 2 layers, sequence 16), --steps 2 --rounds 1 --repeats 1 unless given: make bench",
    )
    parser.add_argument("--steps", type=int, help="timed steps per variant and round (default 10)")
    parser.add_argument("--rounds", type=int, help="rounds of interleaved timing (default 3)")
    parser.add_argument("--repeats", type=int, help="runs of each of our two groups, lower median kept (default 2)")
    parser.add_argument("--size", choices=SIZES, help="mid (default) or tiny (--small)")
    parser.add_argument(
        "--msprobe-python",
        help="interpreter with mindstudio-probe (and transformers); msprobe L1 / mix are not run without it",
    )
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--grads", help=argparse.SUPPRESS)
    args = parser.parse_args()
    small = dict(steps=2, rounds=1, repeats=1, size="tiny") if args.small else {}
    for key, default in dict(steps=10, rounds=3, repeats=2, size="mid").items():
        if getattr(args, key) is None:
            setattr(args, key, small.get(key, default))
    if args.worker:
        return worker(args)

    import torch

    started, load_before = time.time(), os.getloadavg()
    work = tempfile.mkdtemp(prefix="llama-step-grads-")
    best, entries, info, errors = {}, {}, {}, []
    for repeat in range(args.repeats):  # the groups take turns, the lower median of each variant kept
        for group, hook in (("plain", False), ("rewritten", True)):
            grads = os.path.join(work, f"{group}.pt") if repeat == 0 else None
            result = run_worker(sys.executable, group, args, grads, hook)
            if "error" in result:
                sys.exit(f"group {group}: {result['error']}")
            info[group] = result["info"]
            entries.update(result["entries"])
            for name, value in result["times"].items():
                best[name] = min(best.get(name, value), value)
    base = best["plain"]
    ratios = {name: best[name] / base for name in ("plain", *OURS, "DIY TorchFunctionMode")}
    msprobe_info = {}
    for level in ("L1", "mix"):
        name = f"msprobe {level}"
        if not args.msprobe_python:
            ratios[name] = "not run (no --msprobe-python)"
            continue
        result = run_worker(args.msprobe_python, f"msprobe-{level}", args, os.path.join(work, f"msprobe-{level}.pt"))
        if "error" in result:
            ratios[name] = result["error"]
            continue
        msprobe_info = result["info"]
        entries.update(result["entries"])
        value = result["times"][name]
        ratios[name] = value / result["times"]["plain"] if isinstance(value, float) else value
        best[f"{name}: its plain step"] = result["times"]["plain"]

    # gradients of the first step
    plain = torch.load(os.path.join(work, "plain.pt"))
    ours = torch.load(os.path.join(work, "rewritten.pt"))
    fidelity = {"DIY TorchFunctionMode": compare(plain["DIY TorchFunctionMode"], plain["plain"])}
    for name in OURS:
        fidelity[name] = compare(ours[name], plain["plain"])
    for level in ("L1", "mix"):
        path = os.path.join(work, f"msprobe-{level}.pt")
        if os.path.exists(path):
            theirs = torch.load(path)
            if f"msprobe {level}" in theirs:
                fidelity[f"msprobe {level}"] = compare(theirs[f"msprobe {level}"], theirs["msprobe's plain"])
            fidelity[f"msprobe's plain ({level} process) vs plain"] = compare(theirs["msprobe's plain"], plain["plain"])
    shutil.rmtree(work, ignore_errors=True)

    size = SIZES[args.size]
    print(
        f"LlamaForCausalLM {size}, {info['plain']['parameters']:,} parameters, attention "
        f"{info['plain']['attn_implementation']}, torch {info['plain']['torch']}, transformers "
        f"{info['plain']['transformers']}; {args.steps} steps x {args.rounds} rounds, groups x {args.repeats}"
    )
    print(
        f"plain step {base * 1e3:.1f} ms; load average {load_before[0]:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end; {time.time() - started:.0f} s"
    )
    for name, value in ratios.items():
        count = f"   ({entries[name]} entries in step 0)" if entries.get(name) else ""
        print(f"  {name:24s} " + (f"{value:5.2f}x{count}" if isinstance(value, float) else value))
    print("gradients of the first step:")
    for name, c in fidelity.items():
        print(f"  {name:24s} {describe(c)}")
    if not info["rewritten"]["instrumented"] or info["plain"]["instrumented"]:
        errors.append(
            f"instrumented: plain {info['plain']['instrumented']}, rewritten {info['rewritten']['instrumented']}"
        )
    for name in OURS:
        c = fidelity[name]
        if c["parameters_differing"] or not c["loss_identical"]:
            errors.append(f"{name} is not bit-identical to plain: {describe(c)}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "size": size,
                    "steps": args.steps,
                    "rounds": args.rounds,
                    "repeats": args.repeats,
                    "ratios": ratios,
                    "seconds": best,
                    "entries": entries,
                    "load_average": {"start": load_before, "end": os.getloadavg()},
                    "info": {**info, "msprobe": msprobe_info},
                    "gradients": fidelity,
                },
                handle,
                indent=2,
            )
    for error in errors:
        print(f"ERROR: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
