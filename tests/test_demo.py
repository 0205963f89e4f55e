"""The README's demo command runs end to end and reports a bit-identical run and a real dump."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the demo trains in a fresh interpreter

ROOT = Path(__file__).resolve().parents[1]


def test_demo_rewrites_trains_and_summarises_the_dump(tmp_path):
    out = tmp_path / "demo out"
    result = subprocess.run([sys.executable, "-m", "fixtures.demo", "--out", str(out), "--steps", "2"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bit-identical with collection on: yes" in result.stdout
    assert f"The dump is in {out / 'dump'}" in result.stdout
    dumps = sorted((out / "dump").glob("step*/*/dump.json"))
    assert len(dumps) == 2
    data = json.loads(dumps[0].read_text())["data"]
    assert "Functional.linear.0.forward" in data and "Module.net1.ln1.Linear.backward.0" in data
    assert "__msprobe__" in (out / "bignet" / "bignet.py").read_text()
