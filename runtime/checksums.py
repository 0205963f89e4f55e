"""Bit-level checksums of tensors: ``summary_mode`` md5 and fingerprint.

``md5`` is msprobe's: the CRC32 of the tensor's raw bytes (bfloat16 as its own 16 bits), as 8 hex digits under
the record's ``md5`` key, so that msprobe's compare reads our dumps. The training thread only starts a copy to
the host (non-blocking, into pinned memory, where the tensor lives on a device; a plain copy on the CPU, since
the user may change the tensor in place); the writer thread waits for the copy and hashes it.

``fingerprint`` is ours: a hash of the raw bytes computed on the tensor's own device with integer ops, with no
copy to the host and no sync. It is two polynomial hashes modulo primes below 2**31,
``H = sum((b[k] + 1) * g**k) mod p`` over the bytes ``b`` in memory order of the contiguous tensor, with
(p, g) = (2**31 - 1, 48271) and (2**31 - 19, 40007), both g primitive roots. Every product and every partial
sum fits an int64 (see ``_BLOCK``, and ``triton_fingerprint``), so the value is exact and the same for the
same bits on any device and in any layout. A change confined to one byte, so any single flipped bit, always
changes it: the byte's term moves by ``d * g**k`` with ``0 < |d| < 256 < p``, which is never 0 mod p. For
changes unrelated to the bases the chance of an equal fingerprint is about ``1 / (p1 * p2)``, 2**-62; the worst
case over crafted changes of an n-byte tensor is bounded by ``(n / p1) * (n / p2)``. The 16 hex digits are the
two hashes, 8 each.

Two paths, the same digits for the same bits (tests/runtime/test_triton_fingerprint.py). Where the Triton
statistics serve (a CUDA or ROCm tensor, ``MSPROBE_TRITON`` on: ``StatBuffer.fused_fingerprint``), a Triton
kernel (``triton_fingerprint``) reads the bytes once, as uint8 from the tensor's memory, both hashes in the
same read, with no copy of a contiguous tensor. Elsewhere (the CPU, an NPU, no Triton, a kernel that failed
here) ``fingerprint_parts`` below serves with torch ops: the bytes widened to int64 a block at a time, reduced
once per hash against tables of powers.

Statistics slots carry the fingerprint to the host as four 16-bit parts, exact in any float type the flush
uses.
"""

from __future__ import annotations

import threading
import zlib

from .fingerprint_lanes import LANES, geometric_sum
from .json_files import EMPTY_FINGERPRINT, FINGERPRINT_KEY, fingerprint_hex  # the writing process's too

# bytes per row of the power table: a row sums at most 2**20 products below 2**8 * 2**31 (< 2**60)
_ROW = 1 << 20
_BLOCK = 16 * _ROW  # bytes widened to int64 at a time: 128 MiB of temporaries, whatever the tensor's size

_tables = {}  # device -> (row powers per lane, row multipliers per lane)
_tables_lock = threading.Lock()


def _powers(device, base, p, count):
    """``base**k mod p`` for k < count, on ``device``, by doubling (no copy from the host)."""
    import torch

    out = torch.ones(1, dtype=torch.int64, device=device)
    while out.numel() < count:
        out = torch.cat((out, out * pow(base, out.numel(), p) % p))
    return out[:count]


def _tables_for(device, rows):
    with _tables_lock:
        known = _tables.get(device)
        if known is None or known[1][0].numel() < rows:
            have = known[1][0].numel() if known is not None else 0
            count = max(rows, 2 * have, 64)
            powers = known[0] if known is not None else tuple(_powers(device, g, p, _ROW) for p, g in LANES)
            multipliers = tuple(_powers(device, pow(g, _ROW, p), p, count) for p, g in LANES)
            known = (powers, multipliers)
            _tables[device] = known
        return known


def fingerprint_parts(t):
    """The fingerprint of ``t``'s bits as a device tensor of four int64 values below 2**16 (launched, not
    read); ``t`` must hold data (not meta, sparse or nested) and at least one element."""
    import torch

    # logical order: a copy only where the layout is not dense; a negative or conjugate view (whose memory holds
    # other values, and which ``view`` refuses) resolved into its values
    flat = t.detach().contiguous().resolve_conj().resolve_neg().reshape(-1)
    raw = flat.view(torch.uint8) if flat.dtype is not torch.uint8 else flat
    n = raw.numel()
    rows = (n + _ROW - 1) // _ROW
    powers, multipliers = _tables_for(raw.device, rows)
    on_cpu = raw.device.type == "cpu"
    sums = [None, None]
    for start in range(0, n, _BLOCK):
        part = raw[start : start + _BLOCK].to(torch.int64)
        length = part.numel()
        full = length // _ROW
        first_row = start // _ROW
        for lane, (p, _g) in enumerate(LANES):
            pieces = []
            if full:
                rows_view = part[: full * _ROW].view(full, _ROW)
                # int64 mv is one pass on the CPU; other backends may lack integer matmul
                pieces.append(torch.mv(rows_view, powers[lane]) if on_cpu else (rows_view * powers[lane]).sum(1))
            tail = length - full * _ROW
            if tail:
                pieces.append(
                    torch.dot(part[full * _ROW :], powers[lane][:tail]).reshape(1)
                    if on_cpu
                    else (part[full * _ROW :] * powers[lane][:tail]).sum().reshape(1)
                )
            row_sums = (pieces[0] if len(pieces) == 1 else torch.cat(pieces)) % p
            count = row_sums.numel()
            total = (row_sums * multipliers[lane][first_row : first_row + count] % p).sum() % p
            sums[lane] = total if sums[lane] is None else (sums[lane] + total) % p
    # the "+ 1" of every byte, summed in closed form: sum of g**k for k < n
    sums = [(total + geometric_sum(g, n, p)) % p for total, (p, g) in zip(sums, LANES)]
    h1, h2 = sums
    return torch.stack((h1 >> 16, h1 & 0xFFFF, h2 >> 16, h2 & 0xFFFF))


def fingerprint_reference(data: bytes) -> str:
    """The same fingerprint computed in pure Python over ``data`` (the specification, for tests)."""
    out = []
    for p, g in LANES:
        total, power = 0, 1
        for byte in data:
            total = (total + (byte + 1) * power) % p
            power = power * g % p
        out.append(f"{total:08x}")
    return "".join(out)


MD5_KEY = "md5"
MODES = ("md5", "fingerprint")


class Fixed:
    """A checksum known at record time (an empty tensor's), or null (a tensor whose bytes cannot be read)."""

    __slots__ = ("key", "_value")

    def __init__(self, key, value):
        self.key = key
        self._value = value

    def value(self):
        return self._value


class Fingerprint:
    """A fingerprint's parts in a statistics slot: computed on the device, read back with the statistics."""

    __slots__ = ("slot",)
    key = FINGERPRINT_KEY

    def __init__(self, slot):
        self.slot = slot

    def value(self):
        parts = self.slot.values()
        return fingerprint_hex(parts) if parts is not None else None


class HostCopy:
    """A tensor's bytes on their way to the host, hashed with CRC32 on the writer thread (msprobe's md5)."""

    __slots__ = ("batch",)
    key = MD5_KEY

    def __init__(self, host, event):
        from .statistics import Batch

        self.batch = Batch(host, event, crc32_hex)

    def value(self):
        return self.batch.values()


def checksum_of(t, mode, readable, stats):
    """The checksum record of ``t`` under summary_mode ``mode`` (one of MODES); ``readable``: whether its
    bytes can be read (not meta, sparse, quantized or nested); ``stats``: the StatBuffer carrying slots."""
    if mode == MD5_KEY:
        if not readable:
            return Fixed(MD5_KEY, None)
        if t.numel() == 0:
            return Fixed(MD5_KEY, f"{zlib.crc32(b''):08x}")
        return start_host_copy(t)
    if not readable:
        return Fixed(FINGERPRINT_KEY, None)
    if t.numel() == 0:
        return Fixed(FINGERPRINT_KEY, EMPTY_FINGERPRINT)
    slot = stats.fused_fingerprint(t, fingerprint_parts)  # by Triton kernels where they serve: one read
    if slot is None:
        slot = stats.add_values(fingerprint_parts(t), 4)
    return Fingerprint(slot)


def start_host_copy(t):
    """Start the copy of ``t``'s bytes to the host; the returned HostCopy hashes them when asked."""
    import torch

    from .statistics import record_event

    t = t.detach()
    if t.device.type == "cpu":
        return HostCopy(t.clone(memory_format=torch.contiguous_format), None)
    try:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    except Exception:  # no pinned memory on this backend: the copy below then waits for the device
        host = torch.empty(t.shape, dtype=t.dtype)
    host.copy_(t, non_blocking=True)
    return HostCopy(host, record_event(t.device))


def crc32_hex(host):
    """CRC32 of a host tensor's bytes, read from its memory directly, as msprobe writes it."""
    import ctypes

    host = host.contiguous()
    size = host.numel() * host.element_size()
    if size == 0:
        return f"{zlib.crc32(b''):08x}"
    buffer = (ctypes.c_ubyte * size).from_address(host.data_ptr())
    return f"{zlib.crc32(memoryview(buffer)):08x}"
