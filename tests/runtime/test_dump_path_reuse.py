"""The README's loop run twice with one dump_path: refused by default (DumpPathError, nothing overwritten), the
earlier dump replaced under MSPROBE_DUMP_OVERWRITE=1, as msprobe overwrites it."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each run is a fresh interpreter, as a user's second run is

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = """
import sys, torch
from msprobe_runtime import PrecisionDebugger
debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L1")
for step in range(int(sys.argv[2])):
    debugger.start()
    torch.relu(torch.full((2,), float(sys.argv[3])))
    debugger.stop()
    debugger.step()
"""


def _train(tmp_path, dump, steps, value, **environment):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {name: value for name, value in os.environ.items() if name != "MSPROBE_DUMP_OVERWRITE"}
    env.update(PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), **environment)
    return subprocess.run(
        [sys.executable, str(script), str(dump), str(steps), str(value)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _dumps(dump):
    return sorted(
        os.path.relpath(os.path.join(folder, "dump.json"), dump)
        for folder, _, files in os.walk(dump)
        if "dump.json" in files
    )


def test_a_second_run_into_the_same_dump_path_is_refused_by_default(tmp_path):
    dump = tmp_path / "dump"
    assert _train(tmp_path, dump, 2, 1.0).returncode == 0
    before = {name: (dump / name).read_bytes() for name in _dumps(dump)}
    again = _train(tmp_path, dump, 1, 2.0)
    assert again.returncode != 0
    assert "DumpPathError" in again.stderr and f"{str(dump)!r} already holds a dump" in again.stderr
    assert "MSPROBE_DUMP_OVERWRITE=1" in again.stderr  # the way to msprobe's behaviour is named
    assert {name: (dump / name).read_bytes() for name in _dumps(dump)} == before


def test_overwrite_switch_replaces_the_earlier_dump(tmp_path):
    """Before, no switch: a second run needed a new dump_path. With MSPROBE_DUMP_OVERWRITE=1 the earlier run's
    folders go (step1 too, which the new run does not reach), and a live process's proc folder stays."""
    dump = tmp_path / "dump"
    assert _train(tmp_path, dump, 2, 1.0).returncode == 0
    [old0, old1] = _dumps(dump)
    sibling = dump / "step0" / f"proc{os.getpid()}"  # this test's process: alive, maybe writing now
    sibling.mkdir()
    (sibling / "dump.json").write_text("{}")
    again = _train(tmp_path, dump, 1, 2.0, MSPROBE_DUMP_OVERWRITE="1")
    assert again.returncode == 0, again.stderr
    assert "removed the earlier dump" in again.stderr
    remaining = _dumps(dump)
    assert old0 not in remaining and old1 not in remaining and not (dump / "step1").exists()
    new = [name for name in remaining if name != os.path.relpath(sibling / "dump.json", dump)]
    assert len(new) == 1 and new[0].startswith("step0" + os.sep + "proc")
    assert '"Max": 2.0' in (dump / new[0]).read_text()
    assert (sibling / "dump.json").read_text() == "{}"
