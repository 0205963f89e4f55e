"""The README's demo command runs end to end and reports a bit-identical run and a real dump; what it prints for
a new user holds: the native op's build is said while it happens, and the follow-up commands run as printed."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the demo trains in a fresh interpreter

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """(the demo's output folder, its stdout) of one run with two steps."""
    out = tmp_path_factory.mktemp("demo") / "demo out"
    result = subprocess.run(
        [sys.executable, "-m", "fixtures.demo", "--out", str(out), "--steps", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result.stdout


def test_demo_rewrites_trains_and_summarises_the_dump(demo):
    out, stdout = demo
    assert "bit-identical with collection on: yes" in stdout
    assert f"The dump is in {out / 'dump'}" in stdout
    dumps = sorted((out / "dump").glob("step*/*/dump.json"))
    assert len(dumps) == 2
    data = json.loads(dumps[0].read_text())["data"]
    assert "Functional.linear.0.forward" in data and "Module.net1.ln1.Linear.backward.0" in data
    assert "__msprobe__" in (out / "bignet" / "bignet.py").read_text()


def test_the_printed_follow_up_commands_run_as_printed_in_a_new_shell(demo, tmp_path):
    """The demo closed with `msprobe-rewrite compare DUMP OTHER_DUMP -o compare-report`: no second dump to compare
    with, and a command a new shell does not find (the CLI is in .venv/bin, which the README never activates).
    Each printed command runs as printed, from another folder, with no venv on PATH."""
    out, stdout = demo
    lines = stdout.split("5. Next", 1)[1].splitlines()[1:]
    commands = [line.strip() for line in lines if line.startswith("     ")]
    assert len(commands) == 2 and " compare " in commands[1], stdout
    bin_dir = os.path.dirname(sys.executable)
    path = os.pathsep.join(entry for entry in os.environ.get("PATH", "").split(os.pathsep) if entry != bin_dir)
    env = {name: value for name, value in os.environ.items() if name != "VIRTUAL_ENV"}
    env["PATH"] = path
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
    assert len(sorted((out / "dump2").glob("step*/*/dump.json"))) == 2
    summary = json.loads((out / "compare-report" / "compare_summary.json").read_text())
    assert summary["first_divergence"] is None  # the same program twice: the runs agree


def test_the_native_op_build_is_said_while_it_happens(tmp_path):
    """With nothing cached the first training builds the native statistics op (about a minute); its warning went
    to a captured stderr, and the demo said nothing meanwhile. It reaches the demo's output while the build runs:
    the demo is stopped as soon as the line is read."""
    env = {name: value for name, value in os.environ.items() if name != "MSPROBE_NATIVE_STATS"}
    env["MSPROBE_CACHE_DIR"] = str(tmp_path / "empty cache")
    process = subprocess.Popen(
        [sys.executable, "-m", "fixtures.demo", "--out", str(tmp_path / "out"), "--steps", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen = []
    try:
        for line in process.stdout:
            seen.append(line)
            if "building the native statistics op" in line:
                break
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the demo, its training and the compiler under it
        process.wait()
        process.stdout.close()
    text = "".join(seen)
    assert "building the native statistics op" in text, text
    assert text.index("2. Training the instrumented copy") < text.index("building the native statistics op")
    assert "4. The dump is in" not in text  # said while the build ran, not after the demo was done
