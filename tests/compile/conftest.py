"""The programs of fixtures/compiled/cases.py, run as written and rewritten, with and without collection."""

import concurrent.futures
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fixtures.reproducible_env import training_env

ROOT = Path(__file__).resolve().parents[2]
CASES_DIR = ROOT / "fixtures" / "compiled"
LEVELS = ("L0", "L1", "mix")


def as_module(source, name):
    """The namespace of ``source`` run as module ``name``, as an import would leave it: in ``sys.modules``,
    where Dynamo looks a traced function's module up (torch 2.11 imports it by name and fails without), and
    with the runtime bound as ``__msprobe__``."""
    import msprobe_runtime

    module = types.ModuleType(name)
    module.__msprobe__ = msprobe_runtime
    sys.modules[name] = module
    exec(compile(source, f"{name}.py", "exec"), vars(module))
    return vars(module)


def run_cases(script, level, workdir, pythonpath, *extra):
    """One run of ``cases.py``: ``(result dict or None, error text)``."""
    workdir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(script), "--level", level, *extra]
    if level != "none":
        command += ["--dump", str(workdir / "dump")]
    env = training_env(pythonpath, PYTHONWARNINGS="ignore")
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=900, env=env)
    tail = f"rc {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or len(lines) != 1:
        return None, tail
    return {"cases": json.loads(lines[0][len("RESULT ") :]), "stderr": done.stderr}, tail


@pytest.fixture(scope="session")
def rewritten_cases(tmp_path_factory):
    """fixtures/compiled rewritten by the CLI: the program that calls compiled code is instrumented too."""
    copy = tmp_path_factory.mktemp("compiled_cases")
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "--out", str(copy / "compiled"), str(CASES_DIR)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (copy / "compiled" / "cases.py").read_text().count("__msprobe__.dyn") > 5
    return copy / "compiled" / "cases.py"


@pytest.fixture(scope="session")
def case_runs(rewritten_cases, megatron_copy, tmp_path_factory):
    """``{variant: (result or None, error text, dump dir)}``: "original" is the program as written over
    megatron-core as installed, "off" the rewritten program over the rewritten megatron-core with no debugger,
    and each level that one collecting. Two at a time."""
    root = tmp_path_factory.mktemp("compiled_runs")
    jobs = {"original": (CASES_DIR / "cases.py", "none", None), "off": (rewritten_cases, "none", megatron_copy)}
    jobs.update((level, (rewritten_cases, level, megatron_copy)) for level in LEVELS)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            name: pool.submit(run_cases, script, level, root / name, path)
            for name, (script, level, path) in jobs.items()
        }
        return {name: (*future.result(), root / name / "dump") for name, future in futures.items()}
