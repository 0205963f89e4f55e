"""A dump.json that lacks a member msprobe always writes is a malformed dump, for compare and for the pre-check
alike (one reader, msprobe_rewrite/compare/dump_format.py): exit status 2, the file and the member named on
stderr. Before, a dump without ``data`` or a tensor record without ``type`` agreed with anything, and the
pre-check replayed a dump without ``task`` as if nothing were missing."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from msprobe_rewrite.compare.errors import CompareError

from .conftest import MSPROBE_DUMP, ROOT, run_compare

MSPROBE_TENSOR_DUMP = os.path.join(ROOT, "fixtures", "msprobe_dump", "tensor_dump")
HEADER = ["task", "level", "dump_data_dir", "data"]
RECORD = ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm"]
ENTRY = "Torch.tanh.0.forward"  # the record edited is its output's


def _tensor_records(value):
    if isinstance(value, list):
        for item in value:
            yield from _tensor_records(item)
    elif isinstance(value, dict):
        if value.get("type") == "torch.Tensor":
            yield value
        elif "type" not in value:
            for item in value.values():
                yield from _tensor_records(item)


def malformed_copy(source, target, member):
    """A copy of the dump ``source`` whose dump.json lacks ``member``: at the top level for a header member,
    else in one tensor record. ``md5`` is first written in every tensor record (a summary_mode md5 dump), then
    taken from one. Returns the path of the edited dump.json."""
    shutil.copytree(source, target)
    [path] = glob.glob(os.path.join(str(target), "step0", "*", "dump.json"))
    with open(path) as handle:
        document = json.load(handle)
    if member in HEADER:
        del document[member]
    else:
        if member == "md5":
            for number, record in enumerate(_tensor_records(document["data"])):
                record["md5"] = f"{number:08x}"
        del document["data"][ENTRY]["output"][0][member]
    with open(path, "w") as handle:
        json.dump(document, handle, indent=1)
    return path


@pytest.mark.parametrize(
    "source, member",
    [(MSPROBE_DUMP, member) for member in HEADER + RECORD + ["md5"]] + [(MSPROBE_TENSOR_DUMP, "data_name")],
)
def test_compare_names_the_file_and_the_missing_member(tmp_path, source, member):
    path = malformed_copy(source, tmp_path / "malformed", member)
    code, out, err = run_compare(tmp_path / "malformed", source)
    assert code == 2, out + err
    assert path in err and f"'{member}'" in err and "malformed dump.json" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("member", HEADER + RECORD + ["md5", "data_name"])
def test_precheck_names_the_file_and_the_missing_member(tmp_path, member):
    path = malformed_copy(MSPROBE_TENSOR_DUMP, tmp_path / "malformed", member)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "msprobe_rewrite",
            "precheck",
            str(tmp_path / "malformed"),
            "-o",
            str(tmp_path / "out"),
            "-j",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert path in done.stderr and f"'{member}'" in done.stderr and "malformed dump.json" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def _check(task, *entries):
    from msprobe_rewrite.compare.dump_format import EntryChecker

    checker = EntryChecker("dump.json", task)
    for name, entry in entries:
        checker.check(name, entry)


def test_the_record_forms_msprobe_writes_are_accepted():
    """What msprobe or our runtime writes without a member the rules above require, each read as it is:
    summary_mode xor's md5 in place of the statistics, a meta tensor's null statistics and no file with task
    tensor, ``{}`` for a type msprobe does not support, an IntEnum whose class name holds "Tensor", and our
    module backward gradients, saved with no file."""
    xor = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "requires_grad": False, "md5": "0a1b2c3d"}
    _check("statistics", ("Torch.relu.0.forward", {"input_args": [xor, {}], "input_kwargs": {}, "output": [xor]}))
    meta = {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": [2],
        "Max": None,
        "Min": None,
        "Mean": None,
        "Norm": None,
        "requires_grad": False,
    }
    enum = {"type": "TensorParallelMode", "value": 1}
    _check(
        "tensor",
        ("Torch.relu.0.forward", {"input_args": [meta, enum], "input_kwargs": {"mode": enum}, "output": [meta]}),
    )
    _check("tensor", ("Module.fc1.Linear.backward.0", {"input": [dict(meta, Max=1.0)], "output": [None]}))
    with pytest.raises(CompareError, match="'data_name'"):
        _check("tensor", ("Torch.relu.0.forward", {"input_args": [dict(meta, Max=1.0)]}))
