"""A device tensor's record as the native lane makes it, ``(dtype, shape, requires_grad, 0-d, (DEVICE_ROW, key,
tensor))``: plain data, made into msprobe's record by the writing process from the numbers of the arena it names,
which the step's message brings (``records.device_numbers``, ``json_files.native_json``). The numbers come as the
bytes of the copy that brought them to the host (``statistics.Batch.doubles``): no float object is made for them in
the training process."""

import json
import struct
import subprocess
import sys

import pytest

from msprobe_runtime import json_files

torch = pytest.importorskip("torch")

from msprobe_runtime import statistics  # noqa: E402

ROW = json_files.DEVICE_ROW


def arena_numbers(rows, counts=None, missing=()):
    """An arena's numbers as ``_Arena.packed`` gives them: each tensor's Max, Min, Mean, Norm, then the counts."""
    values = struct.pack(f"={4 * len(rows)}d", *[v for row in rows for v in row])
    packed_counts = struct.pack(f"={2 * len(counts)}d", *[c for pair in counts for c in pair]) if counts else b""
    return values, packed_counts, frozenset(missing)


NUMBERS = {
    7: arena_numbers(
        [(3.0, -1.0, 0.5, 2.0), (9.0, 1.0, 4.0, 12.0), (2.5, 2.5, 2.5, 2.5)], [(0, 1), (2, 0), (0, 0)], missing={1}
    ),
    8: arena_numbers([(1.0, 0.0, 0.25, 1.0)]),
}


def test_a_device_record_is_its_tensors_numbers_in_the_arena_it_names():
    made = json_files.native_json(("torch.bfloat16", (2, 3), True, False, (ROW, 7, 0)), NUMBERS)
    assert made == {
        "type": "torch.Tensor",
        "dtype": "torch.bfloat16",
        "shape": [2, 3],
        "Max": 3.0,
        "Min": -1.0,
        "Mean": 0.5,
        "Norm": 2.0,
        "requires_grad": True,
        "NaN_count": 0,
        "Inf_count": 1,
    }
    assert type(made["NaN_count"]) is int
    scalar = json_files.native_json(("torch.float32", (), False, True, (ROW, 7, 2)), NUMBERS)
    assert [scalar[k] for k in ("Max", "Min", "Mean", "Norm")] == [2.5] * 4  # a 0-d tensor: its value, four times
    uncounted = json_files.native_json(("torch.float16", (4,), False, False, (ROW, 8, 0)), NUMBERS)
    assert uncounted["Mean"] == 0.25 and "NaN_count" not in uncounted  # counts off: no count fields


@pytest.mark.parametrize(
    "row",
    [(ROW, 7, 1), (ROW, 9, 0), (ROW, 8, 0, None)],
    ids=["a tensor whose launch failed", "an arena whose numbers never came", "no numbers at all"],
)
def test_numbers_that_never_came_are_null_and_the_record_kept(row):
    numbers = None if len(row) == 4 else NUMBERS
    made = json_files.native_json(("torch.float32", (5,), False, False, row), numbers)
    assert made["shape"] == [5] and made["dtype"] == "torch.float32"
    assert [made[k] for k in ("Max", "Min", "Mean", "Norm")] == [None] * 4 and "NaN_count" not in made


def test_a_fingerprint_follows_the_statistics():
    """summary_mode fingerprint: the row names the fingerprints' arena and the tensor's place there too; the field
    comes after the statistics, as a Python record's does. A tensor whose launch failed has the torch ops' parts
    (``replaced``), one never read (its input changed by its call) none."""
    parts = [(0x1234, 0x5678, 0x9ABC, 0xDEF0), (1, 2, 3, 4)]
    hashes = arena_numbers(parts)[0], b"", frozenset({1, 2}), {1: (0, 0, 0, 7)}
    numbers = {**NUMBERS, 11: hashes}
    made = json_files.native_json(("torch.float32", (3,), False, False, (ROW, 7, 0, 11, 0)), numbers)
    assert list(made)[-1] == "fingerprint" and made["Max"] == 3.0
    assert made["fingerprint"] == "123456789abcdef0"
    replaced = json_files.native_json(("torch.float32", (3,), False, False, (ROW, 7, 0, 11, 1)), numbers)
    assert replaced["fingerprint"] == "0000000000000007"
    for row in ((ROW, 7, 0, 11, 2), (ROW, 7, 0, 12, 0)):  # never read; an arena whose parts never came
        assert json_files.native_json(("torch.float32", (3,), False, False, row), numbers)["fingerprint"] is None
    only_replaced = {11: (b"", b"", frozenset({0}), {0: (0, 1, 0, 1)})}  # every launch of the arena failed
    made = json_files.native_json(("torch.float32", (3,), False, False, (ROW, 7, 0, 11, 0)), only_replaced)
    assert made["fingerprint"] == "0000000100000001" and made["Max"] is None


def test_a_row_of_numbers_is_never_taken_for_a_device_row():
    """An integer tensor's row is a tuple of numbers: the mark is a str, which no such row holds."""
    made = json_files.native_json(("torch.int64", (2,), False, False, (5, 1, 3.0, 4.0)), NUMBERS)
    assert (made["Max"], made["Min"], made["Mean"]) == (5, 1, 3.0)


def test_the_writing_process_makes_device_records_from_the_numbers_it_is_sent(tmp_path):
    """The child itself (``python -I -S json_files.py``, the standard library only), sent a step as the writer sends
    it: marshalled, the arenas' numbers third."""
    dump = {"data": {"Torch.exp.0.forward": {"input_args": [("torch.float32", (3,), False, False, (ROW, 7, 0))]}}}
    message = json_files.encode((str(tmp_path / "step0"), [("dump.json", dump)], NUMBERS))
    done = subprocess.run(
        [sys.executable, "-I", "-S", json_files.__file__], input=message, capture_output=True, timeout=60, check=True
    )
    assert json_files.decode(done.stdout) == (0, "")
    written = json.loads((tmp_path / "step0" / "dump.json").read_text())
    record = written["data"]["Torch.exp.0.forward"]["input_args"][0]
    assert (record["Max"], record["Min"], record["Inf_count"]) == (3.0, -1.0, 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_copys_doubles_are_its_bytes_and_its_values_the_same_numbers(dtype):
    """``Batch.doubles``: a float64 copy's own bytes (no number made), another packed from its numbers (an MPS
    device's float32 copy); ``values`` gives the same numbers either way, read before or after."""
    host = torch.tensor([1.5, -2.0, float("nan"), float("inf"), 1e300 if dtype is torch.float64 else 3.0], dtype=dtype)
    expected = [float(v) for v in host.tolist()]
    for first in ("doubles", "values"):
        batch = statistics.Batch(host, None)
        slot = statistics.Slot(None, 3)
        slot.batch, slot.offset = batch, 2
        if first == "values":
            assert _same(batch.values(), expected)
        raw = slot.doubles()
        assert _same(list(struct.unpack("=3d", raw)), expected[2:])
        assert _same(slot.values(), expected[2:]) and _same(batch.values(), expected)
    assert statistics.Slot(None, 3).doubles() is None  # never flushed


def _same(numbers, expected):
    return len(numbers) == len(expected) and all(a == b or a != a and b != b for a, b in zip(numbers, expected))
