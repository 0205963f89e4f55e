"""Records of a step that the device path leaves to the runtime's Python path, counted on tiny transformers models
(issue 31: each is tens of µs of host time and several launches, and makes the step's writer walk every entry).

    python bench/python_path_records.py                             # Llama, BERT (masks with padding), Qwen3-MoE
    python bench/python_path_records.py --models llama --level mix --summary-mode fingerprint
    python bench/python_path_records.py --json out.json

Each model runs in its own process, transformers rewritten on import (``msprobe-rewrite run --packages
transformers``), in bfloat16: hidden 64, 2 layers, 2 sequences of 16 tokens, an attention mask whose second sequence
begins with 5 padding tokens (Llama, BERT). A step is forward with labels, backward, AdamW and zero_grad between
``start`` and ``stop``; the fourth step is counted. Counted: every tensor whose statistics the Python path reads
(``StatBuffer.add``), by dtype, shape and the collector's method, and every backward hook that leaves its gradients to
the Python path. Without a GPU the device path runs on CPU tensors taken as a GPU's (``triton_cpu="lane"``, the
kernels under Triton's interpreter, as tests/runtime/test_native_lane.py runs them); ``--device cuda`` on one. The
counts do not depend on the machine's load.
"""

import argparse
import collections
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

MODELS = ("llama", "bert", "qwen3moe")


def build(name, torch, transformers):
    """The model ``name`` and its step's keyword arguments."""
    ids = torch.randint(3, 128, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, :5] = 0  # padding: the masks are built, not left to SDPA's causal flag
    if name == "llama":
        config = transformers.LlamaConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=176,
            vocab_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa",
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config), dict(input_ids=ids, labels=ids, attention_mask=mask)
    if name == "bert":
        config = transformers.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=128,
            attn_implementation="sdpa",
        )  # fmt: skip
        return transformers.BertForMaskedLM(config), dict(input_ids=ids, labels=ids, attention_mask=mask)
    config = transformers.Qwen3MoeConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=128, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, vocab_size=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.Qwen3MoeForCausalLM(config), dict(input_ids=ids, labels=ids)


def run_model(args):
    """One model in this process (rewritten on import): its counts of the fourth step."""
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton's first import: the kernels run on CPU tensors
    import torch
    import transformers

    from msprobe_runtime import PrecisionDebugger, collector, statistics

    torch.set_num_threads(1)
    if args.device == "cpu":
        collector.StatBuffer = lambda counts: statistics.StatBuffer(counts, triton_cpu="lane")
    counting, records, hooks = [False], collections.Counter(), collections.Counter()
    real_add = statistics.StatBuffer.add

    def add(self, t, *rest):
        if counting[0]:
            methods = [frame.name for frame in traceback.extract_stack()[:-1] if "msprobe_runtime" in frame.filename]
            records[f"{str(t.dtype)[6:]} {list(t.shape)} in {' <- '.join(methods[-2:])}"] += 1
        return real_add(self, t, *rest)

    statistics.StatBuffer.add = add
    for name in ("_api_backward_fallback", "_module_backward_fallback"):
        real = getattr(collector, name)

        def fallback(*rest, real=real, name=name):
            if counting[0]:
                hooks[name.strip("_").split("_")[0]] += 1
            return real(*rest)

        setattr(collector, name, fallback)
    torch.manual_seed(0)
    model, inputs = build(args.model, torch, transformers)
    model = model.to(device=args.device, dtype=torch.bfloat16)
    inputs = {key: value.to(args.device) for key, value in inputs.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    dump = tempfile.mkdtemp(prefix="python_path_records_")
    config = os.path.join(dump, "config.json")
    with open(config, "w") as handle:
        json.dump({"statistics": {"summary_mode": args.summary_mode}}, handle)
    dump_path = os.path.join(dump, "dump")
    debugger = PrecisionDebugger(config_path=config, dump_path=dump_path, task="statistics", level=args.level)
    for step in range(4):
        counting[0] = step == 3
        debugger.start(model)
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        debugger.stop()
        debugger.step()
    debugger.wait()
    shutil.rmtree(dump, ignore_errors=True)
    return {"model": args.model, "records": sum(records.values()), "hooks": sum(hooks.values()),
            "by kind": dict(records.most_common()), "hooks by kind": dict(hooks)}  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--level", default="L1", choices=("L1", "mix"))
    parser.add_argument("--summary-mode", default="statistics", choices=("statistics", "fingerprint"))
    parser.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)  # one model, in the worker process
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.model:
        print(json.dumps(run_model(args)))
        return 0
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"unknown models: {', '.join(sorted(unknown))} (known: {', '.join(MODELS)})")
    for needed in ("triton", "transformers"):
        if importlib.util.find_spec(needed) is None:
            print(f"skipped: {needed} is not installed here")
            return 0
    rows = []
    for model in args.models.split(","):
        command = [sys.executable, "-m", "msprobe_rewrite", "run", "--packages", "transformers", "--"]
        command += [os.path.abspath(__file__), "--model", model, "--device", args.device, "--level", args.level]
        command += ["--summary-mode", args.summary_mode]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            return 1
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"bf16, {args.device}, {args.level}, summary_mode {args.summary_mode}: one step's records by the Python path")
    print("| model | records | backward hooks left to Python |")
    print("|---|---|---|")
    for row in rows:
        print(f"| {row['model']} | {row['records']} | {row['hooks']} |")
    for row in rows:
        for kind, count in row["by kind"].items():
            print(f"  {row['model']}: {count} x {kind}")
        for kind, count in row["hooks by kind"].items():
            print(f"  {row['model']}: {count} x a {kind} backward hook")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
