"""How deep a program can nest with collection on: a level of nested modules costs at most one frame more than
in the plain program (which it was: three more, so a chain of modules that ran plain hit RecursionError
collected). Measured as the frames a level takes (the recursion limit raised by 2000 over the levels gained),
for the program left alone and the same program rewritten, collected at each level; in fresh interpreters."""

import json
import os
import subprocess
import sys

import pytest

from .conftest import ROOT, rewrite_file

pytest.importorskip("torch")

PROGRAM = """
import json, sys, torch
from msprobe_runtime import PrecisionDebugger


class Level(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        if self.inner is None:
            return torch.relu(x)
        return self.inner(x)


def chain(n):
    module = None
    for _ in range(n):
        module = Level(module)
    return module


def deepest(run):
    low, high = 1, 4000
    while low < high:
        middle = (low + high + 1) // 2
        try:
            run(chain(middle))
            low = middle
        except RecursionError:
            high = middle - 1
    return low


def frames_a_level(run):
    sys.setrecursionlimit(1000)
    shallow = deepest(run)
    sys.setrecursionlimit(3000)
    deep = deepest(run)
    sys.setrecursionlimit(1000)
    return 2000 / (deep - shallow)


x = torch.ones(2)
out = {"off": frames_a_level(lambda module: module(x))}
for level in ("L0", "L1", "mix"):
    debugger = PrecisionDebugger(dump_path=sys.argv[1] + "/" + level, level=level)

    def collected(module):
        debugger.start(module)
        try:
            module(x)
        finally:
            debugger.stop()
            debugger.step()

    out[level] = frames_a_level(collected)
print(json.dumps(out))
"""


def _frames(tmp_path, rewritten):
    plain = tmp_path / "plain_nesting.py"
    plain.write_text(PROGRAM)
    script = rewrite_file(str(plain), tmp_path, "nesting.py") if rewritten else str(plain)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, script, str(tmp_path / ("rewritten" if rewritten else "plain"))],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # over 2 s: `make check` leaves it to `make test`
def test_collected_nesting_costs_at_most_one_frame_a_level_more_than_plain(tmp_path):
    plain = _frames(tmp_path, rewritten=False)["off"]
    rewritten = _frames(tmp_path, rewritten=True)
    for level in ("L0", "L1", "mix"):
        assert rewritten[level] <= plain + 1.05, (level, rewritten, plain)
    assert rewritten["off"] <= plain + 1.05, (rewritten, plain)  # the entry's own frame, collecting or not
