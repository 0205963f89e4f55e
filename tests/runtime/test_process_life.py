"""A process's life around collection: a child forked after start() writes its own step and exits, an uncaught
exception still writes the step it ended, and a debugger started inside another's window is refused loudly
rather than leaving the outer dump without the calls that follow. Each runs in a fresh interpreter, since what
is tested is the process's exit (atexit, fork)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import ROOT, rewrite_file

pytest.importorskip("torch")


def _run(tmp_path, source, *args, env=None):
    plain = tmp_path / "plain_script.py"
    plain.write_text(textwrap.dedent(source))
    script = rewrite_file(str(plain), tmp_path, "script.py")
    full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    # a timeout, not a hang: the fork case hung in the child's wait() before (the parent's writer thread)
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=full_env, timeout=120)


def _entries(dump):
    found = {}
    for folder, _, files in os.walk(dump):
        if "dump.json" in files:
            with open(os.path.join(folder, "dump.json")) as handle:
                found[os.path.relpath(folder, dump)] = sorted(json.load(handle)["data"])
    return found


@pytest.mark.parametrize("writing_process", ["1", "0"])
def test_a_child_forked_while_collecting_writes_its_own_step(tmp_path, writing_process):
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    dump = tmp_path / "dump"
    done = _run(
        tmp_path,
        """
        import json, os, sys, torch
        from msprobe_runtime import PrecisionDebugger
        debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L1")
        x = torch.ones(3)
        debugger.start(); torch.relu(x); debugger.stop(); debugger.step()  # the writer thread runs now
        debugger.start()
        torch.abs(x)  # before the fork: both processes ran it
        pid = os.fork()
        if pid == 0:
            torch.sigmoid(x)
            debugger.stop(); debugger.step(); debugger.wait()
            os._exit(0)
        torch.tanh(x)
        debugger.stop(); debugger.step(); debugger.wait()
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"child": pid, "parent": os.getpid(), "status": status}))
    """,
        str(dump),
        env={"MSPROBE_WRITER_PROCESS": writing_process},
    )
    assert done.returncode == 0, done.stderr
    pids = json.loads(done.stdout.strip().splitlines()[-1])
    assert pids["status"] == 0
    entries = _entries(dump)
    assert entries == {
        f"step0/proc{pids['parent']}": ["Torch.relu.0.forward"],
        f"step1/proc{pids['parent']}": ["Torch.abs.0.forward", "Torch.tanh.0.forward"],
        f"step1/proc{pids['child']}": ["Torch.abs.0.forward", "Torch.sigmoid.0.forward"],
    }


@pytest.mark.parametrize("writing_process", ["1", "0"])
def test_an_uncaught_exception_writes_the_step_it_ended(tmp_path, writing_process):
    dump = tmp_path / "dump"
    done = _run(
        tmp_path,
        """
        import sys, torch
        from msprobe_runtime import PrecisionDebugger
        debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L1")
        x = torch.ones(3)
        for step in range(3):
            debugger.start()
            torch.relu(x)
            if step == 1:
                torch.sigmoid(x)
                raise RuntimeError("loss is nan")
            debugger.stop(); debugger.step()
    """,
        str(dump),
        env={"MSPROBE_WRITER_PROCESS": writing_process},
    )
    assert done.returncode == 1
    # the user's traceback is the last word, unchanged
    assert done.stderr.rstrip().endswith("RuntimeError: loss is nan")
    entries = {key.split("/")[0]: value for key, value in _entries(dump).items()}
    assert entries == {"step0": ["Torch.relu.0.forward"], "step1": ["Torch.relu.0.forward", "Torch.sigmoid.0.forward"]}


def test_a_debugger_started_inside_another_is_refused_and_the_outer_keeps_every_call(tmp_path):
    done = _run(
        tmp_path,
        """
        import sys, torch
        from msprobe_runtime import PrecisionDebugger
        outer = PrecisionDebugger(dump_path=sys.argv[1] + "/outer", level="L1")
        inner = PrecisionDebugger(dump_path=sys.argv[1] + "/inner", level="L1")
        x = torch.ones(3)
        for step in range(2):
            outer.start()
            torch.relu(x)
            inner.start()
            torch.sigmoid(x)
            inner.stop()
            torch.tanh(x)
            outer.stop(); outer.step(); inner.step()
        inner.start(); torch.abs(x); inner.stop(); inner.step()  # alone, it collects
        outer.wait(); inner.wait()
    """,
        str(tmp_path / "dumps"),
    )
    assert done.returncode == 0, done.stderr
    entries = _entries(tmp_path / "dumps")
    every = ["Torch.relu.0.forward", "Torch.sigmoid.0.forward", "Torch.tanh.0.forward"]
    assert {key.rsplit("/", 1)[0]: value for key, value in entries.items()} == {
        "outer/step0": every,
        "outer/step1": every,
        "inner/step2": ["Torch.abs.0.forward"],
    }
    # said once, naming both dumps
    refusals = [line for line in done.stderr.splitlines() if "is refused" in line]
    assert len(refusals) == 1
    assert str(tmp_path / "dumps" / "inner") in refusals[0] and str(tmp_path / "dumps" / "outer") in refusals[0]
