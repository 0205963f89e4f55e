"""``msprobe-rewrite nan DUMP``: where NaN/Inf started, from one run's dump, in a fresh interpreter.

Real dumps: fixtures/compare_models (one process, a NaN injected at Functional.gelu) and fixtures/nan_ranks
(two gloo ranks; a rank's torch.log makes NaN and an all_reduce hands it to the other rank). Hand-made
dumps for the cross-rank order and for bad input. Exit status: 0 none, 1 found, 2 bad input.
"""

import json
import os
import subprocess
import sys

import pytest

from .conftest import ROOT, fixture_line

GELU_LINE = "h = F.gelu(self.fc(x))"
NAN_RANKS = os.path.join(ROOT, "fixtures", "nan_ranks")


def run_nan(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "nan", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.slow  # training runs in fresh interpreters
def test_one_process_names_the_op_step_and_line_that_made_it(make_dump):
    dump = make_dump("--nan-at", "Functional.gelu", "--steps", "2")
    code, out, err = run_nan(dump)
    assert code == 1, out + err
    lines = out.splitlines()
    assert lines[0].startswith("NaN/Inf starts at Functional.gelu.0.forward (step 0, proc"), out
    assert lines[1].endswith(f"train.py:{fixture_line(GELU_LINE)}")
    assert "made here: its inputs are finite, its output is not" in out
    assert "non-finite outputs: output.0 (Max=nan" in out
    code, out, err = run_nan(dump, "--json")
    assert code == 1, out + err
    result = json.loads(out)
    origin = result["origin"]
    assert (origin["entry"], origin["step"], origin["how"]) == ("Functional.gelu.0.forward", 0, "made")
    assert origin["nonfinite_inputs"] == [] and origin["nonfinite_outputs"][0]["NaN_count"] == 1
    # step 1 starts from the NaN weights the optimizer wrote: received, and later than step 0
    [step1] = [d for d in result["dumps"] if d["step"] == 1]
    assert step1["onset"]["how"] == "received"


@pytest.mark.slow
def test_a_clean_dump_exits_0(make_dump):
    code, out, err = run_nan(make_dump())
    assert code == 0, out + err
    assert out.startswith("no NaN/Inf: 1 dump(s), ")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """step 0: rank 1 makes NaN, rank 0 receives it through the all_reduce; step 1: the other way round."""
    from msprobe_rewrite.api import rewrite_source

    root = tmp_path_factory.mktemp("nan_ranks")
    (root / "model").mkdir()
    with open(os.path.join(NAN_RANKS, "model.py"), "rb") as handle:
        (root / "model" / "model.py").write_bytes(rewrite_source(handle.read(), path="model.py"))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(NAN_RANKS, "driver.py"),
            str(root / "init"),
            str(root / "dump"),
            str(root / "model"),
            "--steps",
            "2",
            "--poison",
            "1:0",
            "--poison",
            "0:1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "dump"


@pytest.mark.slow  # two gloo ranks in fresh interpreters
def test_two_ranks_name_the_rank_that_made_it_before_the_collective_spread_it(two_ranks):
    with open(os.path.join(NAN_RANKS, "model.py")) as handle:
        line = next(n for n, text in enumerate(handle, 1) if "torch.log(y - 100.0)" in text)
    code, out, err = run_nan(two_ranks)
    assert code == 1, out + err
    lines = out.splitlines()
    # rank 0 holds NaN in step 0 too, and makes its own in step 1: the earliest step, then the rank that had it
    # before the all_reduce, win over the lower rank number
    assert lines[0] == "NaN/Inf starts at Torch.log.0.forward (step 0, rank 1)"
    assert lines[1].endswith(f"model.py:{line}")
    assert (
        "rank 0 first shows it at Tensor.__mul__.0.forward (already in its inputs, after "
        "Distributed.all_reduce.0.forward)" in out
    )
    result = json.loads(run_nan(two_ranks, "--json")[1])
    onsets = {(d["step"], d["rank"]): (d["onset"]["entry"], d["onset"]["how"]) for d in result["dumps"]}
    assert onsets[(0, 1)] == onsets[(1, 0)] == ("Torch.log.0.forward", "made")
    assert onsets[(0, 0)][1] == onsets[(1, 1)][1] == "received"


def _record(value):
    return {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": [4],
        "Max": value,
        "Min": value,
        "Mean": value,
        "Norm": value,
        "requires_grad": False,
    }


def _entry(inp, out):
    return {"input_args": [_record(inp)], "input_kwargs": {}, "output": [_record(out)]}


def _write(path, data, **header):
    path.mkdir(parents=True)
    dump = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
    dump.update(header)
    (path / "dump.json").write_text(json.dumps(dump))


def test_across_ranks_the_fewest_collectives_before_the_onset_wins(tmp_path):
    # rank 0 makes NaN after two all_reduces, rank 1 after one: rank 1 had it first, whatever the file order
    collective = _entry(1.0, 1.0)
    _write(
        tmp_path / "run" / "step0" / "rank0",
        {
            "Distributed.all_reduce.0.forward": collective,
            "Distributed.all_reduce.1.forward": collective,
            "Torch.exp.0.forward": _entry(1.0, "inf"),
        },
    )
    _write(
        tmp_path / "run" / "step0" / "rank1",
        {
            "Distributed.all_reduce.0.forward": collective,
            "Torch.log.0.forward": _entry(1.0, "nan"),
            "Distributed.all_reduce.1.forward": _entry("nan", "nan"),
        },
    )
    code, out, err = run_nan(tmp_path / "run")
    assert code == 1, out + err
    assert out.splitlines()[0] == "NaN/Inf starts at Torch.log.0.forward (step 0, rank 1)"
    assert "1 collective(s) completed on this rank before it" in out


def test_a_malformed_dump_is_exit_2_naming_the_file(tmp_path):
    _write(tmp_path / "bad", {"Torch.log.0.forward": _entry(1.0, "nan")}, level=None)
    text = (tmp_path / "bad" / "dump.json").read_text().replace('"level": null, ', "")
    (tmp_path / "bad" / "dump.json").write_text(text)
    code, out, err = run_nan(tmp_path / "bad")
    assert code == 2 and out == ""
    assert f"{tmp_path / 'bad' / 'dump.json'}: malformed dump.json: no 'level' member" in err
    code, out, err = run_nan(tmp_path / "missing")
    assert code == 2 and "missing: no such file or directory" in err


def test_a_parameter_gradient_is_not_where_nan_was_made(tmp_path):
    # a parameters_grad entry has no inputs: NaN in it came from its module's backward, which had it in its
    # inputs already; compare used to name the gradient as the entry that made it
    from msprobe_rewrite.compare import compare_runs

    for side, bad in (("a", "nan"), ("b", 1.0)):
        _write(
            tmp_path / side,
            {
                "Module.fc.Linear.backward.0": {"input": [_record(bad)], "output": [_record(bad)]},
                "Module.fc.Linear.parameters_grad.0": {"weight": _record(bad)},
            },
            level="L0",
        )
    onset = compare_runs(str(tmp_path / "a"), str(tmp_path / "b"))["pairs"][0]["nan_onset"]["a"]
    assert onset["entry"] == "Module.fc.Linear.backward.0"
    code, out, err = run_nan(tmp_path / "a")
    assert code == 1 and out.startswith("NaN/Inf starts at Module.fc.Linear.backward.0 (a)"), out + err
    assert "already in its inputs" in out
