"""stack.json holds the user's program's frames, not the tool's, and compare names the user's line.

BigNet (fixtures/bignet) is trained under ``msprobe-rewrite run`` (the console script and ``python -m``, with
the native op and with ``MSPROBE_NATIVE_STATS=0``, a script and ``-m module``) and under the import hook
installed from the environment, as real processes. A second run of each changes BatchNorm's ``eps``, so the
first divergence is ``Functional.batch_norm``, a torch call inside ``nn.BatchNorm1d`` (not rewritten: the
observing mode sees it), whose user line is ``bignet.py:31`` (``x2 = self.bn1(x)``); ``Tensor.__add__`` at
``bignet.py:33`` is recorded by the rewrite.
"""

import csv
import glob
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import msprobe_rewrite
import msprobe_runtime

pytestmark = pytest.mark.slow  # over 2 s a test: its programs run under `run` and the hook in subprocesses

ROOT = Path(__file__).resolve().parents[2]
BIGNET = ROOT / "fixtures" / "bignet"
TOOL_DIRS = (
    os.path.dirname(os.path.abspath(msprobe_rewrite.__file__)) + os.sep,
    os.path.dirname(os.path.realpath(msprobe_runtime.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(msprobe_runtime.__file__)) + os.sep,
)
CONSOLE_SCRIPT = Path(sys.executable).parent / "msprobe-rewrite"

# a program beside which bignet is not: it imports it by path, so the run instruments bignet only when told
DRIVER = textwrap.dedent("""
    import os
    import sys

    sys.path.insert(0, os.environ["BIGNET_DIR"])
    import bignet  # noqa: E402
    from torch import nn  # noqa: E402

    if os.environ.get("BIGNET_BN_EPS"):
        _init = nn.BatchNorm1d.__init__

        def _with_eps(self, *args, **kwargs):
            _init(self, *args, **kwargs)
            self.eps = float(os.environ["BIGNET_BN_EPS"])

        nn.BatchNorm1d.__init__ = _with_eps
    bignet.main()
""")


def _train(tmp, name, launcher, env=()):
    """Train BigNet for one step with mix collection into ``tmp/name``; the step's rank folder."""
    driver = tmp / "driver.py"
    driver.write_text(DRIVER)
    environment = {**os.environ, "BIGNET_DIR": str(BIGNET), **dict(env)}
    program = ["driver.py", "--level", "mix", "--dump", str(tmp / name), "--steps", "1"]
    if launcher == "hook":
        hook_path = subprocess.run(
            [sys.executable, "-m", "msprobe_rewrite", "hook-path"], capture_output=True, text=True, check=True
        ).stdout.strip()
        environment["PYTHONPATH"] = os.pathsep.join([hook_path, environment.get("PYTHONPATH", "")])
        environment["MSPROBE_REWRITE_PACKAGES"] = "bignet"
        command = [sys.executable, *program]
    elif launcher[-1] == "-m":
        command = [*launcher, "driver", *program[1:]]
    else:
        command = [*launcher, "run", "--packages", "bignet", "--", *program]
    result = subprocess.run(command, cwd=tmp, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    [rank] = glob.glob(str(tmp / name / "step0" / "*"))
    return Path(rank)


def _stacks(rank):
    """Entry name -> its frames, as stack.json writes them (``File F, line N, in FUNC, \\n SOURCE``)."""
    table = json.loads((rank / "stack.json").read_text())
    return {name: frames for names, frames in table.values() for name in names}


def _file(frame):
    return frame[len("File ") : frame.index(", line ")]


def _compare(out, a, b):
    result = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "compare", "-o", str(out), str(a), str(b)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1, result.stdout + result.stderr  # 1: the runs diverge
    sites = {}
    for path in out.glob("compare_result_*.csv"):
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                if row["NPU_Stack_Info"] not in ("", "N/A"):  # on an entry's first row only
                    sites.setdefault(row["NPU Name"].rsplit(".", 2)[0], row["NPU_Stack_Info"])
    return result.stdout, sites


RUN_MODULE = [sys.executable, "-m", "msprobe_rewrite"]
# how the program is started, and with which capture of the stacks (the native op's or Python's)
LAUNCHERS = {
    "run, console script": ([str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else RUN_MODULE, {}),
    "run, python -m, no native op": (RUN_MODULE, {"MSPROBE_NATIVE_STATS": "0"}),
    "run -m driver": ([*RUN_MODULE, "run", "--packages", "bignet", "-m"], {}),
    "import hook": ("hook", {}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """launcher -> (rank folder of run a, of run b with another eps, a folder for their comparison)."""
    tmp = tmp_path_factory.mktemp("runs")  # one driver.py for all, so that their stacks can be equal
    made = {}
    for number, (name, (launcher, env)) in enumerate(LAUNCHERS.items()):
        made[name] = (
            _train(tmp, f"a{number}", launcher, env),
            _train(tmp, f"b{number}", launcher, {**env, "BIGNET_BN_EPS": "0.01"}),
            tmp / f"out{number}",
        )
    return made


def test_stack_json_holds_no_frame_of_the_tool(runs):
    for launcher, (a, b, _) in runs.items():
        for rank in (a, b):
            stacks = _stacks(rank)
            assert "Functional.batch_norm.0.forward" in stacks and "Tensor.__add__.0.forward" in stacks
            for name, frames in stacks.items():
                files = [_file(frame) for frame in frames]
                # before: run_command.py, cli.py, __main__.py, bin/msprobe-rewrite and runpy's frames outside
                # the program under ``run``
                assert not [f for f in files if f.startswith(TOOL_DIRS) or f == str(CONSOLE_SCRIPT) or "runpy" in f], (
                    launcher,
                    name,
                    frames,
                )
                # the program's outermost frame is its own, as under ``python driver.py``
                assert os.path.basename(files[-1]) == "driver.py", (launcher, name, frames)
                assert frames[-1].split(", ")[2] == "in <module>", (launcher, name, frames)


def test_stack_json_is_the_same_under_run_and_the_hook_with_either_capture(runs):
    # python names a script by its absolute path (3.9+); ``run`` named it as given on the command line
    stacks = {launcher: (a / "stack.json").read_text() for launcher, (a, _, _) in runs.items()}
    assert len(set(stacks.values())) == 1, stacks
    assert all(
        _file(frames[-1]) == str(a.parents[2] / "driver.py")
        for launcher, (a, _, _) in runs.items()
        for frames in _stacks(a).values()
    )


def test_a_call_seen_by_the_observing_mode_starts_where_it_was_called(runs):
    # msprobe-shaped: torch's own frame that made the call is the first, not torch's __torch_function__
    # dispatch (overrides.py's handle_torch_function, then functional.py's batch_norm) that reached the mode
    for launcher, (a, _, _) in runs.items():
        frames = _stacks(a)["Functional.batch_norm.0.forward"]
        assert _file(frames[0]).endswith(os.path.join("torch", "nn", "modules", "batchnorm.py")), frames
        assert _file(frames[1]) == str(BIGNET / "bignet.py") and ", line 31, " in frames[1], frames


def test_compare_names_the_users_line_as_the_call_site(runs):
    bignet = str(BIGNET / "bignet.py")
    for launcher, (a, b, out) in runs.items():
        printed, sites = _compare(out, a, b)
        # before: "at .../torch/nn/modules/batchnorm.py:210" for the divergence whose user line is bignet.py:31
        assert "first divergence: Functional.batch_norm.0.forward" in printed, printed
        assert f"at {bignet}:31\n" in printed and "batchnorm.py" not in printed, (launcher, printed)
        assert sites["Functional.batch_norm.0.forward"] == f"{bignet}:31", launcher  # seen by the observing mode
        assert sites["Functional.linear.0.forward"] == f"{bignet}:29", launcher  # in nn.Linear, not rewritten
        assert sites["Tensor.__add__.0.forward"] == f"{bignet}:33", launcher  # recorded by the rewrite
