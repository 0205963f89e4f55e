"""Dumps for the compare tests, produced by the project's own runtime from fixtures/compare_models/train.py.

The plain fixture is rewritten by the compiler into a temporary directory and run in fresh interpreters,
once per variant (a clean run, a 1 % scaling at one API, a NaN at one API, one extra call, ...); each dump
is made once per session and shared by the tests that read it.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "fixtures", "compare_models", "train.py")
MSPROBE_DUMP = os.path.join(ROOT, "fixtures", "msprobe_dump", "dump")


def fixture_line(text):
    """The line number of ``text`` in the plain fixture (the rewrite keeps every line where it was)."""
    with open(FIXTURE) as handle:
        for number, line in enumerate(handle, 1):
            if text in line:
                return number
    raise AssertionError(f"{text!r} not in {FIXTURE}")


def run_compare(*args, cwd=None):
    """``msprobe-rewrite compare ARGS`` in a fresh interpreter: (exit status, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "compare", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="session")
def script(tmp_path_factory):
    from msprobe_rewrite.api import rewrite_source

    directory = tmp_path_factory.mktemp("compare_models")
    with open(FIXTURE, "rb") as handle:
        rewritten = rewrite_source(handle.read(), path=FIXTURE)
    path = directory / "train.py"
    path.write_bytes(rewritten)
    return path


@pytest.fixture(scope="session")
def make_dump(script, tmp_path_factory):
    """``make_dump(*args)``: the dump directory of one training run with those options (made once)."""
    made = {}
    root = tmp_path_factory.mktemp("dumps")

    def make(*args):
        if args not in made:
            target = root / f"run{len(made)}"
            env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
            done = subprocess.run(
                [sys.executable, str(script), "--dump", str(target), *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            json.loads(done.stdout.strip().splitlines()[-1])
            made[args] = target
        return made[args]

    return make
