"""The fingerprint kernels (runtime/triton_fingerprint.py) give the digits of the fingerprint's specification
(``checksums.fingerprint_reference``) and of the torch-op path (``checksums.fingerprint_parts``) on every dtype,
odd sizes, sizes of several blocks and programs, 0-d tensors, views, strides and offsets, NaN and Inf bit
patterns; one read of the bytes (no int64 copy), the tensors of a call in one launch and every tensor of a flush
finished by one more; a tensor read after its call that the call changed is null, not the changed bytes; a
failed launch leaves the torch ops' digits; and the collector's dump is the same through them as through the
torch ops. Without a GPU the
kernels run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, as tests/runtime/
test_triton_stats.py sets it); with one, on CUDA tensors, compiled. Skipped where Triton is not installed."""

import os

import pytest

torch = pytest.importorskip("torch")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton's first import (tests/conftest.py)
triton = pytest.importorskip("triton")

from fixtures.triton_kernels import Failing, kernels_module  # noqa: E402
from msprobe_runtime import checksums  # noqa: E402
from msprobe_runtime.statistics import StatBuffer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
] + [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)]


@pytest.fixture(scope="module", autouse=True)
def kernel():
    """The kernel's module (fixtures/triton_kernels.py: imported afresh under the interpreter where needed)."""
    return kernels_module("msprobe_runtime.triton_fingerprint", DEVICE, probe)


class NoCall:
    """A call state outside any call: ``Fingerprints.add`` launches at once."""

    depth = 0
    watch = None


def probe(module):
    """One launch of each kernel, raising what the interpreter raised (``kernels_module`` skips on some)."""
    from msprobe_runtime.statistics import Slot

    hashes = module.Fingerprints(NoCall(), Slot, [], None)
    hashes.add(torch.ones(3))
    if hashes.error is not None:
        raise hashes.error
    hashes.finish()


@pytest.fixture(autouse=True)
def triton_on(monkeypatch):
    monkeypatch.delenv("MSPROBE_TRITON", raising=False)


@pytest.fixture
def small_blocks(monkeypatch, kernel):
    """Blocks of 16 bytes, at most 4 programs, 2 blocks in one program's launch, partials summed 2 at a time:
    every path of the kernels (several blocks a program, several programs, the finishing loop) on tensors of
    a few hundred bytes, which the interpreter and the pure-Python specification take quickly."""
    monkeypatch.setattr(kernel, "_BLOCK", 16)
    monkeypatch.setattr(kernel, "_MAX_PROGRAMS", 4)
    monkeypatch.setattr(kernel, "_ONE_PROGRAM", 2)
    monkeypatch.setattr(kernel, "_FINISH_BLOCK", 2)
    return kernel


def on_device(t):
    return t.to(DEVICE)


def raw_bytes(t):
    flat = t.detach().cpu().contiguous().resolve_conj().resolve_neg().reshape(-1)
    return bytes(flat.view(torch.uint8).tolist()) if flat.numel() else b""


def sample(dtype, shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype is torch.uint8:
        return torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(shape, generator=generator, dtype=torch.float64) * 3).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=generator, dtype=dtype)


def fused_buffer():
    return StatBuffer(nan_inf_count=False, native=False, triton_cpu=DEVICE == "cpu")


def calling_buffer():
    """A ``fused_buffer`` whose statistics kernels are made already, so that ``one_launch`` opens a call's
    records (it is a no-op until the first tensor asks for them)."""
    from msprobe_runtime import statistics

    buffer = fused_buffer()
    buffer._fused = statistics._fused_stats(buffer.nan_inf_count)
    assert buffer._fused
    return buffer


def by_kernel(t):
    """The kernel's digits for ``t`` through ``StatBuffer.fused_fingerprint`` (None where it did not serve)."""
    buffer = fused_buffer()
    slot = buffer.fused_fingerprint(t, checksums.fingerprint_parts)
    if slot is None:
        return None
    buffer.take()
    return checksums.fingerprint_hex(slot.values())


def by_torch_ops(t):
    return checksums.fingerprint_hex(checksums.fingerprint_parts(t).tolist())


def check(t):
    """The kernel's digits are the specification's and the torch ops'; returned."""
    mine = by_kernel(t)
    assert mine is not None
    expected = checksums.fingerprint_reference(raw_bytes(t))
    assert mine == expected, (t.dtype, tuple(t.shape), t.stride())
    assert by_torch_ops(t) == expected
    return mine


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (1,), (3,), (1023,), (1025,), (3, 5, 7)], ids=str)
def test_every_dtype_is_the_specification(dtype, shape):
    check(on_device(sample(dtype, shape)))


@pytest.mark.parametrize("numel", [1, 3, 1023, 1025, 4096, 4097])
def test_odd_sizes_of_bytes(numel):
    check(on_device(sample(torch.uint8, (numel,), seed=numel)))


def test_past_one_program(kernel):
    """Past ``_ONE_PROGRAM`` blocks at the real block size: several programs, their partials finished."""
    n = kernel._BLOCK * kernel._ONE_PROGRAM + 5
    assert kernel.plan(n)[1] > 1
    check(on_device(sample(torch.uint8, (n,), seed=1)))
    check(on_device(sample(torch.bfloat16, (n // 2 + 1,), seed=2)))


@pytest.mark.parametrize("numel", [1, 15, 16, 17, 32, 33, 64, 65, 127, 128, 129, 200, 517])
def test_sizes_over_blocks_and_programs(small_blocks, numel):
    iters, programs = small_blocks.plan(numel)
    assert programs <= small_blocks._MAX_PROGRAMS and iters * programs * 16 >= numel
    check(on_device(sample(torch.uint8, (numel,), seed=numel)))


@pytest.mark.parametrize("numel", [1, 3, 4, 5, 8, 17, 33, 129])
def test_sizes_with_a_calls_statistics(small_blocks, monkeypatch, numel):
    """The hashes' programs of ``_partials_hash_few`` (a call's statistics and hashes in one launch: blocks of
    ``_BLOCK / _SPLIT`` bytes) give the specification's digits over blocks, programs and partial blocks."""
    from msprobe_runtime.statistics import KIND_FLOAT

    fused = Launches(small_blocks._partials_hash_few)
    monkeypatch.setattr(small_blocks, "_partials_hash_few", fused)
    buffer = calling_buffer()
    floats = on_device(sample(torch.float32, (numel,), seed=numel))
    raw = on_device(sample(torch.uint8, (3 * numel + 1,), seed=numel + 1))
    with buffer.one_launch():
        buffer.add(floats, KIND_FLOAT)  # the call's statistics, one launch
        records = [checksums.checksum_of(t, "fingerprint", True, buffer) for t in (floats, raw)]
    buffer.take()
    assert fused.count == 1
    assert [r.value() for r in records] == [checksums.fingerprint_reference(raw_bytes(t)) for t in (floats, raw)]


def test_more_programs_where_a_program_would_hash_too_many_blocks(small_blocks, monkeypatch):
    """A program hashes at most ``_MAX_ITERS`` blocks (its int64 accumulators' bound): more programs then,
    past ``_MAX_PROGRAMS``, and past one round of the finishing loop."""
    monkeypatch.setattr(small_blocks, "_MAX_ITERS", 2)
    assert small_blocks.plan(300) == (2, 10)
    check(on_device(sample(torch.uint8, (300,), seed=3)))
    check(on_device(sample(torch.float32, (77,), seed=4)))


def test_views_strides_and_offsets():
    base = on_device(sample(torch.float32, (6, 10, 9), seed=5))
    half = on_device(sample(torch.bfloat16, (33,), seed=6))
    bytes_ = on_device(sample(torch.uint8, (101,), seed=7))
    views = [
        base.transpose(0, 2),  # permuted
        base[:, ::3, 1:],  # strided slice
        base[2],  # offset view
        base[:, 4, :].unsqueeze(1).expand(6, 5, 9),  # broadcast
        base.unfold(1, 4, 3),  # overlapping windows
        half[1:],  # an offset of one 2-byte element
        bytes_[3:],  # an address that is no multiple of anything
        bytes_[1::2],
        torch._neg_view(base),  # its memory holds the values negated: the values' bytes
        on_device(sample(torch.complex64, (4, 3), seed=8)).conj(),  # likewise, conjugated
        on_device(sample(torch.int64, (5, 6), seed=9)).t(),
    ]
    seen = [check(view) for view in views]
    assert check(base.transpose(0, 2).contiguous()) == seen[0]  # the same bits in any layout
    assert seen[8] != check(base)


def test_zero_dim_and_empty(monkeypatch, kernel):
    for value, dtype in ((2.5, torch.float32), (-0.0, torch.float16), (7, torch.int64), (True, torch.bool)):
        check(on_device(torch.tensor(value, dtype=dtype)))
    launched = Launches(kernel._hash_few)
    monkeypatch.setattr(kernel, "_hash_few", launched)
    for empty in (torch.zeros(0), torch.zeros(0, 3, dtype=torch.bfloat16)):
        record = checksums.checksum_of(on_device(empty), "fingerprint", True, fused_buffer())
        assert record.value() == checksums.EMPTY_FINGERPRINT
    assert launched.count == 0


def test_nan_and_inf_bit_patterns():
    patterns = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0x7F800000, 0xFF800000, 0x00000001, 0x80000000]
    words = torch.tensor([p - (1 << 32) if p >= 1 << 31 else p for p in patterns], dtype=torch.int32)
    floats = on_device(words.view(torch.float32))
    check(floats)
    digits = {check(floats[k : k + 1]) for k in range(len(patterns))}
    assert len(digits) == len(patterns)  # NaNs of other payloads or signs differ: bits, not values
    check(on_device(torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0], dtype=torch.bfloat16)))


def test_every_single_bit_flip_changes_it():
    t = on_device(sample(torch.float16, (3,), seed=10))
    original = check(t)
    seen = {original}
    words = t.view(torch.int16)
    for element in range(3):
        for bit in range(16):
            changed = words.clone()
            changed[element] ^= torch.tensor(1 << bit if bit < 15 else -(1 << 15), dtype=torch.int16)
            value = by_kernel(changed.view(torch.float16))
            assert value != original, (element, bit)
            seen.add(value)
    assert len(seen) == 1 + 3 * 16


class Launches:
    """Counts the launches of a kernel of the module, then launches it; ``inside``: whether one is running (the
    interpreter copies its arguments, which is none of the runtime's doing)."""

    inside = False

    def __init__(self, kernel):
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid):
        self.count += 1
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            Launches.inside = True
            try:
                return launch(*args, **kwargs)
            finally:
                Launches.inside = False

        return run


def test_one_read_of_the_bytes(monkeypatch, kernel):
    """Outside a call a tensor's fingerprint is one launch of ``_hash_few``, and the flush one ``_hash_finish`` for
    all of them: the torch ops (which widen the bytes to int64) are never called, and no tensor is converted
    (``to``) outside the kernels' launches."""
    hashed, finished = Launches(kernel._hash_few), Launches(kernel._hash_finish)
    monkeypatch.setattr(kernel, "_hash_few", hashed)
    monkeypatch.setattr(kernel, "_hash_finish", finished)

    def refused(*args, **kwargs):
        raise AssertionError("the torch ops' fingerprint was called")

    converted = []
    original_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if not Launches.inside:
            converted.append((self.numel(), args, kwargs))
        return original_to(self, *args, **kwargs)

    small = on_device(sample(torch.bfloat16, (1000,), seed=11))
    large = on_device(sample(torch.uint8, (kernel._BLOCK * kernel._ONE_PROGRAM + 1,), seed=12))
    buffer = fused_buffer()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checksums, "fingerprint_parts", refused)
        patch.setattr(torch.Tensor, "to", to)
        records = [checksums.checksum_of(t, "fingerprint", True, buffer) for t in (small, large)]
    assert (hashed.count, finished.count) == (2, 0)
    assert converted == []
    buffer.take()
    assert finished.count == 1
    assert [r.value() for r in records] == [checksums.fingerprint_reference(raw_bytes(t)) for t in (small, large)]


def test_the_tensors_of_a_call_in_one_launch(monkeypatch, kernel):
    """Within a call's records (``one_launch``) the fingerprints are queued and launched as it ends, four tensors
    a launch, whatever their sizes and dtypes; the next flush finishes them all in one launch."""
    hashed, finished = Launches(kernel._hash_few), Launches(kernel._hash_finish)
    monkeypatch.setattr(kernel, "_hash_few", hashed)
    monkeypatch.setattr(kernel, "_hash_finish", finished)
    large = kernel._BLOCK * kernel._ONE_PROGRAM + 3  # several programs
    tensors = [
        on_device(sample(dtype, shape, seed=20 + k))
        for k, (dtype, shape) in enumerate(
            [
                (torch.float32, (33,)),
                (torch.bfloat16, (large // 2,)),
                (torch.int64, (5, 3)),
                (torch.uint8, (large,)),
                (torch.float16, ()),
                (torch.float32, (7, 9)),
            ]
        )
    ]
    buffer = calling_buffer()
    records = []
    for call in (tensors[:1], tensors[1:3], tensors):
        launched_before = hashed.count
        with buffer.one_launch():
            records += [checksums.checksum_of(t, "fingerprint", True, buffer) for t in call]
            assert hashed.count == launched_before  # queued
        assert hashed.count - launched_before == -(-len(call) // 4)  # as the call's records are made
    assert hashed.count == 1 + 1 + 2 and finished.count == 0
    buffer.take()
    assert finished.count == 1
    expected = [checksums.fingerprint_reference(raw_bytes(t)) for t in tensors]
    assert [r.value() for r in records] == expected[:1] + expected[1:3] + expected


def test_an_input_the_call_changed_is_null(kernel):
    """An input read after its call (``begin(watch)``, as for a call that leaves its inputs as they are) that the
    call changed after all: its fingerprint null and the API said, never the bytes after the call; the inputs it
    left have the digits of the bytes the call saw."""
    buffer = calling_buffer()
    fused = buffer._fused
    kept, moved = on_device(sample(torch.float32, (300,), seed=30)), on_device(sample(torch.float32, (5,), seed=31))
    before = raw_bytes(kept)
    fused.begin("Torch.add_")
    records = [checksums.checksum_of(t, "fingerprint", True, buffer) for t in (kept, moved)]
    fused.hold()
    moved.add_(1.0)  # the call, in place
    fused.begin()
    output = checksums.checksum_of(moved, "fingerprint", True, buffer)
    buffer.end_call(fused)
    buffer.take()
    assert records[0].value() == checksums.fingerprint_reference(before)
    assert records[1].value() is None
    assert output.value() == checksums.fingerprint_reference(raw_bytes(moved))
    assert fused.changed == ["Torch.add_"]


def test_no_host_sync_and_the_values_at_record_time():
    synced = []
    t = on_device(sample(torch.float32, (5000,), seed=13))
    before = raw_bytes(t)
    buffer = fused_buffer()
    with pytest.MonkeyPatch.context() as patch:
        for name in ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"):
            original = getattr(torch.Tensor, name)
            patch.setattr(
                torch.Tensor, name, lambda self, *a, _n=name, _o=original, **k: synced.append(_n) or _o(self, *a, **k)
            )
        record = checksums.checksum_of(t, "fingerprint", True, buffer)
    assert synced == []
    t.add_(1.0)  # changed in place before the flush
    buffer.take()
    assert record.value() == checksums.fingerprint_reference(before)


@pytest.mark.parametrize("in_a_call", [False, True])
def test_a_kernel_that_fails_here_leaves_the_torch_ops(monkeypatch, kernel, caplog, in_a_call):
    """Said once; the torch ops' digits from then on (the same digits), not nulls: those of the tensors the failed
    launch held too, at once or as a call ends."""

    monkeypatch.setattr(kernel, "_hash_few", Failing("PTX .version 9.9 does not support .target sm_999"))
    buffer = calling_buffer()
    tensors = [on_device(sample(torch.float32, (n,), seed=n)) for n in (10, 300, 7)]
    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        if in_a_call:
            with buffer.one_launch():
                records = [checksums.checksum_of(t, "fingerprint", True, buffer) for t in tensors[:2]]
        else:
            records = [checksums.checksum_of(t, "fingerprint", True, buffer) for t in tensors[:2]]
        records.append(checksums.checksum_of(tensors[2], "fingerprint", True, buffer))
    warnings = [r.getMessage() for r in caplog.records if "Triton" in r.getMessage()]
    assert len(warnings) == 1 and "fingerprint" in warnings[0] and "sm_999" in warnings[0], warnings
    buffer.take()
    assert [r.value() for r in records] == [checksums.fingerprint_reference(raw_bytes(t)) for t in tensors]
    assert buffer._fingerprint_devices == () and buffer._fused  # the statistics kernels still serve


def test_where_triton_does_not_serve_the_torch_ops(monkeypatch, kernel):
    launched = Launches(kernel._hash_few)
    monkeypatch.setattr(kernel, "_hash_few", launched)
    t = on_device(sample(torch.float32, (20,)))
    assert (
        StatBuffer(native=False).fused_fingerprint(torch.ones(3), checksums.fingerprint_parts) is None
    )  # the CPU path: never Triton
    monkeypatch.setenv("MSPROBE_TRITON", "0")
    buffer = fused_buffer()
    assert buffer.fused_fingerprint(t, checksums.fingerprint_parts) is None and buffer._fused is False
    record = checksums.checksum_of(t, "fingerprint", True, buffer)
    buffer.take()
    assert record.value() == checksums.fingerprint_reference(raw_bytes(t))
    assert launched.count == 0


def _dump(tmp_path, name, calls, mode="fingerprint"):
    import glob
    import json

    import msprobe_runtime as rt
    from msprobe_runtime import PrecisionDebugger

    config = tmp_path / f"{name}.json"
    config.write_text(
        json.dumps({"dump_path": str(tmp_path / name), "level": "L1", "statistics": {"summary_mode": mode}})
    )
    debugger = PrecisionDebugger(config_path=str(config))
    debugger.start()
    try:
        calls(rt)
    finally:
        debugger.stop()
        debugger.wait()
    [path] = glob.glob(os.path.join(glob.escape(str(tmp_path / name)), "step0", "*", "dump.json"))
    with open(path) as handle:
        return json.load(handle)["data"]


def test_the_dump_through_the_kernel(tmp_path, monkeypatch, kernel):
    """A recorded run with summary_mode fingerprint writes the same fingerprints through the kernel as through
    the torch ops: each the specification's digits of the bytes the call saw."""
    from msprobe_runtime import collector

    tensors = [
        on_device(t)
        for t in (
            sample(torch.bfloat16, (3000,), seed=14),
            sample(torch.float32, (5, 7), seed=15).t(),
            torch.tensor(2.5, dtype=torch.float16),
            sample(torch.int64, (40,), seed=16),
            torch.tensor([1.0, float("nan"), float("inf")]),
            torch.zeros(0),
        )
    ]

    def calls(rt):
        for t in tensors:
            rt.call("Torch.clone", torch.clone, t)

    launched, with_statistics = Launches(kernel._hash_few), Launches(kernel._partials_hash_few)
    monkeypatch.setattr(kernel, "_hash_few", launched)
    monkeypatch.setattr(kernel, "_partials_hash_few", with_statistics)
    monkeypatch.setattr(collector, "StatBuffer", lambda counts: StatBuffer(counts, native=False, triton_cpu=True))
    fused = _dump(tmp_path, "fused", calls)
    monkeypatch.setattr(collector, "StatBuffer", lambda counts: StatBuffer(counts, native=False))
    torch_ops = _dump(tmp_path, "torch_ops", calls)
    # each call's input and output hashed in one launch with their statistics: the float calls'; the int64 call's
    # statistics are the torch ops', so its hashes launch alone; none for the empty one; and the first call's input
    # alone, at its record: the kernels are made by it, after the call's records began (the collector opens a
    # call's records on the kernels only once they are made)
    assert (with_statistics.count, launched.count) == (4, 1 + 1)
    assert sorted(fused) == sorted(torch_ops) and len(fused) == len(tensors)
    for index, t in enumerate(tensors):
        name = f"Torch.clone.{index}.forward"
        for field in ("input_args", "output"):
            mine, theirs = fused[name][field][0], torch_ops[name][field][0]
            assert mine["fingerprint"] == theirs["fingerprint"] == checksums.fingerprint_reference(raw_bytes(t))


def test_a_tensor_recorded_again_unchanged_is_hashed_once(tmp_path, monkeypatch, kernel):
    """A call's output that the next call takes is hashed once for both records; changed in place between them, it
    is hashed again, and each record has the digits of the bytes its call saw."""
    from msprobe_runtime import collector

    hashed = []  # (tensor, version) of each record's hash made
    checksum_of = collector.checksum_of
    monkeypatch.setattr(
        collector, "checksum_of", lambda t, *args: hashed.append((t, t._version)) or checksum_of(t, *args)
    )
    monkeypatch.setattr(collector, "StatBuffer", lambda counts: StatBuffer(counts, native=False, triton_cpu=True))
    x = on_device(sample(torch.float32, (50,), seed=40))
    expected = {"y": raw_bytes(x), "y changed": raw_bytes(x + 1.0)}  # before collecting: no records of its own
    seen = {}

    def calls(rt):
        y = rt.call("Torch.clone", torch.clone, x)
        seen["tensor"] = y
        rt.call("Torch.clone", torch.clone, y)  # y again, unchanged
        y.add_(1.0)  # changed in place between two records (this module is not rewritten: the call is observed)
        rt.call("Torch.clone", torch.clone, y)

    data = _dump(tmp_path, "again", calls)
    versions = [version for t, version in hashed if t is seen["tensor"]]
    assert versions == [0, 1]  # once as the first call's output and the second's input; changed: once more
    reference = checksums.fingerprint_reference
    assert data["Torch.clone.0.forward"]["output"][0]["fingerprint"] == reference(expected["y"])
    assert data["Torch.clone.1.forward"]["input_args"][0]["fingerprint"] == reference(expected["y"])
    assert data["Torch.clone.2.forward"]["input_args"][0]["fingerprint"] == reference(expected["y changed"])
    assert data["Torch.clone.2.forward"]["output"][0]["fingerprint"] == reference(expected["y changed"])


STATISTICS = ("Max", "Min", "Mean", "Norm")


def _chain():
    tensors = [
        on_device(sample(dtype, shape, seed=50 + k))
        for k, (dtype, shape) in enumerate([(torch.float32, (300,)), (torch.bfloat16, (2, 700)), (torch.float16, (9,))])
    ]

    def calls(rt):
        for t in tensors:
            y = rt.call("Torch.mul", torch.mul, t, t)
            rt.call("Torch.add", torch.add, y, t)

    return tensors, calls


def test_a_calls_statistics_and_hashes_in_one_launch(tmp_path, monkeypatch, kernel):
    """With a checksum mode, a call's statistics and fingerprints launch together (``_partials_hash_few``): the
    statistics the same bits as without fingerprints, the fingerprints the specification's digits."""
    from msprobe_runtime import collector

    fused = Launches(kernel._partials_hash_few)
    monkeypatch.setattr(kernel, "_partials_hash_few", fused)
    monkeypatch.setattr(collector, "StatBuffer", lambda counts: StatBuffer(counts, native=False, triton_cpu=True))
    tensors, calls = _chain()
    hashed = _dump(tmp_path, "hashed", calls, "fingerprint")
    plain = _dump(tmp_path, "plain", calls, "statistics")
    assert fused.count >= 2 * len(tensors) - 1  # every call but the first, whose inputs launch at their records
    assert sorted(hashed) == sorted(plain) and len(hashed) == 2 * len(tensors)
    for name, entry in hashed.items():
        for field in ("input_args", "output"):
            for mine, theirs in zip(entry[field], plain[name][field]):
                assert [mine[key] for key in STATISTICS] == [theirs[key] for key in STATISTICS], (name, field)
                assert mine["fingerprint"] is not None
    for k, t in enumerate(tensors):
        assert hashed[f"Torch.mul.{k}.forward"]["input_args"][0]["fingerprint"] == checksums.fingerprint_reference(
            raw_bytes(t)
        )


def test_a_failed_launch_of_both_keeps_the_fingerprints(tmp_path, monkeypatch, kernel, caplog):
    """Said; the fingerprints of the call whose launch failed are the torch ops' digits, not nulls, and the calls
    after it take the torch ops."""
    from msprobe_runtime import collector

    monkeypatch.setattr(kernel, "_partials_hash_few", Failing("PTX .version 9.9 does not support .target sm_999"))
    monkeypatch.setattr(collector, "StatBuffer", lambda counts: StatBuffer(counts, native=False, triton_cpu=True))
    tensors, calls = _chain()
    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        data = _dump(tmp_path, "failed", calls, "fingerprint")
    assert any("sm_999" in r.getMessage() for r in caplog.records)
    for k, t in enumerate(tensors):
        for name in (f"Torch.mul.{k}.forward", f"Torch.add.{k}.forward"):
            assert data[name]["input_args"][-1]["fingerprint"] == checksums.fingerprint_reference(raw_bytes(t))
        for name in (f"Torch.mul.{k}.forward", f"Torch.add.{k}.forward"):
            assert data[name]["output"][0]["fingerprint"] is not None
