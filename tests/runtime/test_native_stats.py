"""The fused native statistics op against the torch-op fallback (runtime/native_stats.py, statistics.py).

Max, Min and the NaN/Inf counts must be equal; Mean and Norm equal within the rounding of the tensor's dtype
(the fallback's float32 dot product is itself off by a few float32 ulps on large tensors, the op is not).
Skipped where the op cannot be built (no compiler or ninja), unless MSPROBE_REQUIRE_NATIVE=1.
"""

import enum
import glob
import json
import logging
import math
import os

import pytest

torch = pytest.importorskip("torch")

import msprobe_runtime as rt  # noqa: E402
from msprobe_runtime import PrecisionDebugger, native_stats  # noqa: E402
from msprobe_runtime.statistics import KIND_EMPTY, StatBuffer, slot_values, tensor_kind  # noqa: E402


def both(t, native, counts=True):
    """(native numbers, fallback numbers) of ``t``: [Max, Min, Mean, Norm] (or [value]) + [NaN, Inf]."""
    out = []
    for module in (native, False):
        stats = StatBuffer(nan_inf_count=counts, native=module)
        slot, count_slot = stats.add(t, tensor_kind(t))
        if module is not False and t.dtype in DTYPES:
            assert type(slot) is list, "the native op did not serve this tensor"  # numbers before take
        stats.take()
        out.append(slot_values(slot) + (slot_values(count_slot) if count_slot is not None else []))
    return out


ULP = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def assert_same(mine, theirs, dtype, t=None, ulps=4):
    """Max/Min (and counts) exact, NaN where NaN; Mean/Norm within a few ulps of ``dtype``, of the result or,
    for a Mean that cancels, of the mean of absolute values (a float sum's error is relative to that)."""
    assert len(mine) == len(theirs)
    scale = 0.0
    if t is not None and t.numel():
        magnitudes = t.double().abs()
        scale = magnitudes[magnitudes.isfinite()].mean().item() if magnitudes.isfinite().any() else 0.0
    for index, (a, b) in enumerate(zip(mine, theirs)):
        if math.isnan(b):
            assert math.isnan(a), (index, mine, theirs)
        elif index in (2, 3) and len(mine) != 3 and math.isfinite(b):
            bound = ulps * ULP[dtype] * max(abs(b), scale if index == 2 else 0.0, 1e-30)
            assert abs(a - b) <= bound, (index, mine, theirs)
        else:
            assert a == b, (index, mine, theirs)


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [1, 7, 16, 17, 512, 4096, 4097, 70_000, 3 * 65_536 + 5]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", SIZES)
def test_equal_to_fallback(native, dtype, numel):
    torch.manual_seed(numel)
    t = (torch.randn(numel) * 3 + 0.5).to(dtype)
    mine, theirs = both(t, native)
    assert_same(mine, theirs, dtype, t)
    assert mine[4:] == [0.0, 0.0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_d_and_layouts(native, dtype):
    torch.manual_seed(1)
    base = torch.randn(64, 48).to(dtype)
    cases = {
        "0-d": torch.tensor(-2.5, dtype=dtype),
        "0-d nan": torch.tensor(float("nan"), dtype=dtype),
        "transposed": base.t(),
        "strided": base[::3, 1::2],
        "permuted": torch.randn(4, 5, 6).to(dtype).permute(2, 0, 1),
        "broadcast": torch.randn(1, 48).to(dtype).expand(64, 48),
        "broadcast 0-d": torch.tensor(1.5, dtype=dtype).expand(10, 3),
        "offset view": base.view(-1)[5:1000],
        "negative view": torch._neg_view(base),
        "broadcast transposed": base[:1].t().expand(48, 5),
        "requires grad": torch.randn(33, 7).to(dtype).requires_grad_(),
        "parameter": torch.nn.Parameter(base.clone()),
        "inference transposed": _inference(base).t(),
    }
    for name, t in cases.items():
        mine, theirs = both(t, native)
        assert_same(mine, theirs, dtype, t), name


def _inference(t):
    with torch.inference_mode():
        return t.clone()


def test_in_inference_mode(native):
    t = torch.randn(40, 30)
    with torch.inference_mode():
        mine, theirs = both(t.t(), native)
    assert_same(mine, theirs, torch.float32, t)


def test_tensors_it_cannot_read_go_to_the_torch_ops(native):
    assert native.stats(torch.randn(4, dtype=torch.float64), True) == []
    assert native.stats(torch.arange(4), True) == []
    assert native.stats(torch.empty(0), True) == []
    assert native.stats(torch.empty(3, device="meta"), True) == []
    assert native.stats(torch.eye(3).to_sparse(), True) == []
    assert native.stats(torch._efficientzerotensor(3), True) == []


def test_empty_has_no_slot():
    assert tensor_kind(torch.empty(0, 3)) == KIND_EMPTY
    assert tensor_kind(torch.empty(0, dtype=torch.bfloat16)) == KIND_EMPTY


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf(native, dtype):
    inf, nan = float("inf"), float("nan")
    cases = [
        [1.0, nan, 3.0],
        [nan] * 40,
        [1.0, inf, -2.0],
        [-inf, 1.0, -2.0],
        [inf, -inf, 0.5],
        [nan, inf, -inf, 2.0] * 9,
    ]
    for values in cases:
        t = torch.tensor(values, dtype=dtype)
        mine, theirs = both(t, native)
        assert_same(mine, theirs, dtype, t)
    # a NaN and an Inf deep inside a large tensor, inside a later parallel block
    t = torch.randn(300_000).to(dtype)
    t[200_001] = nan
    t[250_000] = -inf
    t[12] = inf
    mine, theirs = both(t, native)
    assert_same(mine, theirs, dtype, t)
    assert mine[4:] == [1.0, 2.0]


FLOAT32_RANGE_CASES = {
    "a square past float32": ([1e20, 1.0], [torch.float32, torch.bfloat16]),
    "squares below float32": ([1e-30, 1e-30, -1e-30], [torch.float32, torch.bfloat16]),
    "a sum of squares past float32": ([1e18] * 5000, [torch.float32, torch.bfloat16]),
    "a sum past float32": ([3e38, 3e38, 1.0], [torch.float32, torch.bfloat16]),
    "a Norm past float16": ([1000.0] * 10_000, [torch.float16]),
    "blocks each past float32": ([1e17] * 200_000, [torch.float32, torch.bfloat16]),
    "large and tiny together": ([1e19, 1e-30, -3e18, 2e-25] * 3, DTYPES),
}


@pytest.mark.parametrize("case", list(FLOAT32_RANGE_CASES))
def test_the_same_numbers_past_the_range_of_float32(native, case):
    """Mean and Norm where a sum or a square leaves float32's range: the torch ops (the path of CUDA and NPU
    tensors, and msprobe's own numbers) accumulate in float, giving inf past the range and 0 below it; the op,
    whose double sums gave 1e20 where they gave inf, gives the same numbers."""
    values, dtypes = FLOAT32_RANGE_CASES[case]
    for dtype in dtypes:
        t = torch.tensor(values).to(dtype)
        mine, theirs = both(t, native)
        assert_same(mine, theirs, dtype, t)
        assert mine[3] == theirs[3] or math.isfinite(theirs[3]), (dtype, mine, theirs)


def test_without_counts(native):
    t = torch.tensor([1.0, float("nan")])
    mine, theirs = both(t, native, counts=False)
    assert len(mine) == 4 and math.isnan(mine[0]) and math.isnan(theirs[0])


def test_value_at_the_call(native):
    """A tensor changed in place after its call is reported with the value it had at the call."""
    for module in (native, False):
        for numel in (10, 100_000):
            stats = StatBuffer(nan_inf_count=True, native=module)
            t = torch.ones(numel)
            slot, counts = stats.add(t, tensor_kind(t))
            t.mul_(-3).fill_(float("nan"))
            stats.take()
            values = slot_values(slot)
            assert values[:3] == [1.0, 1.0, 1.0]
            # Norm within float32 rounding: torch's float32 sqrt is 1 ulp off on AVX-512 CPUs (sqrt(1e5))
            assert abs(values[3] - math.sqrt(numel)) <= 2**-23 * math.sqrt(numel)
            assert slot_values(counts) == [0.0, 0.0]


def test_mean_stays_accurate_on_large_tensors(native):
    t = torch.full((1 << 22,), 0.1)
    exact = t.double().mean().item()
    values = native.stats(t, False)
    assert values[2] == float(torch.tensor(exact, dtype=torch.float32))
    assert abs(values[3] - t.double().norm().item()) <= 2**-23 * values[3]


def test_independent_of_thread_count(native):
    torch.manual_seed(3)
    t = torch.randn(1 << 20)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.stats(t, True)
        torch.set_num_threads(max(2, threads))
        many = native.stats(t, True)
    finally:
        torch.set_num_threads(threads)
    assert one == many


def test_no_compiler_falls_back_with_one_warning(monkeypatch, tmp_path, caplog):
    def no_compiler(directory):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setenv("MSPROBE_CACHE_DIR", str(tmp_path))  # nothing cached there: a build is tried
    monkeypatch.delenv("MSPROBE_NATIVE_STATS", raising=False)  # (a run with the op turned off tries none)
    monkeypatch.setattr(native_stats, "_build", no_compiler)
    native_stats.reset()
    try:
        with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
            assert native_stats.load() is None
            stats = StatBuffer()
            assert native_stats.load() is None
        warnings = [r for r in caplog.records if "cannot be built" in r.getMessage()]
        assert len(warnings) == 1 and "Ninja is required" in warnings[0].getMessage()
        t = torch.tensor([1.0, -2.0, 4.0])
        slot, counts = stats.add(t, tensor_kind(t))  # the torch ops serve
        stats.take()
        assert slot_values(slot)[:2] == [4.0, -2.0] and slot_values(counts) == [0.0, 0.0]
    finally:
        native_stats.reset()


# as cpp_extension.load reports one (the compiler's line names the file under runtime/native/)
SOURCE_FILE = os.path.join(native_stats.NATIVE_DIR, native_stats.SOURCES[0])
COMPILE_ERROR = (
    f"Error building extension 'msprobe_stats': [1/2] c++ -MMD -c {SOURCE_FILE} -o stats_op.o\n"
    f"FAILED: stats_op.o\n{SOURCE_FILE}:412:66: error: invalid initialization of reference of type "
    "'const c10::intrusive_ptr<Node>&' from expression of type 'const std::shared_ptr<Node>'\n"
    "ninja: build stopped: subcommand failed."
)


def test_a_failed_build_is_remembered_by_the_next_process(monkeypatch, tmp_path, caplog):
    """A build that failed is not tried again by every later process (a minute each, issue 37): its reason is
    kept in its build directory, whose key changes with the source, the flags, the CPU, torch and Python."""
    builds = []

    def failing_build(directory):
        builds.append(directory)
        raise RuntimeError(COMPILE_ERROR)

    monkeypatch.setenv("MSPROBE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MSPROBE_NATIVE_STATS", raising=False)
    monkeypatch.setattr(native_stats, "_build", failing_build)
    try:
        for _process in range(3):
            native_stats.reset()  # as a fresh process: nothing loaded in memory
            with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
                assert native_stats.load() is None
        assert builds == [native_stats.build_directory()]
        warnings = [r.getMessage() for r in caplog.records if "cannot be built" in r.getMessage()]
        assert len(warnings) == 3 and all(f"{SOURCE_FILE}:412:66: error: invalid" in w for w in warnings)
        assert "remembered" not in warnings[0] and all("remembered" in w for w in warnings[1:])
        os.remove(os.path.join(builds[0], native_stats.FAILED))  # as the warning says: delete it to try again
        native_stats.reset()
        assert native_stats.load() is None and len(builds) == 2
    finally:
        native_stats.reset()


def test_a_build_refused_beside_a_loaded_build_is_not_remembered(monkeypatch, tmp_path, caplog):
    """A process that holds a build of the op and builds another (its source edited under it, then a reset) gets
    pybind11's refusal to register the op's types twice. That is the process's failure, not the build's: no note,
    so a later process, which loads one build, builds and uses the op. Where no build was loaded, a failed import
    is the build's (an undefined symbol) and is remembered, as a compile error is."""
    refusal = ImportError('generic_type: type "Recorder" is already registered!')
    builds = []

    def refused_build(directory):
        builds.append(directory)
        raise refusal

    monkeypatch.setenv("MSPROBE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MSPROBE_NATIVE_STATS", raising=False)
    monkeypatch.setattr(native_stats, "_build", refused_build)
    note = os.path.join(native_stats.build_directory(), native_stats.FAILED)
    try:
        monkeypatch.setitem(native_stats._state, "loaded", True)  # as after a load of an earlier build
        native_stats.reset()
        with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
            assert native_stats.load() is None
        assert "already registered" in caplog.text and not os.path.exists(note)
        native_stats.reset()
        assert native_stats.load() is None and len(builds) == 2  # tried again: nothing remembered
        monkeypatch.setitem(native_stats._state, "loaded", False)  # a process that loaded no build
        native_stats.reset()
        assert native_stats.load() is None and len(builds) == 3
        assert "already registered" in open(note).read()
    finally:
        native_stats.reset()


def test_a_link_planted_as_the_failure_note_is_not_followed(monkeypatch, tmp_path):
    monkeypatch.setenv("MSPROBE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MSPROBE_NATIVE_STATS", raising=False)
    monkeypatch.setattr(native_stats, "_build", lambda directory: (_ for _ in ()).throw(RuntimeError(COMPILE_ERROR)))
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours\n")
    directory = native_stats.build_directory()
    os.makedirs(directory)
    os.symlink(outside, os.path.join(directory, native_stats.FAILED))
    native_stats.reset()
    try:
        assert native_stats.load() is None  # the planted note is not read as ours: the build is tried
        assert outside.read_text() == "not ours\n"
        note = os.path.join(directory, native_stats.FAILED)
        assert not os.path.islink(note) and "error: invalid initialization" in open(note).read()
    finally:
        native_stats.reset()


def test_a_compile_error_names_the_source_file_and_line(monkeypatch, tmp_path, caplog):
    """The op is compiled from its files where they lie (cpp_extension.load of runtime/native/), so the warning
    and the failure note name the file and line to fix; load_inline compiled a copy, main.cpp in the build
    folder, whose lines were offset from the Python string's. A file that includes nothing fails in a moment."""
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        pytest.skip("no ninja: torch builds no extension here")
    sources = tmp_path / "native"
    sources.mkdir()
    (sources / "stats_op.cpp").write_text("// a broken copy of the op\n\nint broken = ;\n")
    monkeypatch.setattr(native_stats, "NATIVE_DIR", str(sources))
    monkeypatch.setattr(native_stats, "SOURCES", ("stats_op.cpp",))
    monkeypatch.setenv("MSPROBE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MSPROBE_NATIVE_STATS", raising=False)
    native_stats.reset()
    try:
        with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
            assert native_stats.load() is None
        where = f"{sources / 'stats_op.cpp'}:3:"
        warnings = [r.getMessage() for r in caplog.records if "cannot be built" in r.getMessage()]
        assert len(warnings) == 1 and f"({where}" in warnings[0] and "error:" in warnings[0], warnings
        note = os.path.join(native_stats.build_directory(), native_stats.FAILED)
        assert open(note).read().startswith(where)
    finally:
        native_stats.reset()


def test_an_install_without_the_sources_falls_back_saying_so(monkeypatch, tmp_path, caplog):
    """A non-editable install that lost runtime/native/ (its package data, pyproject.toml) builds nothing and
    notes no failure: the warning names the missing file, and the torch ops serve."""
    monkeypatch.setattr(native_stats, "NATIVE_DIR", str(tmp_path / "native"))
    monkeypatch.setenv("MSPROBE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MSPROBE_NATIVE_STATS", raising=False)
    monkeypatch.setattr(native_stats, "_build", lambda directory: pytest.fail("built without its source"))
    native_stats.reset()
    try:
        with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
            assert native_stats.load() is None
        warnings = [r.getMessage() for r in caplog.records if "cannot be built" in r.getMessage()]
        missing = os.path.join(str(tmp_path / "native"), native_stats.SOURCES[0])
        assert len(warnings) == 1 and f"its source {missing} is missing" in warnings[0], warnings
        assert not (tmp_path / "cache").exists()
    finally:
        native_stats.reset()


def test_turned_off_by_environment(monkeypatch):
    monkeypatch.setenv("MSPROBE_NATIVE_STATS", "0")
    native_stats.reset()
    try:
        assert native_stats.load() is None
    finally:
        native_stats.reset()


def _dump(tmp_path, name, inputs):
    config = tmp_path / f"{name}.json"
    config.write_text(
        json.dumps({"dump_path": str(tmp_path / name), "level": "L1", "statistics": {"nan_inf_count": True}})
    )
    debugger = PrecisionDebugger(config_path=str(config))
    debugger.start()
    for tensor in inputs:
        rt.call("Torch.clone", torch.clone, tensor)
    debugger.stop()
    debugger.wait()
    [directory] = glob.glob(os.path.join(str(tmp_path / name), "step0", "*"))
    with open(os.path.join(directory, "dump.json")) as handle:
        return json.load(handle)["data"]


class _Subclass(torch.Tensor):
    pass


def test_dump_equal_on_every_dtype(native, monkeypatch, tmp_path):
    """Through the debugger: a dump made with the op equals one made with the torch ops, on every dtype."""
    torch.manual_seed(0)
    inputs = [torch.randn(3, 5).to(dtype) for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)]
    inputs += [torch.randint(-5, 5, (7,), dtype=dtype) for dtype in (torch.int8, torch.int32, torch.int64)]
    inputs += [torch.randint(0, 9, (7,), dtype=torch.uint8)]
    inputs += [
        torch.tensor([True, False]),
        torch.empty(0, 3),
        torch.empty(0, dtype=torch.bfloat16),
        torch.tensor(2.5),
        torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.bfloat16),
        torch.randn(5000),
        torch.randn(64, 64).t(),
        torch.randn(8).expand(4, 8),
    ]
    # what the collector's native-first path must hand on to the torch ops, or serve as they would
    inputs += [
        torch.empty(3, 2, device="meta"),
        torch.eye(3).to_sparse(),
        torch.nn.Parameter(torch.randn(6)),
        torch.randn(6, requires_grad=True),
        _inference(torch.randn(5, 2)),
        torch.tensor(-1.5).bfloat16(),
        torch.randn(4).as_subclass(_Subclass),
        torch.randn(6000).half(),
    ]
    # integers and bools read by the op's own loop: broadcast, transposed, strided, at their type's limits
    inputs += [
        torch.arange(16).unsqueeze(0).expand(2, 16),
        torch.randint(-9, 9, (6, 5), dtype=torch.int16).t(),
        torch.arange(40)[::3],
        torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32),
        torch.tensor([2**53, -7]),
        torch.tensor(-3, dtype=torch.int8),
        torch.tensor([True, True]),
        torch.tensor([False, False]),
        torch.tensor(False),
        torch.tril(torch.ones(1, 1, 16, 16)).expand(2, 1, 16, 16) < 0.5,
        torch.tensor([255, 0], dtype=torch.uint8),
    ]
    mine = _dump(tmp_path, "native", inputs)
    monkeypatch.setattr(native_stats, "load", lambda: None)
    theirs = _dump(tmp_path, "fallback", inputs)
    assert list(mine) == list(theirs)
    for name in mine:
        a, b = mine[name]["input_args"][0], theirs[name]["input_args"][0]
        dtype = getattr(torch, a["dtype"].split(".")[1])
        assert {k: v for k, v in a.items() if k not in ("Mean", "Norm", "Max", "Min")} == {
            k: v for k, v in b.items() if k not in ("Mean", "Norm", "Max", "Min")
        }, name
        row_a = [a[k] for k in ("Max", "Min", "Mean", "Norm")]
        row_b = [b[k] for k in ("Max", "Min", "Mean", "Norm")]
        if a["Mean"] is None or not dtype.is_floating_point or dtype is torch.float64:
            assert row_a == row_b, name
        else:
            assert_same([float(v) for v in row_a], [float(v) for v in row_b], dtype, inputs[int(name.split(".")[2])])


def test_integer_extremes_are_exact_over_the_whole_range(native):
    """The op reads integers as integers: Max and Min of int64 at its limits (and of every other integer type
    it serves, in any layout) are exact, as the torch-op fallback's are (below)."""
    recorder = StatBuffer(nan_inf_count=True, native=native).native_recorder(4096, 4)
    big = torch.tensor([[-(2**63), 5], [2**63 - 1, 2**53 + 1]])
    values = (big, big.t(), big[:, 1], torch.tensor([2**53 + 1]).expand(3), torch.tensor(2**63 - 1))
    records, todo = recorder.records(values)
    assert todo == 0
    rows = [record[4] for record in records]
    assert rows[:3] == [(2**63 - 1, -(2**63), None, None)] * 2 + [(2**53 + 1, 5, None, None)]
    assert rows[3:] == [(2**53 + 1, 2**53 + 1, None, None), (2**63 - 1,)]
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32):
        info = torch.iinfo(dtype)
        t = torch.tensor([[info.max, 1], [0, info.min]], dtype=dtype)
        [record], _ = recorder.records((t.t(),))
        assert record[4] == (info.max, info.min, None, None), dtype


def test_the_fallback_keeps_int64_extremes_exact():
    """The torch ops' numbers reach the host in one float64 copy per device, but an int64 Max, Min or value
    has a copy of its own: through float64, 2**53 + 1 would be 2**53. Its counts and the other numbers keep
    the float64 copy."""
    stats = StatBuffer(nan_inf_count=True, native=False)
    big = torch.tensor([[-(2**63), 5], [2**63 - 1, 2**53 + 1]])
    slots = [stats.add(t, tensor_kind(t))[0] for t in (big, big[:, 1], torch.tensor(2**53 + 1))]
    floats = torch.tensor([1.5, -2.0, float("inf")])
    halves, half_counts = stats.add(floats, tensor_kind(floats))
    stats.take()
    assert [slot_values(slot) for slot in slots] == [[2**63 - 1, -(2**63)], [2**53 + 1, 5], [2**53 + 1]]
    assert slot_values(halves)[:2] == [float("inf"), -2.0] and slot_values(half_counts) == [0.0, 1.0]
    assert slots[0].batch is slots[2].batch and slots[0].batch is not halves.batch


@pytest.mark.slow  # a fresh interpreter
def test_a_cached_build_is_imported_without_building(native):
    import subprocess
    import sys

    # no build: cpp_extension.load, which builds, is taken away, and the cached library is what loads; judged by
    # what ran, not by a time (the machine's load moves that)
    code = (
        "import logging; logging.basicConfig(); import torch.utils.cpp_extension as ext; ext.load = None; "
        "from msprobe_runtime import native_stats; print(native_stats.load() is not None)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"] and "building" not in done.stderr, done.stderr


class _Level(enum.IntEnum):
    HIGH = 3


def test_records_in_one_call_equal_those_made_one_by_one(native, monkeypatch, tmp_path):
    """A call's arguments and outputs described in one native call (``StatBuffer.native_recorder``) give the
    dump that describing them one by one gives: the same op's numbers, so equal to the bit, and every value
    it leaves to the caller (large tensors, other dtypes, subclasses, containers, enums) described as before."""
    torch.manual_seed(0)
    values = (
        torch.randn(3, 5),
        None,
        7,
        2.5,
        True,
        "mean",
        torch.tensor(1.5),
        torch.randn(5000),
        torch.arange(6),
        torch.randn(4, dtype=torch.float64),
        torch.empty(0, 2),
        torch.randn(8).expand(3, 8),
        torch.randn(6, 4).t(),
        torch.nn.Parameter(torch.randn(3)),
        torch.randn(4).as_subclass(_Subclass),
        [torch.randn(2), 3],
        {"k": torch.randn(2)},
        torch.float16,
        _Level.HIGH,
        torch.Size([2, 3]),
        torch.randn(5, requires_grad=True),
        torch.tensor([1.0, float("nan"), float("inf")]).half(),
    )
    calls = []
    original = StatBuffer.native_recorder

    class Counting:
        def __init__(self, recorder):
            self.recorder = recorder

        def records(self, values):
            calls.append(len(values))
            return self.recorder.records(values)

        def clear(self):
            self.recorder.clear()

        def __getattr__(self, name):  # observe_backward, hook_api
            return getattr(self.recorder, name)

    def run(name):
        config = tmp_path / f"{name}.json"
        config.write_text(
            json.dumps({"dump_path": str(tmp_path / name), "level": "L1", "statistics": {"nan_inf_count": True}})
        )
        debugger = PrecisionDebugger(config_path=str(config))
        debugger.start()
        rt.call("Torch.broadcast_tensors", lambda *args: tuple(v for v in args if type(v) is torch.Tensor), *values)
        debugger.stop()
        debugger.wait()
        [directory] = glob.glob(os.path.join(str(tmp_path / name), "step0", "*"))
        with open(os.path.join(directory, "dump.json")) as handle:
            return json.load(handle)["data"]

    monkeypatch.setattr(StatBuffer, "native_recorder", lambda self, *rest: Counting(original(self, *rest)))
    mine = run("one call")
    # the inputs in one call, then the tensors inside the list and the dict, then the outputs in one call
    assert calls == [len(values), 1, 1, sum(type(v) is torch.Tensor for v in values)]
    monkeypatch.setattr(StatBuffer, "native_recorder", lambda self, *rest: None)
    theirs = run("one by one")
    assert mine == theirs
    [entry] = mine.values()
    assert len(entry["input_args"]) == len(values) and entry["input_args"][2] == {"type": "int", "value": 7}
    assert entry["input_args"][0]["Max"] is not None and entry["output"][0] == entry["input_args"][0]


def test_a_step_of_plain_cpu_tensors_is_written_without_looking_for_records(native, monkeypatch, tmp_path):
    """Float, integer and bool CPU tensors all get the native op's records, so a step holds no TensorRecord
    and the flush writes its entries as they are (``StepJob.plain``): the dump equals the one whose entries
    are walked for records, and the one made by the torch ops."""
    from msprobe_runtime import writer

    torch.manual_seed(0)
    values = (
        torch.randn(3, 4),
        torch.tensor([3, -7, 2]),
        torch.tensor(5),
        torch.tensor([True, False]),
        torch.tensor(True),
        torch.randint(0, 9, (5,), dtype=torch.uint8),
        torch.arange(6000).reshape(60, 100),
        torch.randint(-3, 3, (4,), dtype=torch.int8),
    )
    made = {}

    def run(name):
        debugger = PrecisionDebugger(dump_path=str(tmp_path / name), level="L1")
        debugger.start()
        for value in values:
            rt.call("Torch.clone", torch.clone, value)
        made[name] = debugger._collector.step.tensor_records
        debugger.stop()
        debugger.wait()
        [directory] = glob.glob(os.path.join(str(tmp_path / name), "step0", "*"))
        with open(os.path.join(directory, "dump.json")) as handle:
            return json.load(handle)["data"]

    plain = run("plain")
    real_init = writer.StepJob.__init__
    monkeypatch.setattr(writer.StepJob, "__init__", lambda self, *args: real_init(self, *args[:6], False))
    walked = run("walked")
    monkeypatch.setattr(native_stats, "load", lambda: None)
    by_torch_ops = run("torch ops")
    assert made == {"plain": 0, "walked": 0, "torch ops": 2 * len(values)}
    assert plain == walked
    for name, entry in plain.items():
        if entry["input_args"][0]["dtype"] != "torch.float32":
            assert entry == by_torch_ops[name], name  # integers and bools: exactly the torch ops' record


def test_records_of_one_shape_share_its_tuple_and_every_shape_is_its_own(native):
    """A record's shape comes from a small table of recent shapes: records of the same shape hold one tuple, and
    shapes that fall in the same slot of the table ((5,) and (1029,)) never give each other's sizes."""
    recorder = StatBuffer(nan_inf_count=True).native_recorder(1 << 30, 0)
    shapes = [(5,), (1029,), (5,), (2, 3), (3, 2), (2, 3), (), (1029,), (7, 1, 2)]
    tensors = [torch.ones(shape) for shape in shapes]
    records, todo = recorder.records(tensors)
    assert todo == 0
    assert [record[1] for record in records] == shapes
    assert records[3][1] is records[5][1]  # (2, 3) twice, nothing in its slot between
    assert [type(size) for record in records for size in record[1]] == [int] * sum(len(s) for s in shapes)
    again, _ = recorder.records([torch.ones(2, 3), torch.ones(3, 2)])
    assert again[0][1] is records[5][1] and again[1][1] is records[4][1]
