"""Bit-exact mode: dumps with summary_mode md5 (msprobe's CRC32) or fingerprint (ours, on the device), and
``compare --bit-exact`` naming the first operator whose inputs are bit-identical and whose outputs are not.

The culprit is a change of one part in a million at one API of fixtures/compare_models/train.py: far under
the statistics compare's float32 threshold on the culprit's own output, but not the same bits.
"""

import json
import os

import pytest

from msprobe_rewrite.compare import compare_runs
from msprobe_rewrite.compare.bit_exact import compare_runs_bit_exact

from .conftest import fixture_line, run_compare

pytestmark = pytest.mark.slow  # over 2 s a test: each test dumps two runs in subprocesses

TINY = "1.000001"  # a relative change far below every statistics threshold


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    out = {}
    for mode in ("md5", "fingerprint", "statistics"):
        path = root / f"{mode}.json"
        path.write_text(json.dumps({"task": "statistics", "level": "mix", "statistics": {"summary_mode": mode}}))
        out[mode] = str(path)
    return out


def load(dump):
    [path] = [os.path.join(d, "dump.json") for d in (dump / "step0").iterdir()]
    with open(path) as handle:
        return json.load(handle)["data"]


def tensors(value):
    if isinstance(value, dict):
        if "dtype" in value and "shape" in value:
            yield value
        else:
            for item in value.values():
                yield from tensors(item)
    elif isinstance(value, list):
        for item in value:
            yield from tensors(item)


@pytest.mark.parametrize("mode,width", [("md5", 8), ("fingerprint", 16)])
def test_every_tensor_carries_its_checksum_beside_the_statistics(make_dump, configs, mode, width):
    data = load(make_dump("--config", configs[mode]))
    records = [t for entry in data.values() for t in tensors(entry)]
    assert len(records) > 20
    for record in records:
        assert isinstance(record[mode], str) and len(record[mode]) == width, record
        int(record[mode], 16)
        assert "Max" in record  # msprobe's md5 mode keeps the statistics too
    # the same tensor recorded twice (an API's output, the next call's input) has one checksum, and tensors
    # with different statistics never share one (a transposed copy has the same statistics, other bits)
    values_of = {}
    for record in records:
        values = (record["dtype"], str(record["shape"]), record["Max"], record["Min"], record["Mean"], record["Norm"])
        assert values_of.setdefault(record[mode], values) == values
    assert len(values_of) > 20 and len(values_of) < len(records)


@pytest.mark.parametrize("mode", ["md5", "fingerprint"])
def test_identical_runs_are_bit_identical(make_dump, configs, mode):
    summary = compare_runs_bit_exact(
        str(make_dump("--config", configs[mode])), str(make_dump("--config", configs[mode], "--steps", "1"))
    )
    assert summary["first_difference"] is None and summary["culprit"] is None
    assert summary["pairs"][0]["tensors_compared"] > 20 and summary["pairs"][0]["tensors_differ"] == 0


@pytest.mark.slow  # twelve more training runs in fresh interpreters
@pytest.mark.parametrize("threads", [1, 2, 16])
@pytest.mark.parametrize("mode", ["md5", "fingerprint"])
def test_identical_runs_are_bit_identical_on_any_thread_count_and_under_load(make_dump, configs, mode, threads):
    """The same program at each thread count, alone and beside a thread that allocates and writes all along:
    the same bits and the same entries. On 16 cores with torch 2.11 two identical md5 runs once differed at a
    module's backward, where the Python graph walk told nodes apart by the ids of objects it had let go
    (tests/runtime/test_graph_walk.py); the timing and the heap that another thread moves are what changed."""
    quiet = load(make_dump("--config", configs[mode], "--threads", str(threads)))
    busy = load(make_dump("--config", configs[mode], "--threads", str(threads), "--load"))
    assert list(quiet) == list(busy)
    for block in ("block1", "block2"):  # the gradients of their inputs: the consumers the graph walk finds
        for name in (f"Module.{block}.fc.Linear.backward.0", f"Module.{block}.Block.backward.0"):
            assert quiet[name]["output"] and all(record[mode] for record in tensors(quiet[name]["output"]))
    differ = [name for name in quiet if list(tensors(quiet[name])) != list(tensors(busy[name]))]
    assert differ == []


@pytest.mark.parametrize("mode", ["md5", "fingerprint"])
def test_the_first_operator_with_equal_inputs_and_different_outputs_is_named(make_dump, configs, mode, tmp_path):
    culprit_run = make_dump("--config", configs[mode], "--scale-api", "Torch.tanh", "--factor", TINY)
    clean_run = make_dump("--config", configs[mode])
    code, stdout, stderr = run_compare("--bit-exact", culprit_run, clean_run, "-o", tmp_path / "out")
    assert code == 1, stdout + stderr
    summary = json.loads((tmp_path / "out" / "compare_summary.json").read_text())
    culprit = summary["culprit"]
    assert culprit["entry"] == "Torch.tanh.0.forward"
    assert culprit["call_site"].endswith(f"train.py:{fixture_line('h = torch.tanh(self.inp(x))')}")
    assert [item["role"] for item in culprit["differing"]] == ["output"]
    assert summary["first_difference"]["entry"] == "Torch.tanh.0.forward"
    assert "Torch.tanh.0.forward" in stdout and "bit-identical inputs" in stdout
    [table] = (tmp_path / "out").glob("compare_result_step0_*.csv")  # rank0, or proc<pid> without a rank
    rows = table.read_text().splitlines()
    assert any(row.startswith("Torch.tanh.0.forward,") and row.endswith(",differs") for row in rows), rows[:5]


@pytest.mark.slow  # two more training runs in fresh interpreters
def test_statistics_dumps_are_refused_with_what_to_do(make_dump, configs):
    code, stdout, stderr = run_compare("--bit-exact", make_dump(), make_dump("--config", configs["statistics"]))
    assert code == 2
    assert "summary_mode" in stderr and "md5" in stderr and "Traceback" not in stderr


def test_md5_and_fingerprint_dumps_do_not_mix(make_dump, configs):
    code, _, stderr = run_compare(
        "--bit-exact", make_dump("--config", configs["md5"]), make_dump("--config", configs["fingerprint"])
    )
    assert code == 2 and "different checksums" in stderr


def test_a_changed_md5_is_a_divergence_for_the_statistics_compare_too(make_dump, configs, tmp_path):
    """msprobe's compare flags an md5 that differs; ours must not report "first divergence: none"."""
    import shutil

    original = make_dump("--config", configs["md5"])
    edited = tmp_path / "edited"
    shutil.copytree(original, edited)
    [path] = [d / "dump.json" for d in (edited / "step0").iterdir()]
    document = json.loads(path.read_text())
    record = document["data"]["Torch.tanh.0.forward"]["output"][0]
    record["md5"] = "deadbeef"
    path.write_text(json.dumps(document))
    summary = compare_runs(str(edited), str(original))
    assert summary["first_divergence"]["entry"] == "Torch.tanh.0.forward"
    assert compare_runs_bit_exact(str(edited), str(original))["culprit"]["entry"] == "Torch.tanh.0.forward"
