"""Import time of megatron-core: plain, under the import hook with a cold cache, and with a warm cache.

Every figure comes from the same run, each import in a fresh interpreter with torch already imported (torch's
own import time would swamp the difference), and is printed as a ratio to the plain import. The cold import
is also compared with rewriting the same modules' files with the compiler directly (what the CLI does per
file, on one core). Targets (issue 4): warm at most 1.1x plain; cold at most the CLI's rewrite time.

    python bench/import_time.py [--module megatron.core.models.gpt] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
import torch
hook = sys.argv[1] == "hook"
if hook:
    from msprobe_rewrite import install_import_hook
    install_import_hook(["megatron"])
start = time.perf_counter()
__import__(sys.argv[2])
elapsed = time.perf_counter() - start
files = sorted(m.__file__ for name, m in list(sys.modules.items())
               if name.split(".")[0] == "megatron" and getattr(m, "__file__", None))
print(json.dumps({"seconds": elapsed, "files": files}))
"""


def child(mode: str, module: str, prefix: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=prefix, TORCHDYNAMO_DISABLE="1", PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, "-c", CHILD, mode, module], capture_output=True, text=True, env=env,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def rewrite_seconds(files) -> float:
    from msprobe_rewrite.api import default_catalogue, rewrite_source

    catalogue = default_catalogue()
    start = time.perf_counter()
    for path in files:
        with open(path, "rb") as handle:
            rewrite_source(handle.read(), catalogue, path=path)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="megatron.core.models.gpt")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    plain, cold, warm, cli = [], [], [], []
    files = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as prefix:
            child("plain", args.module, prefix)  # fills the normal bytecode cache under this prefix
            plain.append(child("plain", args.module, prefix)["seconds"])
            first = child("hook", args.module, prefix)
            cold.append(first["seconds"])
            warm.append(child("hook", args.module, prefix)["seconds"])
            files = first["files"]
        cli.append(rewrite_seconds(files))
    base = statistics.median(plain)
    rows = [("plain import", statistics.median(plain)), ("hook, cold cache", statistics.median(cold)),
            ("hook, warm cache", statistics.median(warm)), ("compiler on the same files", statistics.median(cli))]
    print(f"import {args.module} ({len(files)} megatron modules), median of {args.repeat}, torch pre-imported")
    for label, seconds in rows:
        print(f"  {label:<28} {seconds:8.3f} s   {seconds / base:6.2f}x plain")
    print(f"  cold / compiler on the same files: {statistics.median(cold) / statistics.median(cli):.2f}"
          " (target <= 1)")
    print(f"  warm / plain: {statistics.median(warm) / base:.2f} (target <= 1.1)")


if __name__ == "__main__":
    main()
