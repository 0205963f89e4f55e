"""The fingerprint (``checksums``: ``summary_mode`` fingerprint) of a device tensor in one read of its bytes, by
a Triton kernel: both lanes' hashes ``sum((b[k] + 1) * g**k) mod p`` from one load of each byte, as uint8 from
the tensor's own memory, with no int64 copy of it and no temporary of its size (the torch ops of
``checksums.fingerprint_parts`` widen the bytes to int64, 8 bytes a byte, and read them once per lane).

Imported by ``statistics.StatBuffer.fused_fingerprint`` only where the Triton statistics serve (a CUDA or ROCm
tensor while ``MSPROBE_TRITON`` is on and Triton imports; a CPU tensor of a ``StatBuffer(triton_cpu=True)``,
for the tests under ``TRITON_INTERPRET=1``: tests/runtime/test_triton_fingerprint.py); elsewhere the torch
ops of ``checksums`` serve, with the same 16 hex digits for the same bits.

``_hash``: program ``i`` hashes its chunk of ``iters`` blocks of ``BLOCK`` bytes relative to the chunk's start:
lane ``j`` of a block accumulates ``b * G``, ``G = g**(block offset) mod p`` a scalar updated once a block; the
lanes are weighted by ``g**j`` at the end and the chunk's sum by ``g**(chunk start)`` (square-and-multiply in
the kernel). Whole blocks are loaded without a mask (16-byte vector loads where the tensor's address allows);
the last, partial block by the last program, masked. The "+ 1" of every byte is a closed form of ``n``
(``fingerprint_lanes.geometric_sum``, a host int), added at the end. A tensor of at most ``_ONE_PROGRAM`` blocks is one
program, which writes the four 16-bit parts itself: one launch. A larger one writes one partial per program
and lane, and ``_hash_finish`` (one program) sums them mod p: two launches. No atomics: the same bits give
the same digits whatever the scheduling.

Every intermediate is an exact int64 (below 2**63): a byte is below 2**8 and a power below p < 2**31, so a
product is below 2**39 and ``_MAX_ITERS`` (2**23) of them below 2**62; a product of two residues is below
2**62; ``BLOCK`` (at most 2**20) residues, or the partials of at most 2**31 programs, sum below 2**62.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fingerprint_lanes import LANES, geometric_sum
from .triton_launch import KernelLaunch

_BLOCK = 4096  # bytes a program loads at once (a power of two; tests make it small)
_MAX_PROGRAMS = 1024  # programs of a large tensor: each then hashes several blocks
_ONE_PROGRAM = 16  # blocks a tensor may have and still be hashed by one program: one launch, no partials
_MAX_ITERS = 1 << 23  # blocks a program hashes at most: its int64 accumulators stay below 2**62
_FINISH_BLOCK = 256  # partials ``_hash_finish`` sums at once
_WARPS = 8  # 16 bytes a thread for a block of 4096: one vector load
_BITS = 48  # bits of a chunk's start (bytes): tensors below 2**48 bytes
(_P1, _G1), (_P2, _G2) = LANES


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


@triton.jit(do_not_specialize=["n", "iters", "programs", "ones1", "ones2"])  # a 1 would be a compile of its own
def _hash(
    x,
    n,
    iters,
    programs,
    part,
    out,
    ones1,
    ones2,
    P1: tl.constexpr,
    G1: tl.constexpr,
    P2: tl.constexpr,
    G2: tl.constexpr,
    BLOCK: tl.constexpr,
    LOG: tl.constexpr,
    BITS: tl.constexpr,
    SINGLE: tl.constexpr,
):
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    first = pid.to(tl.int64) * iters  # the chunk's first block
    start = first * BLOCK  # and byte
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
    end = tl.where(pid == programs - 1, n, 0)  # another program's mask: nothing
    b = tl.load(x + idx, mask=idx < end, other=0).to(tl.int64)  # past the end: no term
    acc1 += b * c1
    acc2 += b * c2
    j = lanes.to(tl.int64)
    h1 = tl.sum(acc1 % P1 * _power(G1, P1, j, LOG) % P1, 0) % P1
    h2 = tl.sum(acc2 % P2 * _power(G2, P2, j, LOG) % P2, 0) % P2
    h1 = h1 * _power(G1, P1, start, BITS) % P1
    h2 = h2 * _power(G2, P2, start, BITS) % P2
    if SINGLE:
        _parts(out, (h1 + ones1) % P1, (h2 + ones2) % P2)
    else:
        tl.store(part + pid * 2, h1)
        tl.store(part + pid * 2 + 1, h2)


@triton.jit(do_not_specialize=["programs", "ones1", "ones2"])
def _hash_finish(part, programs, out, ones1, ones2, P1: tl.constexpr, P2: tl.constexpr, RB: tl.constexpr):
    """The partials of ``programs`` programs summed mod p (each below 2**31: the sum below 2**62), plus the "+ 1"
    terms, as the four parts."""
    lanes = tl.arange(0, RB)
    s1 = tl.zeros([RB], tl.int64)
    s2 = tl.zeros([RB], tl.int64)
    for r in range(0, programs, RB):
        at = r + lanes
        mask = at < programs
        s1 += tl.load(part + at * 2, mask=mask, other=0)
        s2 += tl.load(part + at * 2 + 1, mask=mask, other=0)
    _parts(out, (tl.sum(s1, 0) % P1 + ones1) % P1, (tl.sum(s2, 0) % P2 + ones2) % P2)


# straight to the compiled kernels past each specialisation's first launch (triton_launch)
_HASH = KernelLaunch(globals(), "_hash", ("P1", "G1", "P2", "G2", "BLOCK", "LOG", "BITS", "SINGLE"), num_warps=_WARPS)
_HASH_FINISH = KernelLaunch(globals(), "_hash_finish", ("P1", "P2", "RB"))


def plan(n):
    """``(iters, programs)`` for ``n`` bytes: blocks a program hashes and programs launched."""
    blocks = -(-n // _BLOCK)
    if blocks <= _ONE_PROGRAM:
        return blocks, 1
    iters = min(max(1, -(-blocks // _MAX_PROGRAMS)), _MAX_ITERS)
    return iters, -(-blocks // iters)


def fingerprint_parts(t):
    """The fingerprint of the contiguous plain tensor ``t`` (at least one element; not a negative or conjugate
    view) as a tensor of four int64 values below 2**16 on its device, launched, not read: one ``_hash``,
    and one ``_hash_finish`` where the tensor takes more than one program."""
    raw = t.reshape(-1).view(torch.uint8)  # its memory as bytes: no copy
    n = raw.numel()
    iters, programs = plan(n)
    ones1, ones2 = geometric_sum(_G1, n, _P1), geometric_sum(_G2, n, _P2)
    single = programs == 1
    buffer = torch.empty(4 if single else 4 + 2 * programs, dtype=torch.int64, device=raw.device)
    out = buffer[:4]
    part = buffer if single else buffer[4:]
    block = _BLOCK
    _HASH(
        programs,
        (raw, n, iters, programs, part, out, ones1, ones2),
        (_P1, _G1, _P2, _G2, block, block.bit_length() - 1, _BITS, single),
    )
    if not single:
        _HASH_FINISH(1, (part, programs, out, ones1, ones2), (_P1, _P2, _FINISH_BLOCK))
    return out
