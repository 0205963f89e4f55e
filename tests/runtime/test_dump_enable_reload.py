"""dump_enable hot reload: a running job re-reads config.json between steps, so collection is switched on
(and off again) by editing the file, as msprobe does. The file is edited by this test while the job runs."""

import glob
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # a training job in a subprocess, edited from here while it runs

JOB = textwrap.dedent("""
    import os, sys, time
    import torch
    from msprobe_runtime import PrecisionDebugger

    config, sync = sys.argv[1], sys.argv[2]
    debugger = PrecisionDebugger(config_path=config)
    model = torch.nn.Linear(4, 2)
    for step in range(6):
        if step in (2, 4):  # let the test edit the file now, as an operator would when a spike appears
            open(os.path.join(sync, f"at{step}"), "w").close()
            while not os.path.exists(os.path.join(sync, f"go{step}")):
                time.sleep(0.02)
        debugger.start(model)
        loss = torch.relu(model(torch.randn(3, 4))).sum()
        debugger.save(loss, "loss")
        loss.backward()
        debugger.stop()
        debugger.step()
    debugger.wait()
""")


def _write_config(path, dump_path, enabled):
    with open(path, "w") as handle:
        json.dump({"task": "statistics", "level": "L1", "dump_path": dump_path, "dump_enable": enabled}, handle)


def _wait_for(path, job):
    deadline = time.monotonic() + 300
    while not os.path.exists(path):
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline, "the job never reached the step"
        time.sleep(0.02)


def test_collection_switched_on_and_off_by_editing_the_config(tmp_path, root):
    config, sync, dump = tmp_path / "config.json", tmp_path / "sync", tmp_path / "dump"
    sync.mkdir()
    _write_config(config, str(dump), False)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    job = subprocess.Popen(
        [sys.executable, str(script), str(config), str(sync)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(sync / "at2", job)
        assert not dump.exists() or not glob.glob(str(dump / "step*"))  # steps 0 and 1: off
        _write_config(config, str(dump), True)
        (sync / "go2").touch()
        _wait_for(sync / "at4", job)
        _write_config(config, str(dump), False)
        (sync / "go4").touch()
        out, err = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err
    assert "dump_enable is now True" in err and "dump_enable is now False" in err
    steps = sorted(os.path.basename(p) for p in glob.glob(str(dump / "step*")))
    assert steps == ["step2", "step3"]
    for step in steps:
        [folder] = glob.glob(str(dump / step / "*"))
        with open(os.path.join(folder, "dump.json")) as handle:
            assert "Functional.linear.0.forward" in json.load(handle)["data"]
        assert os.path.exists(os.path.join(folder, "debug.json"))
