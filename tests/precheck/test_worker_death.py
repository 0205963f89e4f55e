"""A worker process that dies in the middle of an API (a signal, ``os._exit``) ends the run with an error that
names that API, and the other APIs are still graded and reported; nothing waits for the dead worker.

The worker is killed for real: a catalogue of the test's own names one dump entry as a function that sends
SIGKILL, or calls ``os._exit``, to the process that replays it."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from .conftest import MSPROBE_TENSOR_DUMP, ROOT

# long enough for a loaded machine to import torch and replay six APIs many times over; only a hang reaches it
HANG_GUARD_S = 300

KILLERS = textwrap.dedent("""\
    import os
    import signal


    def sigkill(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)


    def exit_3(*args, **kwargs):
        os._exit(3)
    """)


def _dump_with_killer(tmp_path, killer):
    """msprobe's tensor dump with its tanh call renamed ``Torch.killer``, and the catalogue and module that make
    replaying ``Torch.killer`` call ``killer`` (a function of the module above)."""
    dump = tmp_path / "dump"
    shutil.copytree(MSPROBE_TENSOR_DUMP, dump)
    [path] = glob.glob(str(dump / "step0" / "*" / "dump.json"))
    with open(path) as handle:
        document = json.load(handle)
    document["data"] = {name.replace("Torch.tanh.", "Torch.killer."): entry for name, entry in document["data"].items()}
    with open(path, "w") as handle:
        json.dump(document, handle)
    (tmp_path / "precheck_killers.py").write_text(KILLERS)
    catalogue = tmp_path / "killers.yaml"
    catalogue.write_text(f"custom:\n  precheck_killers.{killer}: Torch.killer\n")
    return dump, catalogue


def _run_precheck_guarded(dump, out, *args, extra_path):
    """(exit status, stderr) of the precheck CLI in its own session; a run past HANG_GUARD_S is killed with every
    process it started, and the test fails."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(extra_path), ROOT, os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen(
        [sys.executable, "-m", "msprobe_rewrite", "precheck", str(dump), "-o", str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        _, err = process.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"precheck still running after {HANG_GUARD_S} s: it waits for a dead worker")
    return process.returncode, err


@pytest.mark.slow  # over 2 s: `make check` leaves it to `make test`
@pytest.mark.parametrize("killer, cause", [("sigkill", "signal 9"), ("exit_3", "status 3")])
def test_a_dead_worker_ends_the_run_with_its_api_named(tmp_path, killer, cause):
    dump, catalogue = _dump_with_killer(tmp_path, killer)
    out = tmp_path / "out"
    code, err = _run_precheck_guarded(dump, out, "-j", "2", "-q", "--catalogue", catalogue, extra_path=tmp_path)
    assert code == 2, err
    [line] = [line for line in err.splitlines() if "Torch.killer.0" in line]
    assert "worker process" in line and "died" in line and cause in line, err
    assert "Traceback" not in err
    # the other five APIs were replayed and graded by the workers that lived
    summary = json.load(open(out / "precheck_summary.json"))
    assert summary["counts"]["pass"] == 5, summary["counts"]
    assert [problem["api"] for problem in summary["input_problems"]] == ["Torch.killer.0"]
