"""The pre-check as a new user first types it: without -o (optional, as compare's), and its --help."""
import os
import shutil
import subprocess
import sys

import pytest

from .conftest import MSPROBE_TENSOR_DUMP, _env

pytestmark = pytest.mark.slow  # spawns the command


def _precheck(*args, cwd):
    done = subprocess.run([sys.executable, "-m", "msprobe_rewrite", "precheck", *map(str, args)],
                          capture_output=True, text=True, env=_env(), cwd=cwd, timeout=600)
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
