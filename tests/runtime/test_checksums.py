"""Bit-level checksums (runtime/checksums.py): the device fingerprint against its pure-Python specification,
its sensitivity to every single flipped bit, its independence of layout, and msprobe's md5 (CRC32 of the raw
bytes) taken from a copy made at record time."""

import zlib

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import checksums  # noqa: E402
from msprobe_runtime.statistics import StatBuffer  # noqa: E402

DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
]


def raw_bytes(t):
    flat = t.detach().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).tolist()) if flat.numel() else b""


def sample(dtype, shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(shape, generator=generator, dtype=torch.float64) * 3).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=generator, dtype=dtype)


def fingerprint(t):
    return checksums.fingerprint_hex(checksums.fingerprint_parts(t).tolist())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 4)], ids=str)
def test_fingerprint_is_its_specification(dtype, shape):
    t = sample(dtype, shape)
    assert fingerprint(t) == checksums.fingerprint_reference(raw_bytes(t))


@pytest.fixture
def small_rows(monkeypatch):
    """Rows of 16 bytes and blocks of 48: the multi-row and multi-block paths on tensors of a few hundred
    bytes (the real sizes need megabytes, which the pure-Python specification would take seconds over)."""
    monkeypatch.setattr(checksums, "_ROW", 16)
    monkeypatch.setattr(checksums, "_BLOCK", 48)
    monkeypatch.setattr(checksums, "_tables", {})


@pytest.mark.parametrize("numel", [3, 4, 12, 13, 50, 97])
def test_fingerprint_over_rows_and_blocks(small_rows, numel):
    t = sample(torch.float32, (numel,), seed=numel)
    assert fingerprint(t) == checksums.fingerprint_reference(raw_bytes(t))


def test_fingerprint_tables_grow_for_a_larger_tensor(small_rows):
    first = sample(torch.int32, (20,))
    assert fingerprint(first) == checksums.fingerprint_reference(raw_bytes(first))
    larger = sample(torch.int32, (600,), seed=1)  # 2400 bytes: 150 rows, past the first multiplier table
    assert fingerprint(larger) == checksums.fingerprint_reference(raw_bytes(larger))


def flip(t, element, bit):
    """A copy of ``t`` with one bit of one element flipped, through an integer view of the same width."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    out = t.clone()
    words = out.view(width).reshape(-1)
    words[element] ^= torch.tensor(1 << bit if bit < t.element_size() * 8 - 1 else -(1 << bit), dtype=width)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int8], ids=str)
def test_every_single_bit_flip_changes_the_fingerprint(dtype):
    t = sample(dtype, (37,))
    original = fingerprint(t)
    seen = {original}
    for element in (0, 18, 36):
        for bit in range(t.element_size() * 8):
            changed = flip(t, element, bit)
            assert not torch.equal(changed.view(torch.uint8), t.view(torch.uint8))
            value = fingerprint(changed)
            assert value != original, (element, bit)
            seen.add(value)
    assert len(seen) == 1 + 3 * t.element_size() * 8  # and no two flips collide with each other


def test_equal_bits_give_equal_fingerprints_in_any_layout():
    base = sample(torch.float32, (6, 8))
    transposed = base.t().contiguous().t()  # same values, column-major
    assert not transposed.is_contiguous()
    assert fingerprint(transposed) == fingerprint(base)
    strided = sample(torch.float32, (6, 16))[:, ::2]
    assert fingerprint(strided) == fingerprint(strided.contiguous())
    broadcast = torch.arange(4.0).expand(3, 4)
    assert fingerprint(broadcast) == fingerprint(broadcast.contiguous())
    offset = sample(torch.bfloat16, (33,))[1:]  # storage offset of one 2-byte element
    assert fingerprint(offset) == checksums.fingerprint_reference(raw_bytes(offset))


def test_values_that_differ_only_in_layout_of_bits_differ():
    a = torch.tensor([1.0, 2.0])
    assert fingerprint(a) != fingerprint(a.flip(0))  # position matters: XOR or sum checksums miss a swap
    assert fingerprint(torch.zeros(2)) != fingerprint(torch.zeros(3))  # length matters
    assert fingerprint(torch.tensor([0.0])) != fingerprint(torch.tensor([-0.0]))  # bits, not values


def test_fingerprint_through_the_statistics_buffer_is_exact():
    stats = StatBuffer(nan_inf_count=False)
    t = sample(torch.float32, (1000,))
    record = checksums.checksum_of(t, "fingerprint", True, stats)
    stats.add(torch.randn(10), 0)  # other pending values join the same float64 transfer
    stats.take()
    assert record.key == "fingerprint"
    assert record.value() == checksums.fingerprint_reference(raw_bytes(t))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_md5_is_crc32_of_the_raw_bytes(dtype):
    t = sample(dtype, (4, 5))
    record = checksums.checksum_of(t.t(), "md5", True, None)  # non-contiguous: hashed in logical order
    assert record.key == "md5"
    assert record.value() == f"{zlib.crc32(raw_bytes(t.t())):08x}"


def test_checksums_keep_the_value_at_record_time():
    stats = StatBuffer(nan_inf_count=False)
    t = sample(torch.float32, (64,))
    before = raw_bytes(t)
    md5 = checksums.checksum_of(t, "md5", True, stats)
    fp = checksums.checksum_of(t, "fingerprint", True, stats)
    t.add_(1.0)  # the user changes the tensor in place before the flush
    stats.take()
    assert md5.value() == f"{zlib.crc32(before):08x}"
    assert fp.value() == checksums.fingerprint_reference(before)


def test_empty_and_unreadable_tensors():
    assert checksums.checksum_of(torch.zeros(0), "md5", True, None).value() == "00000000"
    assert checksums.checksum_of(torch.zeros(0, 3), "fingerprint", True, None).value() == "0" * 16
    assert checksums.checksum_of(torch.zeros(2, device="meta"), "md5", False, None).value() is None
    assert checksums.checksum_of(torch.zeros(2, device="meta"), "fingerprint", False, None).value() is None


@pytest.mark.parametrize("mode", checksums.MODES)
def test_a_dump_hashes_what_was_recorded_while_another_thread_writes_the_tensors(tmp_path, mode):
    """The writer hashes (md5) or reads back (fingerprint) while the tensors are written in place by another
    thread from the moment each call returns: every checksum is still of the bits the call saw."""
    import glob
    import json
    import os
    import threading

    import msprobe_runtime as rt
    from msprobe_runtime import PrecisionDebugger

    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"dump_path": str(tmp_path / "dump"), "level": "L1", "statistics": {"summary_mode": mode}})
    )
    tensors = [sample(torch.float32, (256, 64), seed) for seed in range(24)]
    expected = [
        checksums.fingerprint_reference(raw_bytes(t)) if mode == "fingerprint" else f"{zlib.crc32(raw_bytes(t)):08x}"
        for t in tensors
    ]
    done = threading.Event()

    def write_all_along():
        while not done.is_set():
            for t in tensors:
                t.add_(1.0)

    debugger = PrecisionDebugger(config_path=str(config))
    debugger.start()
    for t in tensors:
        rt.call("Tensor.sum", torch.Tensor.sum, t)
    writer = threading.Thread(target=write_all_along)
    writer.start()
    try:
        debugger.stop()
        debugger.step()
        debugger.wait()
    finally:
        done.set()
        writer.join()
    [directory] = glob.glob(os.path.join(str(tmp_path / "dump"), "step0", "*"))
    with open(os.path.join(directory, "dump.json")) as handle:
        data = json.load(handle)["data"]
    seen = [data[f"Tensor.sum.{k}.forward"]["input_args"][0][mode] for k in range(len(tensors))]
    assert seen == expected
