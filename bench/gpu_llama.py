"""Collection on the accelerator: a transformers LlamaForCausalLM from a LlamaConfig in code, one training step
(forward with labels, backward, AdamW (foreach) step, zero_grad) timed per variant, side by side in one run
(issue 31's table, plus kernel launches and host time from torch.profiler).

    python bench/gpu_llama.py                              # CUDA, the issue's sizes (hidden 2048, 8 layers, ...)
    python bench/gpu_llama.py --device cpu --size tiny     # the CPU mode (make bench): a few seconds a variant
    python bench/gpu_llama.py [--steps 4] [--rounds 2] [--msprobe-python PATH] [--json FILE]
                              [--dtype {auto,bfloat16,float32}]   # auto: bf16 on CUDA, float32 on the CPU
    python bench/gpu_llama.py --device cpu --size tiny --stats triton-dispatch   # the device path's host cost here

``--stats triton-dispatch`` (CPU only): ours take the device path as ``bench/per_entry.py --stats triton-dispatch``
does (CPU tensors taken as a GPU's by the native lane, Triton's kernels launched through the fake driver, which runs
nothing, so the dumps' numbers are zeros), in bfloat16 as on the GPU: the host time a step of ours adds on a device,
measured without one. Its "host ms" against plain's is the figure; the rest is the CPU's.

Variants (a variant group is one subprocess, as in bench/llama_step.py, whose rewriting and interleaving this
reuses; within a group the variants take turns every round):
  plain                    transformers as installed                                       (group "plain")
  DIY TorchFunctionMode    Max/Min/Mean/Norm of every float output of every torch call, on the device, read
                           back once a step (bench/megatron_step.py's DIYCollector; forward only: a mode sees
                           no backward)
  rewritten, off           `python -m msprobe_rewrite run --packages transformers -- bench/gpu_llama.py ...`,
                           no debugger started                                             (group "rewritten")
  ours L1 / ours mix       msprobe_runtime.PrecisionDebugger, task statistics, start/stop/step every step
  ours L1 fingerprint      the same at L1 with ``summary_mode: "fingerprint"``
  msprobe L1 / mix         mindstudio-probe, one process per level (it patches torch for good); only where
                           ``import msprobe`` works in --msprobe-python (default: this interpreter)

Columns: step ms (median, the device synchronised around each whole step, start/stop/step included) and its
ratio to plain; host ms (median time until the step's Python returned, before the final synchronize: the
host's own cost where the device waits for it); host syncs in forward and backward of one step
(``torch.cuda.set_sync_debug_mode("warn")``, each warning one sync; n/a off CUDA); peak device memory of a step
(the variant's own parameters and AdamW state plus the step's peak above what was allocated at its start, as
every variant's model lives in the process; n/a off CUDA); from one step under torch.profiler: kernel launches
(``cudaLaunchKernel`` and its kin; n/a off CUDA), ATen ops (outermost ``aten::`` events) and ATen compute ops
(the outermost ops that compute: views, allocations and casts to the same dtype left out; the launch count's
stand-in on the CPU); and, for ours, compute ops added per recorded tensor ((compute ops - plain's) / tensors in
the step's dump.json). "grads = plain": a digest of the loss and every gradient of the first step (the bits of each
summed as integers) equal to plain's. On the CPU a variant of ours whose digest differs fails the run (exit 1);
on a GPU it is reported only (a kernel with atomics may differ run to run).
"""

import argparse
import contextlib
import copy
import glob
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {
    # issue 31's model: 8 layers of hidden 2048, 16 heads (8 KV), bf16, sequence 2048, batch 4
    "issue": dict(hidden=2048, layers=8, heads=16, kv=8, intermediate=5632, vocab=32000, seq=2048, batch=4),
    "small": dict(hidden=512, layers=4, heads=8, kv=4, intermediate=1376, vocab=1000, seq=256, batch=2),
    "tiny": dict(hidden=64, layers=2, heads=4, kv=2, intermediate=176, vocab=128, seq=16, batch=2),
}
OURS = ("rewritten, off", "ours L1", "ours mix", "ours L1 fingerprint")
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "hipLaunchKernel")
# the worker processes' environment, bench/llama_step.py's (eager, as msprobe and the do-it-yourself mode run
# beside us; the compiled step is bench/compiled_step.py)
from llama_step import ENV  # noqa: E402


# ----------------------------------------------------------------------------------------- worker side


def _dump_counts(dump_root):
    """(entries, tensors) of step 0's dump.json: a tensor is a dict whose type names a torch tensor."""
    found = sorted(glob.glob(os.path.join(dump_root, "step0", "*", "dump.json")))
    if not found:
        return None, None
    with open(found[0]) as handle:
        data = json.load(handle).get("data", {})
    tensors = 0
    todo = list(data.values())
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            if str(item.get("type", "")).startswith("torch.") and "dtype" in item:
                tensors += 1
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return len(data), tensors


# ATen ops that compute nothing: views, allocations and metadata; and those that compute only where an op
# under them does (a cast to the tensor's own dtype, a reshape that is a view, a contiguous tensor's contiguous)
VIEWS = frozenset(
    "aten::" + name
    for name in (
        "empty empty_strided empty_like as_strided view _reshape_alias alias detach unbind select slice narrow "
        "expand expand_as permute t transpose unsqueeze squeeze _unsafe_view view_as lift_fresh resize_ set_ "
        "unfold split chunk split_with_sizes result_type"
    ).split()
)
MAYBE = frozenset("aten::" + name for name in "to _to_copy contiguous clone reshape flatten type_as".split())


def _count_ops(events):
    """(outermost ``aten::`` ops, compute ops, kernel launches) of a profile. Compute ops: the outermost ops
    that compute (neither a view nor an allocation, nor a cast that casts nothing), each standing for about
    one kernel on a device; what an op does inside (a CPU reduction's fill_, a bool sum's copy to int64) is
    part of it, as on a device it is one kernel."""
    ops = launches = 0
    memo = {}

    def computes(event):
        key = id(event)
        if key not in memo:
            name = event.name
            if not name.startswith("aten::") or name in VIEWS:
                memo[key] = False
            elif name in MAYBE:
                memo[key] = any(computes(child) for child in event.cpu_children)
            else:
                memo[key] = True
        return memo[key]

    compute = 0
    for event in events:
        name = event.name
        if name in LAUNCHES:
            launches += 1
        if not name.startswith("aten::"):
            continue
        parent, outermost, inside = event.cpu_parent, True, False
        while parent is not None:
            if parent.name.startswith("aten::"):
                outermost = False
                inside = inside or computes(parent)
            parent = parent.cpu_parent
        ops += outermost
        compute += not inside and computes(event)
    return ops, compute, launches


def worker(args):
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    if args.stats == "triton-dispatch" and args.worker == "rewritten":  # before Triton is imported, as per_entry
        os.environ.pop("TRITON_INTERPRET", None)
        sys.path.insert(0, os.path.dirname(HERE))
        from fixtures.fake_triton_driver import install
        from per_entry import choose_stats  # bench/ is sys.path[0]

        install(keep=False)
        choose_stats(args.stats)
    import torch
    import transformers

    cuda = args.device == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    size = SIZES[args.size]
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(args.dtype)
    if dtype is None:  # bf16 as the issue's, on a device and where the CPU stands in for one
        dtype = torch.bfloat16 if cuda or args.stats == "triton-dispatch" else torch.float32
    config = transformers.LlamaConfig(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv"],
        max_position_embeddings=size["seq"],
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="sdpa",
    )
    torch.manual_seed(1234)
    template = transformers.LlamaForCausalLM(config).to(device=args.device, dtype=dtype)
    template.train()
    ids = torch.randint(3, size["vocab"], (size["batch"], size["seq"]), generator=torch.Generator().manual_seed(42))
    ids = ids.to(args.device)
    root = tempfile.mkdtemp(prefix="gpu_llama_bench_")  # msprobe accepts only ^[a-zA-Z0-9_.:/-]+$
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    digests, host, own_bytes = {}, {}, {}

    def digest(loss, model):
        """Per-parameter sums of the gradients' bits (as integers) and the loss's bits: equal lists, equal bits
        (almost surely), computed on the device, one read back."""
        parts = [loss.detach().float().reshape(1).view(torch.int32).long()]
        for p in model.parameters():
            g = p.grad.detach().reshape(-1)
            parts.append(g.view({2: torch.int16, 4: torch.int32}[g.element_size()]).long().sum().reshape(1))
        return torch.cat(parts).tolist()

    def make_step(name, begin=None, end=None, around=contextlib.nullcontext):
        model = copy.deepcopy(template)  # every variant starts from the same weights
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        times = host[name] = []
        state = {"sync_probe": None}

        def step():
            sync()
            start = time.perf_counter()
            if begin:
                begin(model)
            with around(), state["sync_probe"] or contextlib.nullcontext():
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            if end:
                end()
            if name not in digests:
                digests[name] = digest(loss, model)
                # what this variant keeps between steps: parameters and AdamW's two moments (step counts aside)
                own_bytes[name] = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
            sync()

        step.state = state
        return step

    variants, dumps, debuggers = {}, {}, []
    if args.worker == "plain":
        from megatron_step import DIYCollector  # bench/ is sys.path[0]

        diy = DIYCollector(tempfile.mkdtemp(dir=root))
        variants["plain"] = make_step("plain")
        variants["DIY TorchFunctionMode"] = make_step("DIY TorchFunctionMode", around=diy.collecting, end=diy.flush)
    elif args.worker == "rewritten":
        from msprobe_runtime import PrecisionDebugger

        variants["rewritten, off"] = make_step("rewritten, off")
        ours = (("ours L1", "L1", None), ("ours mix", "mix", None), ("ours L1 fingerprint", "L1", "fingerprint"))
        for name, level, mode in ours:
            dumps[name] = os.path.join(root, name.replace(" ", "_"))
            settings = {"task": "statistics", "level": level, "dump_path": dumps[name], "statistics": {}}
            if mode:
                settings["statistics"]["summary_mode"] = mode
            path = os.path.join(root, name.replace(" ", "_") + ".json")
            with open(path, "w") as handle:
                json.dump(settings, handle)
            debugger = PrecisionDebugger(config_path=path)
            debuggers.append(debugger)

            def end(debugger=debugger):
                debugger.stop()
                debugger.step()

            variants[name] = make_step(name, begin=lambda model, d=debugger: d.start(model), end=end)
    else:  # msprobe-L1, msprobe-mix: msprobe patches torch at construction and never restores
        level = args.worker.split("-", 1)[1]
        name = f"msprobe {level}"
        from msprobe.pytorch import PrecisionDebugger

        dumps[name] = os.path.join(root, "msprobe")
        debugger = PrecisionDebugger(dump_path=dumps[name], level=level, task="statistics")

        def end():
            debugger.stop()
            debugger.step()

        variants[name] = make_step(name, begin=lambda model: debugger.start(model=model), end=end)

    from timing import measure_interleaved

    rows = {name: {} for name in variants}
    try:
        medians = measure_interleaved(variants, args.steps, args.rounds, warmup=args.warmup)
    except Exception as error:  # noqa: BLE001 - msprobe's failure is a result
        if args.worker.startswith("msprobe"):
            print(json.dumps({"rows": {n: {"error": f"{type(error).__name__}: {error}"[:200]} for n in variants}}))
            return 0
        raise
    for name, step in variants.items():
        row = rows[name]
        row["step_ms"] = medians[name] * 1e3
        row["host_ms"] = statistics.median(host[name][-args.steps * args.rounds :]) * 1e3
        row["digest"] = digests[name]
        # host syncs in forward and backward of one step
        if cuda:
            caught = []

            @contextlib.contextmanager
            def probe(caught=caught):
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    try:
                        yield
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                caught.extend(str(w.message) for w in seen if "synchroniz" in str(w.message))

            step.state["sync_probe"] = probe()
            step()
            step.state["sync_probe"] = None
            row["syncs"] = len(caught)
            # peak memory of one step, as if this variant were alone on the device
            sync()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            step()
            row["peak_gb"] = (torch.cuda.max_memory_allocated() - before + own_bytes[name]) / 1e9
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=activities) as prof:
            step()
        row["aten_ops"], row["compute_ops"], row["launches"] = _count_ops(prof.events())
        if not cuda:
            row["launches"] = None
    for debugger in debuggers:  # ours write on a thread of their own: the dumps complete before they are counted
        debugger.wait()
    info = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "parameters": sum(p.numel() for p in template.parameters()),
        "attn_implementation": template.config._attn_implementation,
        "instrumented": "__msprobe__" in vars(sys.modules[type(template).__module__]),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
    }
    kernels = sys.modules.get("msprobe_runtime.triton_stats")
    if kernels is not None:  # launches made straight to a compiled kernel by Python (runtime/triton_launch.py)
        info["direct_launches"] = {
            name: getattr(kernels, name).direct
            for name in ("_PARTIALS", "_PARTIALS_FEW", "_PARTIALS_MANY", "_FINISH")
            if hasattr(kernels, name)
        }
    print(json.dumps({"rows": rows, "info": info, "dumps": dumps, "root": root}))
    return 0


# ----------------------------------------------------------------------------------------- driver side


def run_worker(python, group, args, hook=False):
    env = {**os.environ, **ENV}
    command = [python] + (["-m", "msprobe_rewrite", "run", "--packages", "transformers", "--"] if hook else [])
    command += [os.path.abspath(__file__), "--worker", group, "--device", args.device, "--size", args.size]
    command += ["--steps", str(args.steps), "--rounds", str(args.rounds), "--warmup", str(args.warmup)]
    command += ["--stats", args.stats, "--dtype", args.dtype]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"rows"')]
    if done.returncode != 0 or not lines:
        last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:]
        return {"error": f"failed: {last[0] if last else done.returncode}"}
    return json.loads(lines[-1])  # msprobe logs to stdout, also after our line


def msprobe_importable(python):
    if python == sys.executable:
        return importlib.util.find_spec("msprobe") is not None
    done = subprocess.run([python, "-c", "import msprobe.pytorch"], capture_output=True, env={**os.environ, **ENV})
    return done.returncode == 0


def _cell(value, form):
    return "n/a" if value is None else form.format(value)


def table(rows, plain):
    """The markdown table of ``rows`` ({variant: row}), ratios to ``plain``'s step."""
    lines = [
        "| variant | step ms | x plain | host ms | host syncs in fwd+bwd | peak device memory | kernel launches "
        "| ATen ops | ATen compute ops | compute ops per recorded tensor | entries / tensors | grads = plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        if "error" in row:
            lines.append(f"| {name} | {row['error']} |" + " |" * 11)
            continue
        lines.append(
            f"| {name} | {row['step_ms']:.1f} | {row['step_ms'] / plain['step_ms']:.2f} | {row['host_ms']:.1f} | "
            f"{_cell(row.get('syncs'), '{}')} | {_cell(row.get('peak_gb'), '{:.2f} GB')} | "
            f"{_cell(row.get('launches'), '{}')} | {row['aten_ops']} | {row['compute_ops']} | "
            f"{_cell(row.get('per_tensor'), '{:.2f}')} | "
            f"{_cell(row.get('entries'), '{}')} / {_cell(row.get('tensors'), '{}')} | {row['same_grads']} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", choices=SIZES, help="issue (the default on cuda) or small, tiny (the default on cpu)")
    parser.add_argument("--steps", type=int, help="timed steps per variant and round (default 4; 2 on cpu)")
    parser.add_argument("--rounds", type=int, help="rounds of interleaved timing (default 2; 1 on cpu)")
    parser.add_argument("--warmup", type=int, help="untimed steps per variant first (default 2; 1 on cpu)")
    parser.add_argument("--msprobe-python", help="interpreter with mindstudio-probe (default: this one, if it has it)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--stats",
        choices=("default", "triton-dispatch"),
        default="default",
        help="triton-dispatch (with --device cpu): ours on the device path, its kernels launched through a fake driver",
    )
    parser.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help="the model's (auto: bfloat16 on cuda and with --stats triton-dispatch, else float32)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stats != "default" and args.device != "cpu":
        parser.error("--stats triton-dispatch stands in for a device on the CPU (--device cpu)")
    cpu = args.device == "cpu"
    for key, on_gpu, on_cpu in (("size", "issue", "tiny"), ("steps", 4, 2), ("rounds", 2, 1), ("warmup", 2, 1)):
        if getattr(args, key) is None:
            setattr(args, key, on_cpu if cpu else on_gpu)
    if args.worker:
        return worker(args)

    started = time.time()
    groups = [("plain", sys.executable, False), ("rewritten", sys.executable, True)]
    python = args.msprobe_python or sys.executable
    has_msprobe = msprobe_importable(python)
    if has_msprobe:
        groups += [("msprobe-L1", python, False), ("msprobe-mix", python, False)]
    rows, info, roots = {}, {}, []
    for group, interpreter, hook in groups:
        result = run_worker(interpreter, group, args, hook)
        if "error" in result:
            if group.startswith("msprobe"):
                rows[f"msprobe {group[8:]}"] = {"error": result["error"]}
                continue
            sys.exit(f"group {group}: {result['error']}")
        info.setdefault(group, result.get("info"))
        rows.update(result["rows"])
        for name, path in result.get("dumps", {}).items():
            if name in rows and "error" not in rows[name]:
                rows[name]["entries"], rows[name]["tensors"] = _dump_counts(path)
        if result.get("root"):
            roots.append(result["root"])
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)
    plain = rows["plain"]
    errors = []
    for name, row in rows.items():
        if "error" in row:
            continue
        row["same_grads"] = "yes" if row["digest"] == plain["digest"] else "no"
        if row.get("tensors"):
            row["per_tensor"] = (row["compute_ops"] - plain["compute_ops"]) / row["tensors"]
        if cpu and name in OURS and row["same_grads"] != "yes":
            errors.append(f"{name}: gradients of the first step differ from plain's")
    if not has_msprobe:
        for level in ("L1", "mix"):
            rows[f"msprobe {level}"] = {"error": "not run (msprobe does not import)"}
    if not info["rewritten"]["instrumented"] or info["plain"]["instrumented"]:
        errors.append(
            f"instrumented: plain {info['plain']['instrumented']}, rewritten {info['rewritten']['instrumented']}"
        )

    size = SIZES[args.size]
    print(
        f"LlamaForCausalLM {size}, {info['plain']['parameters']:,} parameters, {info['plain']['device']}, attention "
        f"{info['plain']['attn_implementation']}, torch {info['plain']['torch']}, transformers "
        f"{info['plain']['transformers']}; {args.steps} steps x {args.rounds} rounds after {args.warmup} warm-up; "
        f"{time.time() - started:.0f} s"
    )
    print(table(rows, plain))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "info": info, "rows": rows}, handle, indent=2)
    for error in errors:
        print(f"ERROR: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
