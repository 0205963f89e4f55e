"""Hit rates on cross-device scenarios: our first suspect, our first divergence, and msprobe's compare.

    python bench/cross_device.py                          # 100 scenarios (seed 16), msprobe if available
    python bench/cross_device.py --count 20 --no-msprobe  # quick
    python bench/cross_device.py --manifest DIR/manifest.json   # reuse dumps written before

Each scenario (fixtures/cross_device) is a pair of dumps of one model on two imitated devices (ulp noise
everywhere) with one culprit op in run A, and the same pair without the culprit. A tool hits when the entry
it names first is the culprit's forward entry; on the noise-only pair it should name nothing. msprobe's
compare (mindstudio-probe 26.2, in its own interpreter) names, in our reading, the first row of its CSV
whose Result is not "pass" (its "warning" fires when an output's norm relative error is 10x its input's).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def msprobe_first(cli: str, run_a: str, run_b: str, work: str):
    """The entry of the first non-pass row of ``msprobe compare`` (None when every row passes)."""
    from fixtures.cross_device.scenarios import dump_file

    out = tempfile.mkdtemp(dir=work)
    done = subprocess.run(
        [cli, "compare", "-tp", dump_file(run_a), "-gp", dump_file(run_b), "-o", out],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out,
    )
    rows = glob.glob(os.path.join(out, "compare_result_*.csv"))
    if done.returncode != 0 or not rows:
        return "error: " + (done.stdout + done.stderr)[-300:]
    with open(dump_file(run_a)) as handle:
        names = set(json.load(handle)["data"])
    with open(rows[0], newline="") as handle:
        for row in csv.DictReader(handle):
            if row["Result"].lower() not in ("pass", ""):
                name = row["NPU Name"]
                while name and name not in names:
                    name = name.rpartition(".")[0]
                return name or row["NPU Name"]
    shutil.rmtree(out, ignore_errors=True)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--manifest", help="a manifest.json written before (skips generating dumps)")
    parser.add_argument("--keep", help="write the dumps here and keep them")
    parser.add_argument("--msprobe-python", default="/tmp/msprobe-venv/bin/python")
    parser.add_argument("--no-msprobe", action="store_true")
    args = parser.parse_args()
    from fixtures.cross_device.scenarios import judge

    work = args.keep or tempfile.mkdtemp(prefix="cross-device-")
    os.makedirs(work, exist_ok=True)
    manifest_path = args.manifest
    if manifest_path is None:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "fixtures.cross_device.scenarios",
                "--count",
                str(args.count),
                "--seed",
                str(args.seed),
                "--out",
                work,
            ],
            check=True,
            env=env,
            cwd=ROOT,
            stderr=subprocess.DEVNULL,
        )
        manifest_path = os.path.join(work, "manifest.json")
    with open(manifest_path) as handle:
        manifest = json.load(handle)
    ours = judge(manifest)
    count = ours["count"]
    print(f"{count} scenarios ({', '.join(sorted({m['model'] for m in manifest}))})")
    print(
        f"msprobe-rewrite compare, first suspect:    {ours['suspect_hits']:3d}/{count} culprits named first, "
        f"{ours['noise_clean']:3d}/{count} noise-only pairs with no suspect"
    )
    print(
        f"msprobe-rewrite compare, first divergence: {ours['divergence_hits']:3d}/{count} culprits named first, "
        f"{sum(not r['noise_divergence'] for r in ours['rows']):3d}/{count} noise-only pairs with no divergence"
    )
    cli = os.path.join(os.path.dirname(args.msprobe_python), "msprobe")
    if args.no_msprobe or not os.path.exists(cli):
        print("msprobe compare: not run" + ("" if args.no_msprobe else f" (no {cli})"))
        if not args.keep and args.manifest is None:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    hits = clean = 0
    for row in ours["rows"]:
        named = msprobe_first(cli, row["a"], row["b"], work)
        noise = msprobe_first(cli, row["noise"], row["b"], work)
        hits += named == row["truth"]
        clean += noise is None
        row["msprobe"], row["msprobe_noise"] = named, noise
    print(
        f"msprobe compare (26.2), first warning:     {hits:3d}/{count} culprits named first, "
        f"{clean:3d}/{count} noise-only pairs with no warning"
    )
    if args.keep:
        with open(os.path.join(work, "cross_device_results.json"), "w") as handle:
            json.dump(ours["rows"], handle, indent=1)
        print(f"per-scenario results: {os.path.join(work, 'cross_device_results.json')}")
    elif args.manifest is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
