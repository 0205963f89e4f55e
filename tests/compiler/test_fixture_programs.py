"""Whole programs from fixtures/ run identically before and after rewriting (each in a fresh process)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from msprobe_rewrite.api import rewrite_source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def run_program(path: Path) -> str:
    result = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=path.parent,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def rewritten_copy(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / source.name
    target.write_bytes(rewrite_source(source.read_bytes(), path=str(source)))
    return target


@pytest.mark.parametrize(
    "program, expected_calls",
    [
        (
            "direct_imports/train.py",
            [
                '__msprobe__.call("Torch.relu", relu, h)',
                '__msprobe__.call("Torch.tanh", hyperbolic, h)',
                '__msprobe__.call("Functional.linear", linear, x, self.weight, self.bias)',
                "h = __msprobe__.iadd(h, x)",
            ],
        ),
        pytest.param(
            "distributed_ops/program.py",
            [
                '__msprobe__.call("Distributed.all_reduce", dist.all_reduce, t)',
                '__msprobe__.call("Distributed.all_reduce", all_reduce, t, op=dist.ReduceOp.SUM)',
                "__msprobe__.dyn(dist.P2POp, dist.isend, t, 0)",
            ],
            marks=pytest.mark.slow,
        ),  # a gloo process group, twice
        (
            "identity_checks/program.py",
            ["__msprobe__.eq(self.config.activation_func, F.gelu)", "__msprobe__.dyn(self.config.activation_func, x)"],
        ),
    ],
)
@pytest.mark.slow  # over 2 s: `make check` leaves it to `make test`
def test_program_output_is_bit_identical_after_rewriting(program, expected_calls, tmp_path):
    original = FIXTURES / program
    instrumented = rewritten_copy(original, tmp_path)
    text = instrumented.read_text()
    for call in expected_calls:
        assert call in text
    before, after = run_program(original), run_program(instrumented)
    assert before.strip(), "the program printed nothing to compare"
    assert after == before


def test_identity_checks_all_hold_after_rewriting(tmp_path):
    output = run_program(rewritten_copy(FIXTURES / "identity_checks/program.py", tmp_path))
    assert "fused gelu" in output
    assert "eq True True True" in output
    assert "in True False" in output
    assert "dict bias_gelu bias_swiglu" in output
    assert "swiglu swiglu" in output
