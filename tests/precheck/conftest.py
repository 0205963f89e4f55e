"""Dumps for the pre-check tests, made by our own runtime from the plain fixtures (rewritten by the compiler
into a temporary directory) with one API made imprecise by fixtures/precheck/inject.py, and a runner for
``msprobe-rewrite precheck`` in a fresh interpreter."""

import csv
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INJECT = os.path.join(ROOT, "fixtures", "precheck", "inject.py")
MSPROBE_TENSOR_DUMP = os.path.join(ROOT, "fixtures", "msprobe_dump", "tensor_dump")
MSPROBE_STATISTICS_DUMP = os.path.join(ROOT, "fixtures", "msprobe_dump", "dump")


def _env(extra_path=()):
    return dict(os.environ, PYTHONPATH=os.pathsep.join([*extra_path, ROOT, os.environ.get("PYTHONPATH", "")]))


def run_precheck(dump, out, *args):
    """(exit status, stdout, stderr) of ``msprobe-rewrite precheck DUMP -o OUT ARGS``."""
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "precheck", str(dump), "-o", str(out), *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    return done.returncode, done.stdout, done.stderr


def verdicts(out):
    """API call -> its status in the summary (error, warning, skip; pass for the rest of the CSV's APIs)."""
    summary = json.load(open(os.path.join(out, "precheck_summary.json")))
    status = {}
    with open(os.path.join(out, "precheck_result.csv"), encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            status.setdefault(row["API"], "pass")
    for entry in summary["failing"]:
        status[entry["api"]] = entry["status"]
    for entry in summary["skipped"]:
        status[entry["api"]] = "skip"
    return status, summary


def api_of(call):
    """``Functional.silu.0`` -> ``Functional.silu``."""
    return call.rsplit(".", 1)[0]


@pytest.fixture(scope="session")
def rewritten(tmp_path_factory):
    """``rewritten("fixtures/bignet/bignet.py")``: the path of its instrumented copy (made once)."""
    from msprobe_rewrite.api import rewrite_source

    directory = tmp_path_factory.mktemp("precheck_fixtures")
    made = {}

    def make(relative):
        if relative not in made:
            source = os.path.join(ROOT, relative)
            with open(source, "rb") as handle:
                text = rewrite_source(handle.read(), path=source)
            target = directory / os.path.basename(relative)
            target.write_bytes(text)
            made[relative] = target
        return made[relative]

    return make


@pytest.fixture(scope="session")
def injected_dump(rewritten, tmp_path_factory):
    """``injected_dump(fixture, api, mode)``: a task 'tensor' L1 dump of one step with ``api`` imprecise."""
    root = tmp_path_factory.mktemp("precheck_dumps")
    made = {}

    def make(fixture, api=None, mode="bias", extra_path=(), gpt=False, gpt_args=()):
        key = (fixture, api, mode, gpt)
        if key not in made:
            target = root / f"dump{len(made)}"
            command = [sys.executable, INJECT, "--dump", str(target), "--mode", mode]
            if api:
                command += ["--api", api]
            command += ["--gpt", "--", *gpt_args] if gpt else ["--script", str(rewritten(fixture))]
            done = subprocess.run(
                command, capture_output=True, text=True, env=_env(extra_path), timeout=900, cwd=str(root)
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            made[key] = target
        return made[key]

    return make
