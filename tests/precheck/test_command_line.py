"""The pre-check as a new user first types it: without -o (optional, as compare's), and its --help."""

import os
import shutil
import subprocess
import sys

import pytest

from .conftest import MSPROBE_TENSOR_DUMP, _env

pytestmark = pytest.mark.slow  # spawns the command


def _precheck(*args, cwd):
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "precheck", *map(str, args)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=cwd,
        timeout=600,
    )
    return done.returncode, done.stdout, done.stderr


def test_precheck_without_out_prints_the_verdicts_and_writes_nothing(tmp_path):
    """`precheck DUMP` used to stop at "the following arguments are required: -o/--out" where `compare A B`
    runs: it grades the dump, names the failing API on the terminal, and writes no file."""
    import torch

    dump = tmp_path / "dump"
    shutil.copytree(MSPROBE_TENSOR_DUMP, dump)
    (rank,) = (dump / "step0").iterdir()
    output = rank / "dump_tensor_data" / "Functional.gelu.0.forward.output.0.pt"
    torch.save(torch.load(output) * 1.25, output)  # the device's gelu made imprecise
    work = tmp_path / "cwd"
    work.mkdir()
    code, out, err = _precheck(dump, "-j", "1", cwd=work)
    assert code == 1, err
    assert "error   Functional.gelu.0 (" in err
    assert "no report files (-o DIR writes them)" in err
    assert os.listdir(work) == []


def test_reports_point_at_criteria_a_pip_user_has(tmp_path):
    """The summary and the HTML said "criteria: docs/precheck.md", a file only a checkout has. They name a
    command instead, and that command, run as written, prints the criteria."""
    import json
    import shlex

    code, out, err = _precheck(MSPROBE_TENSOR_DUMP, "-o", tmp_path / "report", "-j", "1", cwd=tmp_path)
    assert code == 0, err
    hint = json.loads((tmp_path / "report" / "precheck_summary.json").read_text())["criteria"]
    page = (tmp_path / "report" / "precheck_report.html").read_text()
    assert f"criteria: <code>{hint}</code>" in page and "docs/" not in page and "docs/" not in hint
    program, *arguments = shlex.split(hint)
    assert program == "msprobe-rewrite"
    shown = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", *arguments],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "Criteria:" in text and "docs/" not in text
    for standard in ("exact:", "binary consistency:", "ULP:", "absolute threshold:", "benchmark:"):
        assert standard in text
    assert "warning / error above max_rel_err 5 / 10, the others 1.5 / 2" in text
