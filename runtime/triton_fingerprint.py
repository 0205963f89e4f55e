"""The fingerprint (``checksums``: ``summary_mode`` fingerprint) of device tensors in one read of their bytes, by
Triton kernels: both lanes' hashes ``sum((b[k] + 1) * g**k) mod p`` from one load of each byte, as uint8 from
the tensor's own memory, with no int64 copy of it and no temporary of its size (the torch ops of
``checksums.fingerprint_parts`` widen the bytes to int64, 8 bytes a byte, and read them once per lane).

Used by ``statistics.StatBuffer.fused_fingerprint`` only where the Triton statistics serve (a CUDA or ROCm
tensor while ``MSPROBE_TRITON`` is on and Triton imports; a CPU tensor of a ``StatBuffer(triton_cpu=True)``,
for the tests under ``TRITON_INTERPRET=1``: tests/runtime/test_triton_fingerprint.py); elsewhere the torch
ops of ``checksums`` serve, with the same 16 hex digits for the same bits.

As the statistics kernels do (``triton_stats``), the tensors of one call are hashed by one launch and finished by
one launch per arena at the flush (``Fingerprints``): within a call's ``begin``/``end`` a tensor is queued, its
rows taken in its device's arena; ``end`` launches the queue, one to ``_FEW`` tensors a launch of ``_hash_few``
(their addresses as arguments: nothing made on the host nor copied); outside a call a tensor is launched alone at
once. ``_hash_finish`` (one program a tensor) sums each tensor's rows at the flush. Where the call's statistics
are one ``_partials_few`` launch too (one to four contiguous tensors of one dtype), both go in one
``_partials_hash_few``: its first programs are the statistics' (the same code and warps: the same bits), the rest
the hashes'. So a call's records take one launch, where each tensor took one or two of its own besides its
statistics' (tests/runtime/test_triton_fingerprint.py). Where the native op builds, its Recorder's lane makes those
records itself, each tensor's bytes queued here beside its statistics (``Fingerprints.attach``), and launches a call's
queues straight to the compiled ``_partials_hash_few``, or, a call of integer tensors only (no statistics' launch),
its hashes to the compiled ``_hash_few`` (tests/runtime/test_native_lane.py, test_triton_launch.py).

``_hash_few``: program ``i`` of a tensor hashes its chunk of ``iters`` blocks of ``BLOCK`` bytes relative to the
chunk's start: lane ``j`` of a block accumulates ``b * G``, ``G = g**(block offset) mod p`` a scalar updated once
a block; the lanes are weighted by ``g**j`` at the end and the chunk's sum by ``g**(chunk start)``
(square-and-multiply in the kernel), into the tensor's row ``i`` of the arena. Whole blocks are loaded without a
mask (16-byte vector loads where the tensor's address allows); the last, partial block by the last program,
masked. ``_hash_finish`` adds the "+ 1" of every byte, a closed form of ``n`` (``fingerprint_lanes.geometric_sum``)
computed on the device, and writes the four 16-bit parts. No atomics: the same bits give the same digits whatever
the scheduling.

Every intermediate is an exact int64 (below 2**63): a byte is below 2**8 and a power below p < 2**31, so a
product is below 2**39 and ``_MAX_ITERS`` (2**23) of them below 2**62; a product of two residues is below
2**62; ``BLOCK`` (at most 2**20) residues, or the rows of at most 2**31 programs, sum below 2**62.
"""

from __future__ import annotations

import threading
import weakref

import torch
import triton
import triton.language as tl

from .fingerprint_lanes import LANES
from .json_files import EMPTY_FINGERPRINT_ROW, arena_key
from .triton_launch import KernelLaunch
from .triton_stats import FEW_INTS, few_arguments, few_partials, few_pick  # the statistics' ``_partials_few``

_BLOCK = 4096  # bytes a program loads at once (a power of two; tests make it small)
_MAX_PROGRAMS = 1024  # programs of a large tensor: each then hashes several blocks
_ONE_PROGRAM = 16  # blocks a tensor may have and still be hashed by one program
_MAX_ITERS = 1 << 23  # blocks a program hashes at most: its int64 accumulators stay below 2**62
_FINISH_BLOCK = 256  # rows ``_hash_finish`` sums at once
_FEW = 4  # tensors of a ``_hash_few`` launch at most: their addresses passed as arguments
_ARENA_ROWS = 1 << 14  # rows of a new arena (2 int64 each: 256 KiB), more where one tensor needs them
_ARENA_TENSORS = 2048  # tensors of an arena
_META = 3  # a tensor's metadata row: first row, rows, bytes
_WARPS = 8  # 16 bytes a thread for a block of 4096: one vector load
# ``_partials_hash_few`` loads an eighth of a block at once (a word a thread at the statistics' four warps): about the
# registers of ``_partials_few`` alone, so its statistics' programs keep their occupancy; a whole block spilled
# (ptxas's figures for sm_90: docs/benchmarks.md)
_SPLIT = 8
_BITS = 48  # bits of a chunk's start (bytes): tensors below 2**48 bytes
(_P1, _G1), (_P2, _G2) = LANES
_INV1, _INV2 = pow(_G1 - 1, -1, _P1), pow(_G2 - 1, -1, _P2)  # the closed form of the "+ 1" terms divides by g - 1


@triton.jit
def _power(g, p, e, BITS: tl.constexpr):
    """``g**e mod p`` for ``e`` (int64, a scalar or a block) below ``2**BITS``, by square-and-multiply: every
    product is of two residues, below 2**62."""
    r = tl.zeros_like(e) + 1
    base = tl.zeros_like(e) + g
    for _ in tl.static_range(BITS):
        r = tl.where((e & 1) != 0, r * base % p, r)
        base = base * base % p
        e = e >> 1
    return r


@triton.jit
def _parts(out, h1, h2):
    """The four 16-bit parts of the two hashes, as ``checksums.fingerprint_parts`` gives them."""
    tl.store(out + 0, h1 >> 16)
    tl.store(out + 1, h1 & 0xFFFF)
    tl.store(out + 2, h2 >> 16)
    tl.store(out + 3, h2 & 0xFFFF)


@triton.jit
def _hash_chunk(x, n, first, iters, last, P1, G1, P2, G2, BLOCK: tl.constexpr, LOG: tl.constexpr, BITS: tl.constexpr):
    """Both hashes of the chunk of ``x`` (``n`` bytes) from block ``first``: its whole blocks among the ``iters``
    from there, and the tensor's last, partial block where ``last`` (the last program's), each hash weighted by
    ``g**(the chunk's first byte)``."""
    lanes = tl.arange(0, BLOCK)
    start = first * BLOCK  # the chunk's first byte
    whole = n // BLOCK  # the tensor's whole blocks: read without a mask (vector loads where x is aligned)
    count = tl.minimum(whole - first, iters)  # this chunk's: all of them but in the last program
    one = tl.full((), 1, tl.int64)
    # g**BLOCK: the step of G from one block to the next
    step1 = one * G1
    step2 = one * G2
    for _ in tl.static_range(LOG):
        step1 = step1 * step1 % P1
        step2 = step2 * step2 % P2
    acc1 = tl.zeros([BLOCK], tl.int64)
    acc2 = tl.zeros([BLOCK], tl.int64)
    c1 = one  # g**(block offset in the chunk) mod p
    c2 = one
    for i in range(0, count):
        at = tl.multiple_of((first + i) * BLOCK, BLOCK)
        b = tl.load(x + at + lanes).to(tl.int64)
        acc1 += b * c1  # below 2**39 a block, 2**62 over _MAX_ITERS blocks
        acc2 += b * c2
        c1 = c1 * step1 % P1
        c2 = c2 * step2 % P2
    # the last block, where it is partial: the last program's, right after its whole blocks (G = c)
    idx = whole * BLOCK + lanes
    end = tl.where(last, n, 0)  # another program's mask: nothing
    b = tl.load(x + idx, mask=idx < end, other=0).to(tl.int64)  # past the end: no term
    acc1 += b * c1
    acc2 += b * c2
    j = lanes.to(tl.int64)
    h1 = tl.sum(acc1 % P1 * _power(G1, P1, j, LOG) % P1, 0) % P1
    h2 = tl.sum(acc2 % P2 * _power(G2, P2, j, LOG) % P2, 0) % P2
    h1 = h1 * _power(G1, P1, start, BITS) % P1
    h2 = h2 * _power(G2, P2, start, BITS) % P2
    return h1, h2


# no specialisation on a value (an int of 1, a multiple of 16): one compile for any sizes; the addresses' alignment
# stays specialised (16-byte vector loads)
_FEW_INTS = [f"{name}{k}" for name in ("n", "iters", "rows", "row", "index") for k in range(_FEW)]


@triton.jit
def few_hashes(
    pid,
    part,
    meta,
    x0,
    x1,
    x2,
    x3,
    n0,
    n1,
    n2,
    n3,
    iters0,
    iters1,
    iters2,
    iters3,
    rows0,
    rows1,
    rows2,
    rows3,
    row0,
    row1,
    row2,
    row3,
    index0,
    index1,
    index2,
    index3,
    P1: tl.constexpr,
    G1: tl.constexpr,
    P2: tl.constexpr,
    G2: tl.constexpr,
    BLOCK: tl.constexpr,
    LOG: tl.constexpr,
    BITS: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """Program ``pid`` of a ``_hash_few`` launch (and of the hashes' programs of ``_partials_hash_few``). ``BLOCK``:
    the bytes it loads at once, ``_BLOCK / SPLIT``: its chunk (``itersk`` blocks of ``_BLOCK``, as ``plan`` made
    it) read in ``SPLIT`` times as many blocks, which gives the same hashes (a chunk's hash is of its bytes, however
    they are loaded) with a ``SPLIT``-th of the registers."""
    x = x0
    n = n0.to(tl.int64)
    iters = iters0.to(tl.int64)
    rows = rows0.to(tl.int64)
    row = row0.to(tl.int64)
    index = index0.to(tl.int64)
    mine = pid * 0
    first = rows
    unused = mine  # the statistics' repeat, which a hash has not: the bytes are hashed as they are in memory
    x, n, iters, rows, row, index, unused, mine, first = few_pick(
        pid, first, x, n, iters, rows, row, index, unused, mine, x1, n1, iters1, rows1, row1, index1, n1
    )
    x, n, iters, rows, row, index, unused, mine, first = few_pick(
        pid, first, x, n, iters, rows, row, index, unused, mine, x2, n2, iters2, rows2, row2, index2, n2
    )
    x, n, iters, rows, row, index, unused, mine, first = few_pick(
        pid, first, x, n, iters, rows, row, index, unused, mine, x3, n3, iters3, rows3, row3, index3, n3
    )
    local = pid - mine
    h1, h2 = _hash_chunk(
        x, n, local * iters * SPLIT, iters * SPLIT, local == rows - 1, P1, G1, P2, G2, BLOCK, LOG, BITS
    )
    out = part + (row + local) * 2
    tl.store(out + 0, h1)
    tl.store(out + 1, h2)
    if local == 0:
        m = meta + index * 3
        tl.store(m + 0, row)
        tl.store(m + 1, rows)
        tl.store(m + 2, n)


@triton.jit(do_not_specialize=_FEW_INTS)
def _hash_few(
    part,
    meta,
    x0,
    x1,
    x2,
    x3,
    n0,
    n1,
    n2,
    n3,
    iters0,
    iters1,
    iters2,
    iters3,
    rows0,
    rows1,
    rows2,
    rows3,
    row0,
    row1,
    row2,
    row3,
    index0,
    index1,
    index2,
    index3,
    P1: tl.constexpr,
    G1: tl.constexpr,
    P2: tl.constexpr,
    G2: tl.constexpr,
    BLOCK: tl.constexpr,
    LOG: tl.constexpr,
    BITS: tl.constexpr,
):
    """The hashes of one to four tensors' bytes in one launch (``x0`` to ``x3``; an unused one repeats ``x0`` and
    has no programs: its ``rows`` 0). Tensor ``k``'s ``rowsk`` programs follow those of the tensors before it; it
    has ``nk`` bytes, ``itersk`` blocks a program, rows of the arena's ``part`` from ``rowk`` (two numbers each,
    one a hash) and metadata row ``indexk`` (its first row, rows and bytes, for ``_hash_finish``)."""
    few_hashes(
        tl.program_id(0).to(tl.int64),
        part,
        meta,
        x0,
        x1,
        x2,
        x3,
        n0,
        n1,
        n2,
        n3,
        iters0,
        iters1,
        iters2,
        iters3,
        rows0,
        rows1,
        rows2,
        rows3,
        row0,
        row1,
        row2,
        row3,
        index0,
        index1,
        index2,
        index3,
        P1,
        G1,
        P2,
        G2,
        BLOCK,
        LOG,
        BITS,
        1,
    )


# the statistics' ints and tensors unspecialised, as ``_partials_few``'s; the hashes' ints too, not their addresses
_FUSED_INTS = FEW_INTS + ["h" + name for name in _FEW_INTS] + ["stats"]


@triton.jit(do_not_specialize=_FUSED_INTS)
def _partials_hash_few(
    part,
    meta,
    x0,
    x1,
    x2,
    x3,
    n0,
    n1,
    n2,
    n3,
    iters0,
    iters1,
    iters2,
    iters3,
    rows0,
    rows1,
    rows2,
    rows3,
    row0,
    row1,
    row2,
    row3,
    index0,
    index1,
    index2,
    index3,
    repeat0,
    repeat1,
    repeat2,
    repeat3,
    code,
    hpart,
    hmeta,
    hx0,
    hx1,
    hx2,
    hx3,
    hn0,
    hn1,
    hn2,
    hn3,
    hiters0,
    hiters1,
    hiters2,
    hiters3,
    hrows0,
    hrows1,
    hrows2,
    hrows3,
    hrow0,
    hrow1,
    hrow2,
    hrow3,
    hindex0,
    hindex1,
    hindex2,
    hindex3,
    stats,
    BLOCK: tl.constexpr,
    P1: tl.constexpr,
    G1: tl.constexpr,
    P2: tl.constexpr,
    G2: tl.constexpr,
    HBLOCK: tl.constexpr,
    LOG: tl.constexpr,
    BITS: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """A call's records in one launch: its first ``stats`` programs are ``_partials_few``'s over the statistics'
    arguments (the same bits: the same code, the same warps), the rest ``_hash_few``'s over the hashes' (``h``), in
    blocks of ``HBLOCK`` bytes, ``_BLOCK / SPLIT`` (``_SPLIT``: a block of ``_BLOCK`` would spill the hashes'
    accumulators at the statistics' four warps, where ``_hash_few`` takes eight)."""
    pid = tl.program_id(0).to(tl.int64)
    if pid < stats:
        few_partials(
            pid,
            part,
            meta,
            x0,
            x1,
            x2,
            x3,
            n0,
            n1,
            n2,
            n3,
            iters0,
            iters1,
            iters2,
            iters3,
            rows0,
            rows1,
            rows2,
            rows3,
            row0,
            row1,
            row2,
            row3,
            index0,
            index1,
            index2,
            index3,
            repeat0,
            repeat1,
            repeat2,
            repeat3,
            code,
            BLOCK,
        )
    else:
        few_hashes(
            pid - stats,
            hpart,
            hmeta,
            hx0,
            hx1,
            hx2,
            hx3,
            hn0,
            hn1,
            hn2,
            hn3,
            hiters0,
            hiters1,
            hiters2,
            hiters3,
            hrows0,
            hrows1,
            hrows2,
            hrows3,
            hrow0,
            hrow1,
            hrow2,
            hrow3,
            hindex0,
            hindex1,
            hindex2,
            hindex3,
            P1,
            G1,
            P2,
            G2,
            HBLOCK,
            LOG,
            BITS,
            SPLIT,
        )


@triton.jit
def _hash_finish(
    part,
    meta,
    out,
    P1: tl.constexpr,
    G1: tl.constexpr,
    P2: tl.constexpr,
    G2: tl.constexpr,
    INV1: tl.constexpr,
    INV2: tl.constexpr,
    BITS: tl.constexpr,
    RB: tl.constexpr,
):
    """Program ``t``: tensor ``t`` of the arena, its rows summed mod p (each below 2**31: the sum below 2**62), plus
    the "+ 1" terms ``(g**n - 1) / (g - 1) mod p`` of its ``n`` bytes, as the four parts at ``out + 4 t``."""
    t = tl.program_id(0).to(tl.int64)
    m = meta + t * 3
    row0 = tl.load(m + 0)
    rows = tl.load(m + 1)
    n = tl.load(m + 2)
    lanes = tl.arange(0, RB)
    s1 = tl.zeros([RB], tl.int64)
    s2 = tl.zeros([RB], tl.int64)
    for r in range(0, rows, RB):
        at = r + lanes
        mask = at < rows
        s1 += tl.load(part + (row0 + at) * 2, mask=mask, other=0)
        s2 += tl.load(part + (row0 + at) * 2 + 1, mask=mask, other=0)
    ones1 = (_power(G1, P1, n, BITS) + P1 - 1) % P1 * INV1 % P1
    ones2 = (_power(G2, P2, n, BITS) + P2 - 1) % P2 * INV2 % P2
    _parts(out + t * 4, (tl.sum(s1, 0) % P1 + ones1) % P1, (tl.sum(s2, 0) % P2 + ones2) % P2)


# straight to the compiled kernels past each specialisation's first launch (triton_launch). Each launch says
# enable_fp_fusion, although the hashes' arithmetic is integer: Triton 3.9 warns at a kernel's first launch where it is
# not said (the default changes in 3.10), and that warning would be ours in a user's log
# (tests/runtime/test_triton_launch.py)
_HASH_FEW = KernelLaunch(
    globals(),
    "_hash_few",
    ("P1", "G1", "P2", "G2", "BLOCK", "LOG", "BITS"),
    num_warps=_WARPS,
    enable_fp_fusion=False,
)
_HASH_FINISH = KernelLaunch(
    globals(), "_hash_finish", ("P1", "G1", "P2", "G2", "INV1", "INV2", "BITS", "RB"), enable_fp_fusion=False
)
# no fused multiply-add, as the statistics' kernels (a square rounded before it is added, as torch does)
_PARTIALS_HASH_FEW = KernelLaunch(
    globals(),
    "_partials_hash_few",
    ("BLOCK", "P1", "G1", "P2", "G2", "HBLOCK", "LOG", "BITS", "SPLIT"),
    enable_fp_fusion=False,
)


def plan(n):
    """``(iters, programs)`` for ``n`` bytes: blocks a program hashes and programs launched."""
    blocks = -(-n // _BLOCK)
    if blocks <= _ONE_PROGRAM:
        return blocks, 1
    iters = min(max(1, -(-blocks // _MAX_PROGRAMS)), _MAX_ITERS)
    return iters, -(-blocks // iters)


def _arguments(items):
    """``(grid, arguments, constexprs)`` of a ``_hash_few`` launch of one to ``_FEW`` queue items of one arena."""
    arena = items[0][6]
    if len(items) < _FEW:  # the unused places: the first tensor again, with no programs
        items = items + [(items[0][0], 1, 1, 0, 0, 0)] * (_FEW - len(items))
    (x0, n0, i0, g0, r0, k0), (x1, n1, i1, g1, r1, k1) = items[0][:6], items[1][:6]
    (x2, n2, i2, g2, r2, k2), (x3, n3, i3, g3, r3, k3) = items[2][:6], items[3][:6]
    block = _BLOCK
    return (
        g0 + g1 + g2 + g3,
        (arena.part, arena.meta, x0, x1, x2, x3, n0, n1, n2, n3, i0, i1, i2, i3, g0, g1, g2, g3)
        + (r0, r1, r2, r3, k0, k1, k2, k3),
        (_P1, _G1, _P2, _G2, block, block.bit_length() - 1, _BITS),
    )


def _launch(items):
    """``_hash_few`` of one to ``_FEW`` queue items of one arena; what its KernelLaunch returned."""
    return _HASH_FEW(*_arguments(items))


def _launch_fused(stats, items):
    """``_partials_hash_few`` of the statistics' queue items ``stats`` (one to four of one arena and dtype:
    ``triton_stats.few_arguments``) and these queue items (one to four of one arena); what its KernelLaunch returned
    (the compiled kernel, for the native op's direct launches: ``TritonStats._enter``)."""
    programs, arguments, (block,) = few_arguments(stats)
    grid, hashed, _ = _arguments(items)
    half = _BLOCK // _SPLIT
    constants = (block, _P1, _G1, _P2, _G2, half, half.bit_length() - 1, _BITS, _SPLIT)
    return _PARTIALS_HASH_FEW(programs + grid, arguments + hashed + (programs,), constants)


def _version(t):
    """``t``'s version counter; -1 for an inference tensor, which has none."""
    try:
        return t._version
    except RuntimeError:
        return -1


class _Arena:
    """The rows (two hashes each) and metadata rows of the fingerprints of one device, until the flush."""

    __slots__ = ("part", "meta", "rows", "capacity", "room", "slots", "group", "key", "missing", "replaced")

    def __init__(self, device, rows):
        self.part = torch.empty((rows, 2), dtype=torch.int64, device=device)
        self.meta = torch.empty((_ARENA_TENSORS, _META), dtype=torch.int64, device=device)
        self.rows = 0  # rows taken (the native lane reads and writes it too: ``attach``)
        self.capacity = rows
        self.room = _ARENA_TENSORS  # tensors it holds at most
        # a Slot per tensor (the native lane's mark for its records); None once forgotten (its rows never written, or
        # moved)
        self.slots = []
        self.group = None  # the group slot of its parts, once closed (``Fingerprints._close``)
        # what a native Recorder's record names it by (its row's fourth): unique in the process
        self.key = arena_key()
        self.missing = set()  # its tensors whose rows were never written (``Fingerprints._forget``)
        self.replaced = {}  # of those, the ones whose parts the torch ops made (a launch that failed): their slots

    def packed(self):
        """Its numbers as the writing process reads them (records.device_numbers, on the writer thread, once they are
        on the host): ``(the four parts of each tensor as native doubles, b"", the tensors whose parts never came, {a
        tensor: the torch ops' parts (ints), or None})``; None where none came (an arena never closed, a copy that
        failed)."""
        values = self.group.doubles() if self.group is not None else None
        replaced = {}
        for tensor, slot in self.replaced.items():
            parts = slot.values()
            replaced[tensor] = None if parts is None else tuple(int(part) for part in parts)
        if values is None and not replaced:
            return None
        return values or b"", b"", frozenset(self.missing), replaced


class Fingerprints:
    """The fingerprints of device tensors by the kernels, for one ``StatBuffer``: ``add`` gives a tensor's slot of
    four parts (queued within a call, launched at once outside one), ``launch`` launches the queue (the statistics'
    ``TritonStats.end``, as a call's records are made), ``finish`` (at the flush) the group slots of every arena.

    ``calls``: the statistics' per-thread call state (``TritonStats.calls``: its ``depth`` and ``watch``), so that a
    call's tensors of both kinds are read at the same point. ``slot``: ``statistics.Slot``. ``changed``: where the
    names of APIs go whose input, read after the call, had moved (``TritonStats.changed``). ``fallback(t)``: the
    four parts by the torch ops (``checksums.fingerprint_parts``), for the tensors of a launch that failed: their
    digits kept, not nulls. A failure is kept in ``error`` (the StatBuffer turns the kernels off then, and says so)."""

    def __init__(self, calls, slot, changed, fallback):
        self._calls = calls
        self._slot = slot
        self._changed = changed
        self._fallback = fallback
        self.lock = threading.Lock()  # the statistics' direct launch of both queues holds it too (TritonStats)
        self.namespace = globals()  # where ``_partials_hash_few`` is (TritonStats._enter)
        self._arenas = {}  # device index (``get_device``: -1 for the CPU) -> the _Arena filling (the lane reads it)
        # (bytes, n, iters, programs, first row, index, arena, version, watch, slot): the slot None for the lane's
        # items, whose records name their parts by the arena's key and their index (``attach``)
        self._queue = []
        self._done = []  # group slots of arenas closed before the flush (full)
        self._loose = []  # slots of a failed launch, filled by the torch ops
        # the arenas that the native lane's records may name (``attach``), closed since the last ``take_closed``
        self._closed = []
        self._lane_seen = False
        self.error = None

    def add(self, t):
        """The slot of the fingerprint of ``t``: a plain contiguous tensor of at least one element, neither a
        negative nor a conjugate view, detached."""
        raw = t.reshape(-1).view(torch.uint8)  # its memory as bytes: no copy
        n = raw.numel()
        iters, programs = plan(n)
        slot = self._slot(None, 4)
        calls = self._calls
        watch = calls.watch
        # read after its call (``begin(watch)``): its version counter as it is at the call, checked at the launch
        version = _version(raw) if watch is not None else None
        with self.lock:
            arena = self._arena_for(raw, programs)
            self._queue.append((raw, n, iters, programs, arena.rows, len(arena.slots), arena, version, watch, slot))
            arena.rows += programs
            arena.slots.append(slot)
            if not calls.depth:
                self._launch_queue()
        return slot

    @property
    def queued(self):
        """Whether tensors wait in the queue (read without the lock: a hint)."""
        return bool(self._queue)

    def launch(self):
        """Launch what is queued (a call's records are made): each launch's queue items and what its KernelLaunch
        returned (for the native op's direct launches: ``TritonStats._enter_hashes``)."""
        if self._queue:
            with self.lock:
                return self._launch_queue()
        return ()

    def launch_with(self, stats):
        """Launch what is queued together with the statistics' queue items ``stats`` (one to four of one arena and
        dtype, their versions checked: ``TritonStats._launch_queue``), in one ``_partials_hash_few``, where it is
        one to four tensors of one arena: ``(these queue items, what the KernelLaunch returned)``, both launched.
        Else None, and nothing launched (the caller launches ``stats``, then ``launch`` the rest). A failed launch
        raises (the caller forgets ``stats``); these get the torch ops' parts."""
        if not self._queue:
            return None
        with self.lock:
            queue = self._take()
            if not queue or len(queue) > _FEW or any(item[6] is not queue[0][6] for item in queue):
                self._queue[:0] = queue  # launched by ``launch``, as the call ends
                return None
            try:
                kept = _launch_fused(stats, queue)
            except Exception as error:
                self._failed(error, [queue])
                raise
        return queue, kept

    def attach(self, recorder):
        """Let the native op's ``recorder`` (its statistics' lane attached: ``TritonStats.attach``) queue here the
        fingerprint of each record its lane makes, as ``add`` does (summary_mode fingerprint: ``Recorder.checksums``):
        the same queue and arenas, so that a call's tensors stay one launch, which the op then makes itself
        (``Recorder.launch_direct(hashes=True)``)."""
        ref = weakref.ref(self)  # the op holds the callable: no cycle through a native object

        def renew(t, rows):
            hashes = ref()
            if hashes is None:
                raise RuntimeError("the fingerprint kernels' state is gone")
            with hashes.lock:
                return hashes._arena_for(t, rows)

        recorder.lane_fingerprints(
            self._queue,
            self._arenas,
            renew,
            EMPTY_FINGERPRINT_ROW,
            _BLOCK,
            _ONE_PROGRAM,
            _MAX_PROGRAMS,
            _MAX_ITERS,
            self.lock,  # with the statistics' lock, the op launches a backward hook's queues itself
        )
        self._lane_seen = True

    def fail_queue(self, error):
        """A direct launch of the queue with the statistics' (``Recorder.launch_direct``) failed: its tensors get the
        torch ops' parts, and the error is kept (the kernels off from then on)."""
        with self.lock:
            queue = self._queue[:]
            del self._queue[: len(queue)]
            self._failed(error, [queue])

    def _take(self):
        """The queue taken (the lock held), less the tensors read after their call that it changed after all:
        those left null, their API said (``changed``)."""
        queue = self._queue[:]
        del self._queue[: len(queue)]
        kept = []
        for item in queue:
            if item[7] is not None and item[7] != _version(item[0]):  # changed by a call thought to leave it
                self._forget(item)
                self._changed.append(item[8])
            else:
                kept.append(item)
        return kept

    def _launch_queue(self):
        """The queue launched (the lock held): per arena, ``_FEW`` tensors a launch; a failed launch's tensors get
        the torch ops' parts. Returns ``(items, what the KernelLaunch returned)`` of each launch made."""
        groups: dict = {}
        for item in self._take():
            groups.setdefault(id(item[6]), []).append(item)
        pending = [items[k : k + _FEW] for items in groups.values() for k in range(0, len(items), _FEW)]
        launched = []
        while pending:
            try:
                launched.append((pending[0], _launch(pending[0])))
            except Exception as error:
                self._failed(error, pending)
                break
            pending.pop(0)
        return launched

    def _failed(self, error, pending):
        """A launch of the queue items ``pending`` (lists of them) failed: kept in ``error``; their parts by the
        torch ops."""
        if self.error is None:
            self.error = error
        for items in pending:
            for item in items:
                self._by_torch_ops(item)

    def _forget(self, item):
        """A queued tensor whose rows are never written: left out of the finish, its metadata no rows."""
        arena, index = item[6], item[5]
        arena.slots[index] = None
        arena.missing.add(index)
        arena.meta[index].fill_(0)

    def _by_torch_ops(self, item):
        """A queued tensor whose launch failed: its parts by the torch ops (null where they fail too)."""
        self._forget(item)
        slot = item[9]
        if slot is None:  # the native lane's item: its record names the arena, whose parts for it are this slot's
            slot = self._slot(None, 4)
        item[6].replaced[item[5]] = slot  # a native record names the arena: its parts are the slot's
        try:
            slot.pending = self._fallback(item[0])
        except Exception:
            return
        self._loose.append(slot)

    def _arena_for(self, t, rows):
        """The arena filling on ``t``'s device with room for ``rows`` rows and a tensor (the lock held)."""
        key = t.get_device()
        arena = self._arenas.get(key)
        if arena is not None:
            if arena.rows + rows <= arena.capacity and len(arena.slots) < arena.room:
                return arena
            self._done.extend(self._close(arena))
        arena = self._arenas[key] = _Arena(t.device, max(_ARENA_ROWS, rows))
        return arena

    def _close(self, arena):
        """Launch ``_hash_finish`` over ``arena``'s tensors; their group slot (the lock held)."""
        if self._queue:  # the rows it sums launched first
            self._launch_queue()
        count = len(arena.slots)
        values = torch.empty((count, 4), dtype=torch.int64, device=arena.part.device)
        _HASH_FINISH(count, (arena.part, arena.meta, values), (_P1, _G1, _P2, _G2, _INV1, _INV2, _BITS, _FINISH_BLOCK))
        # parts below 2**16: exact as float64, which the flush copies them as (the slot is not ``exact``)
        arena.group = self._slot(values.reshape(-1), 4 * count, arena.slots)
        if self._lane_seen:
            self._closed.append(arena)
        return [arena.group]

    def take_closed(self):
        """The arenas closed since the last call whose records the native lane may have made: their parts, once on
        the host, are what those records' fingerprints are (``_Arena.packed``)."""
        with self.lock:
            closed, self._closed = self._closed, []
        return closed

    def finish(self):
        """The slots of every fingerprint added since the last flush, their parts launched on the device."""
        with self.lock:
            self._launch_queue()
            groups, self._done = self._done, []
            loose, self._loose = self._loose, []
            arenas = list(self._arenas.values())
            self._arenas.clear()
            for arena in arenas:
                if any(slot is not None for slot in arena.slots):
                    groups.extend(self._close(arena))
                elif arena.replaced and self._lane_seen:  # every launch failed: the torch ops' parts alone
                    self._closed.append(arena)
        return groups + loose
