"""The statistics of a device tensor in one read, by a Triton kernel: Max, Min, Sum, sum of squares, NaN and
Inf counts, each element loaded once in its own dtype (no float32 copy of a bfloat16 tensor) and accumulated
in float32 (float64 for a float64 tensor, whose Max and Min must stay exact).

Imported by ``statistics.StatBuffer`` only for a CUDA or ROCm tensor (torch names both ``cuda``), and only
while ``MSPROBE_TRITON`` is on (the default) and Triton imports; elsewhere (the CPU, an NPU, no Triton) the
torch ops of ``statistics`` serve, unchanged. The tests run the kernels on CPU tensors under Triton's
interpreter (``TRITON_INTERPRET=1``: tests/runtime/test_triton_stats.py) against the torch-op path.

Two kernels, no atomics, so the numbers do not depend on scheduling (two identical runs write identical dumps):

- ``_partials``, launched at ``add`` (while the tensor holds the values recorded, as the torch ops read it):
  each program reduces one chunk of one tensor into a row of six float64 partials in the flush's arena, and
  program 0 writes the tensor's row of metadata (its rows, element count, repeat, dtype) beside them, on the
  device, so nothing is copied from the host for the second kernel. A tensor has at most ``_MAX_ROWS`` rows.
- ``_finish``, launched once per arena at the flush (``StatBuffer.take``): one program per tensor combines
  its rows in row order and writes Max, Min, Mean, Norm and the two counts as float64 rows, which reach the
  host as one group slot per arena (the ``members`` mechanism of the staged small tensors).

A plain float8 tensor (e4m3fn, e5m2 and their fnuz kinds: ``StatBuffer._add_low``'s) is read as its bytes and
decoded in the kernel (``_decode``); its slot is Max, Min, Mean and Norm rounded to float32, its counts slot the
NaN, Inf, zero and saturated counts (zero and saturated only where NaN/Inf counts are off), as ``_add_low``'s
torch ops give them; its partial rows are eight wide (the two more counts), in arenas of their own.

Numbers as the native CPU op gives them (``native/stats_op.cpp``): Max and Min exact, NaN when a NaN is
present; Mean and Norm rounded to the tensor's dtype, inf past float32's range; a broadcast (stride-0)
dimension read once and counted ``repeat`` times; a transposed or permuted tensor read in memory order; any
other layout of up to 4 dimensions read through its strides (no copy).

``monitor_figures`` serves msprobe's monitor (runtime/monitor/metrics.py): ``_partials`` with ``ZEROS`` also
counts |x| < eps into a seventh partial, and ``_figures`` turns one tensor's rows into the monitor's float32
figures in the order of its ops, on the device (tests/monitor/test_figures_paths.py).

Several tensors per launch: within ``begin``/``end`` (``StatBuffer.one_launch``, around the records of one call: its
inputs, its output, a module's keyword inputs, output and parameters) the contiguous float32, float16 and bfloat16
tensors are queued with their rows taken, and read by one ``_partials_many`` per arena and dtype when the records
are made, before any user code runs: each program finds its tensor's address and first row in a table of a row per
tensor copied from pinned memory, and reduces the chunk ``_partials`` would, into the same row (the same bits:
tests/runtime/test_triton_stats.py). Other layouts, float64 and float8 keep a launch of their own. The inputs of a
call that leaves them as they are (``call_effects``) are queued by ``begin(watch)`` and ``hold`` and read with its
output, after it, each checked against its version counter at the launch. Not yet: the tensors of a whole flush in
one launch (a tensor must be read at its call; holding it to the flush would keep activations alive). With a
checksum mode, a call's fingerprints (``triton_fingerprint.Fingerprints``, ``fingerprints``) are launched at its
``end`` too, in the same launch as its statistics where those are one ``_partials_few``.

Where the native op builds, its ``Recorder`` makes the records of a call's float32, float16 and bfloat16 tensors
whose elements fill one block of memory (contiguous, permuted, or broadcast once narrowed: read as ``dense_view``
gives them), and of its slices of at most four dimensions (a copy of their values in their own order, the order in
which the Python path's ``_partials`` reads them through their strides), itself and queues them here, in the same
arenas and queue (``attach``: one native call a record, where the Python path made five calls and three objects);
their rows name their arena by its key, whose numbers the writing process is sent (``take_closed``,
records.device_numbers).
"""

from __future__ import annotations

import threading
import weakref

import torch
import triton
import triton.language as tl

from . import triton_launch
from .json_files import arena_key
from .switches import switched_on
from .triton_launch import KNOB_OPTIONS, KernelLaunch, knob_options


_BLOCK = 1024  # elements a program loads at once
_MAX_ROWS = 256  # partial rows of one tensor at most: a larger tensor's programs each read more blocks
_ARENA_ROWS = 1 << 14  # rows of a new arena (6 float64 each: 768 KiB), more where one tensor needs them
_ARENA_TENSORS = 2048  # tensors of an arena
_FINISH_BLOCK = 128  # rows a ``_finish`` program combines at once

# the dtype code ``_finish`` rounds Mean and Norm to; float64 tensors get Max and Min only (statistics'
# KIND_NO_MEAN: a slot of width 2), the others Max, Min, Mean and Norm (width 4); a 0-d tensor its value (1)
_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}
_QUEUED = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # the dtypes a call's batch takes (``add``)
_TENSOR, _PARAMETER, _STRIDED = torch.Tensor, torch.nn.Parameter, torch.strided
_META = 5  # a tensor's metadata row: first partial row, rows, elements, repeat, dtype code
# float8 (statistics' KIND_LOW, a plain tensor: no scale): the format's code for ``_decode``; Mean and Norm
# rounded to float32 (code 0), as ``StatBuffer._add_low`` gives them, and two more partials (zeros, saturated)
_LOW = {}
for _code, _name in enumerate(("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"), 1):
    if hasattr(torch, _name):
        _LOW[getattr(torch, _name)] = _code


_INTS = ["n", "iters", "tensor", "row0", "rows", "repeat", "code", "d1", "d2", "d3", "s0", "s1", "s2", "s3"]


@triton.jit
def _decode(b, LOW: tl.constexpr):
    """The float32 value of float8 bytes ``b`` (uint8) of format ``LOW`` (1 e4m3fn, 2 e5m2, 3 e4m3fnuz, 4
    e5m2fnuz), decoded from the bits: Triton's interpreter reads float8 as if every exponent were a number
    (e4m3fn's NaN as 480, e5m2's Inf as 65536), so the kernels decode it themselves, the same code compiled
    and interpreted (tests/runtime/test_triton_stats.py: every encoding of each format)."""
    if LOW == 1 or LOW == 3:
        M: tl.constexpr = 3
        E: tl.constexpr = 15
    else:
        M: tl.constexpr = 2
        E: tl.constexpr = 31
    if LOW == 1:
        B: tl.constexpr = 7
    elif LOW == 2:
        B: tl.constexpr = 15
    elif LOW == 3:
        B: tl.constexpr = 8
    else:
        B: tl.constexpr = 16
    bits = b.to(tl.int32)
    e = (bits >> M) & E
    m = bits & ((1 << M) - 1)
    mantissa = tl.where(e == 0, m, m + (1 << M)).to(tl.float32)
    power = ((tl.maximum(e, 1) - B - M + 127) << 23).to(tl.int32, bitcast=True)
    v = mantissa * power.to(tl.float32, bitcast=True)  # exact: a power of two times at most 4 bits
    v = tl.where((bits & 128) != 0, -v, v)
    if LOW == 1:
        v = tl.where((bits & 127) == 127, float("nan"), v)
    elif LOW == 2:
        v = tl.where(e == E, tl.where(m == 0, v * float("inf"), float("nan")), v)
    else:  # fnuz: the one NaN is the negative zero's encoding; no Inf
        v = tl.where(bits == 128, float("nan"), v)
    return v


@triton.jit(do_not_specialize=_INTS)  # a value of 1 would be made a constant: one compile per value, no .to
def _partials(
    x,
    n,
    iters,
    part,
    meta,
    tensor,
    row0,
    rows,
    repeat,
    code,
    d1,
    d2,
    d3,
    s0,
    s1,
    s2,
    s3,
    CONTIGUOUS: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK: tl.constexpr,
    LOW: tl.constexpr = 0,
    TOP: tl.constexpr = 0.0,
    ZEROS: tl.constexpr = 0,
    EPS: tl.constexpr = 0.0,
):
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    if WIDE:
        mx = tl.full([BLOCK], float("-inf"), tl.float64)
        mn = tl.full([BLOCK], float("inf"), tl.float64)
        s = tl.zeros([BLOCK], tl.float64)
        q = tl.zeros([BLOCK], tl.float64)
    else:
        mx = tl.full([BLOCK], float("-inf"), tl.float32)
        mn = tl.full([BLOCK], float("inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        q = tl.zeros([BLOCK], tl.float32)
    nan = tl.zeros([BLOCK], tl.int32)
    inf = tl.zeros([BLOCK], tl.int32)
    zero = tl.zeros([BLOCK], tl.int32)
    full = tl.zeros([BLOCK], tl.int32)
    start = pid.to(tl.int64) * iters * BLOCK
    for i in range(0, iters):
        idx = start + i * BLOCK + lanes
        mask = idx < n
        if CONTIGUOUS:
            ptr = x + idx
        else:
            i3 = idx % d3
            rest = idx // d3
            i2 = rest % d2
            rest = rest // d2
            i1 = rest % d1
            i0 = rest // d1
            ptr = x + i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3
        if LOW:
            v = _decode(tl.load(ptr, mask=mask, other=0), LOW)  # x: the float8 tensor's bytes (uint8)
            zero += (mask & (v == 0.0)).to(tl.int32)
            full += (tl.abs(v) == TOP).to(tl.int32)  # 0 where masked
        else:
            v = tl.load(ptr, mask=mask, other=0.0).to(mx.dtype)
            if ZEROS:  # the monitor's |x| < eps count (``monitor_figures``), in the same read
                zero += (mask & (tl.abs(v) < EPS)).to(tl.int32)
        is_nan = v != v
        is_inf = (v == float("inf")) | (v == float("-inf"))
        ok = mask & (v == v)
        mx = tl.where(ok & (v > mx), v, mx)
        mn = tl.where(ok & (v < mn), v, mn)
        s += v  # 0 where masked
        q += v * v  # squared and rounded, then added, as torch does: no fused multiply-add (enable_fp_fusion)
        nan += is_nan.to(tl.int32)
        inf += is_inf.to(tl.int32)
    if LOW:
        out = part + (row0 + pid).to(tl.int64) * 8
        tl.store(out + 6, tl.sum(zero, 0).to(tl.float64))
        tl.store(out + 7, tl.sum(full, 0).to(tl.float64))
    elif ZEROS:
        out = part + (row0 + pid).to(tl.int64) * 7
        tl.store(out + 6, tl.sum(zero, 0).to(tl.float64))
    else:
        out = part + (row0 + pid).to(tl.int64) * 6
    tl.store(out + 0, tl.max(mx, 0).to(tl.float64))
    tl.store(out + 1, tl.min(mn, 0).to(tl.float64))
    tl.store(out + 2, tl.sum(s, 0).to(tl.float64))
    tl.store(out + 3, tl.sum(q, 0).to(tl.float64))
    tl.store(out + 4, tl.sum(nan, 0).to(tl.float64))
    tl.store(out + 5, tl.sum(inf, 0).to(tl.float64))
    if pid == 0:
        m = meta + tensor * 5
        tl.store(m + 0, row0.to(tl.int64))
        tl.store(m + 1, rows.to(tl.int64))
        tl.store(m + 2, n.to(tl.int64))
        tl.store(m + 3, repeat.to(tl.int64))
        tl.store(m + 4, code.to(tl.int64))


@triton.jit
def _dense_chunk(x, n, start, iters, out, BLOCK: tl.constexpr):
    """The six partials of ``iters`` blocks of a contiguous float32, float16 or bfloat16 tensor ``x`` of ``n``
    elements from element ``start`` (a batched program's chunk, as ``_partials`` reduces a dense one), stored at
    ``out``: Max, Min, Sum, sum of squares, NaN and Inf counts, each accumulated in float32."""
    lanes = tl.arange(0, BLOCK)
    mx = tl.full([BLOCK], float("-inf"), tl.float32)
    mn = tl.full([BLOCK], float("inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    q = tl.zeros([BLOCK], tl.float32)
    nan = tl.zeros([BLOCK], tl.int32)
    inf = tl.zeros([BLOCK], tl.int32)
    for i in range(0, iters):
        idx = start + i * BLOCK + lanes
        mask = idx < n
        v = tl.load(x + idx, mask=mask, other=0.0).to(tl.float32)
        is_nan = v != v
        is_inf = (v == float("inf")) | (v == float("-inf"))
        ok = mask & (v == v)
        mx = tl.where(ok & (v > mx), v, mx)
        mn = tl.where(ok & (v < mn), v, mn)
        s += v
        q += v * v  # no fused multiply-add, as ``_partials``
        nan += is_nan.to(tl.int32)
        inf += is_inf.to(tl.int32)
    tl.store(out + 0, tl.max(mx, 0).to(tl.float64))
    tl.store(out + 1, tl.min(mn, 0).to(tl.float64))
    tl.store(out + 2, tl.sum(s, 0).to(tl.float64))
    tl.store(out + 3, tl.sum(q, 0).to(tl.float64))
    tl.store(out + 4, tl.sum(nan, 0).to(tl.float64))
    tl.store(out + 5, tl.sum(inf, 0).to(tl.float64))


_TABLE = 10  # a tensor's row in a batched launch: address, elements, blocks a program reads, its first program, its
# programs (= partial rows), its first partial row, its index in the arena, repeat, dtype code, and one unused
_MANY_MAX = 64  # tensors of one batched launch at most (the table's rows each program looks through)


@triton.jit(do_not_specialize=["count"])
def _partials_many(table, part, meta, count, DT: tl.constexpr, BLOCK: tl.constexpr, T: tl.constexpr):
    """``_partials`` of ``count`` contiguous tensors of one dtype (``DT``: 0 float32, 1 float16, 2 bfloat16) in
    one launch: ``table`` holds a row per tensor (``_TABLE``: its address among them, and its first program);
    each program finds its tensor as the last whose first program it has reached (``T``, a power of two of at
    least ``count``, rows looked at at once), and reduces the chunk ``_partials`` would into the same partial
    row (so the numbers are the same bits). A row per tensor, not per program: the host writes a handful of
    numbers per call, whatever the tensors' sizes."""
    pid = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, T)
    firsts = tl.load(table + k * 10 + 3, mask=k < count, other=1 << 62)
    index = tl.sum((firsts <= pid).to(tl.int32), 0) - 1
    r = table + index.to(tl.int64) * 10
    address = tl.load(r + 0)
    n = tl.load(r + 1)
    iters = tl.load(r + 2)
    local = pid - tl.load(r + 3)
    start = local * iters * BLOCK
    row = tl.load(r + 5) + local
    if DT == 2:
        x = address.to(tl.pointer_type(tl.bfloat16))
    elif DT == 1:
        x = address.to(tl.pointer_type(tl.float16))
    else:
        x = address.to(tl.pointer_type(tl.float32))
    _dense_chunk(x, n, start, iters, part + row * 6, BLOCK)
    if local == 0:
        m = meta + tl.load(r + 6) * 5
        tl.store(m + 0, tl.load(r + 5))
        tl.store(m + 1, tl.load(r + 4))
        tl.store(m + 2, n)
        tl.store(m + 3, tl.load(r + 7))
        tl.store(m + 4, tl.load(r + 8))


_FEW = 4  # tensors of a ``_partials_few`` launch at most: their addresses passed as arguments
# no specialisation on a value (an int of 1, a multiple of 16, an address's alignment): one compile a dtype
FEW_INTS = [f"{name}{k}" for name in ("x", "n", "iters", "rows", "row", "index", "repeat") for k in range(_FEW)]
FEW_INTS.append("code")


@triton.jit
def few_pick(pid, first, x, n, iters, rows, row, index, repeat, mine, xk, nk, itk, rowsk, rowk, indexk, repeatk):
    """Tensor ``k`` of a ``_partials_few`` launch (``xk``: its address, ``nk`` ...) where program ``pid`` is at
    or past its first program ``first``, else the tensor given; and the first program of the tensor after."""
    if pid >= first:
        x = xk
        n = nk.to(tl.int64)
        iters = itk.to(tl.int64)
        rows = rowsk.to(tl.int64)
        row = rowk.to(tl.int64)
        index = indexk.to(tl.int64)
        repeat = repeatk.to(tl.int64)
        mine = first
    return x, n, iters, rows, row, index, repeat, mine, first + rowsk.to(tl.int64)


@triton.jit
def few_partials(
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
    BLOCK: tl.constexpr,
):
    """Program ``pid`` of a ``_partials_few`` launch (and of the statistics' programs of
    ``triton_fingerprint._partials_hash_few``'s, which launches a call's fingerprints with them)."""
    x = x0
    n = n0.to(tl.int64)
    iters = iters0.to(tl.int64)
    rows = rows0.to(tl.int64)
    row = row0.to(tl.int64)
    index = index0.to(tl.int64)
    repeat = repeat0.to(tl.int64)
    mine = pid * 0
    first = rows
    x, n, iters, rows, row, index, repeat, mine, first = few_pick(
        pid, first, x, n, iters, rows, row, index, repeat, mine, x1, n1, iters1, rows1, row1, index1, repeat1
    )
    x, n, iters, rows, row, index, repeat, mine, first = few_pick(
        pid, first, x, n, iters, rows, row, index, repeat, mine, x2, n2, iters2, rows2, row2, index2, repeat2
    )
    x, n, iters, rows, row, index, repeat, mine, first = few_pick(
        pid, first, x, n, iters, rows, row, index, repeat, mine, x3, n3, iters3, rows3, row3, index3, repeat3
    )
    local = pid - mine
    start = local * iters * BLOCK
    _dense_chunk(x, n, start, iters, part + (row + local) * 6, BLOCK)
    if local == 0:
        m = meta + index * 5
        tl.store(m + 0, row)
        tl.store(m + 1, rows)
        tl.store(m + 2, n)
        tl.store(m + 3, repeat)
        tl.store(m + 4, code.to(tl.int64))


@triton.jit(do_not_specialize=FEW_INTS)
def _partials_few(
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
    BLOCK: tl.constexpr,
):
    """``_partials`` of two to four contiguous tensors of one dtype in one launch, their addresses passed as
    arguments (``x0`` to ``x3``; an unused one repeats ``x0`` and has no programs: its ``rows`` 0): no table
    made on the host nor copied to the device. Tensor ``k``'s ``rowsk`` programs follow those of the tensors
    before it; it has ``nk`` elements, ``itersk`` blocks a program, partial rows from ``rowk`` and metadata row
    ``indexk``. Each program reduces the chunk ``_partials`` would into the same partial row: the same bits
    (tests/runtime/test_triton_stats.py)."""
    few_partials(
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
        repeat0,
        repeat1,
        repeat2,
        repeat3,
        code,
        BLOCK,
    )


@triton.jit
def _rounded(x, code):
    """``x`` (float64) rounded to float32, then to the dtype of ``code`` (0 float32, 1 float16, 2 bfloat16, 3
    float64: as it is), as the native op's ``round_to``."""
    f = x.to(tl.float32)
    half = f.to(tl.float16).to(tl.float32)
    brain = f.to(tl.bfloat16).to(tl.float32)
    out = tl.where(code == 1, half, tl.where(code == 2, brain, f)).to(tl.float64)
    return tl.where(code == 3, x, out)


@triton.jit
def _finish(part, meta, values, counts, RB: tl.constexpr, LOW: tl.constexpr = 0):
    t = tl.program_id(0)
    m = meta + t * 5
    row0 = tl.load(m + 0)
    rows = tl.load(m + 1)
    n = tl.load(m + 2)
    repeat = tl.load(m + 3)
    code = tl.load(m + 4)
    lanes = tl.arange(0, RB)
    mx = tl.full([RB], float("-inf"), tl.float64)
    mn = tl.full([RB], float("inf"), tl.float64)
    s = tl.zeros([RB], tl.float64)
    q = tl.zeros([RB], tl.float64)
    nan = tl.zeros([RB], tl.float64)
    inf = tl.zeros([RB], tl.float64)
    zero = tl.zeros([RB], tl.float64)
    full = tl.zeros([RB], tl.float64)
    for r in range(0, rows, RB):
        at = r + lanes
        mask = at < rows
        if LOW:
            p = part + (row0 + at) * 8
            zero += tl.load(p + 6, mask=mask, other=0.0)
            full += tl.load(p + 7, mask=mask, other=0.0)
        else:
            p = part + (row0 + at) * 6
        mx = tl.maximum(mx, tl.load(p + 0, mask=mask, other=float("-inf")))
        mn = tl.minimum(mn, tl.load(p + 1, mask=mask, other=float("inf")))
        s += tl.load(p + 2, mask=mask, other=0.0)
        q += tl.load(p + 3, mask=mask, other=0.0)
        nan += tl.load(p + 4, mask=mask, other=0.0)
        inf += tl.load(p + 5, mask=mask, other=0.0)
    big = 3.4028234663852886e38  # float32's largest: past it a float accumulator is inf, as torch's is
    total = tl.sum(s, 0)
    total = tl.where(total > big, float("inf"), tl.where(total < -big, float("-inf"), total))
    squares = tl.sum(q, 0)
    squares = tl.where(squares > big, float("inf"), squares)
    nans = tl.sum(nan, 0)
    top = tl.max(mx, 0)
    bottom = tl.min(mn, 0)
    not_a_number = float("nan")
    top = tl.where(nans > 0, not_a_number, top)
    bottom = tl.where(nans > 0, not_a_number, bottom)
    out = values + t * 4
    tl.store(out + 0, top)
    tl.store(out + 1, bottom)
    tl.store(out + 2, _rounded(total / n.to(tl.float64), code))
    tl.store(out + 3, _rounded(tl.sqrt(squares * repeat.to(tl.float64)), code))
    if LOW:  # NaN, Inf, zero and saturated counts, as ``_add_low``'s counts slot
        tl.store(counts + t * 4 + 0, nans * repeat.to(tl.float64))
        tl.store(counts + t * 4 + 1, tl.sum(inf, 0) * repeat.to(tl.float64))
        tl.store(counts + t * 4 + 2, tl.sum(zero, 0) * repeat.to(tl.float64))
        tl.store(counts + t * 4 + 3, tl.sum(full, 0) * repeat.to(tl.float64))
    else:
        tl.store(counts + t * 2 + 0, nans * repeat.to(tl.float64))
        tl.store(counts + t * 2 + 1, tl.sum(inf, 0) * repeat.to(tl.float64))


@triton.jit(do_not_specialize=["rows", "n", "repeat", "scalar"])
def _figures(part, rows, n, repeat, scalar, out, K: tl.constexpr, CODES: tl.constexpr, RB: tl.constexpr):
    """One tensor's seven-wide partial rows (``_partials`` with ZEROS) combined in row order into msprobe's
    monitor figures, float32, one per op: op ``k``'s code (runtime/monitor/metrics.py's CODES: 0 min, 1 max,
    2 norm, 3 mean, 4 zeros, 5 nans, 6 id) is ``CODES``'s ``k``-th group of 3 bits."""
    lanes = tl.arange(0, RB)
    mx = tl.full([RB], float("-inf"), tl.float64)
    mn = tl.full([RB], float("inf"), tl.float64)
    s = tl.zeros([RB], tl.float64)
    q = tl.zeros([RB], tl.float64)
    nan = tl.zeros([RB], tl.float64)
    zero = tl.zeros([RB], tl.float64)
    for r in range(0, rows, RB):
        at = r + lanes
        mask = at < rows
        p = part + at * 7
        mx = tl.maximum(mx, tl.load(p + 0, mask=mask, other=float("-inf")))
        mn = tl.minimum(mn, tl.load(p + 1, mask=mask, other=float("inf")))
        s += tl.load(p + 2, mask=mask, other=0.0)
        q += tl.load(p + 3, mask=mask, other=0.0)
        nan += tl.load(p + 4, mask=mask, other=0.0)
        zero += tl.load(p + 6, mask=mask, other=0.0)
    big = 3.4028234663852886e38  # float32's largest: past it a float accumulator is inf, as torch's is
    total = tl.sum(s, 0)
    total = tl.where(total > big, float("inf"), tl.where(total < -big, float("-inf"), total))
    squares = tl.sum(q, 0)
    squares = tl.where(squares > big, float("inf"), squares)
    nans = tl.sum(nan, 0)
    many = repeat.to(tl.float64)
    top = tl.where(nans > 0, float("nan"), tl.max(mx, 0)).to(tl.float32)
    bottom = tl.where(nans > 0, float("nan"), tl.min(mn, 0)).to(tl.float32)
    norm = tl.sqrt(squares * many).to(tl.float32)
    mean = (total / n.to(tl.float64)).to(tl.float32)
    # the torch ops' ``count_nonzero(...) / numel``: both made float32, then divided in float32
    zeros = (tl.sum(zero, 0) * many).to(tl.float32) / (n.to(tl.float64) * many).to(tl.float32)
    value = tl.where(scalar != 0, total, float("nan")).to(tl.float32)  # a 0-d tensor's sum is its value
    for k in tl.static_range(K):
        code = (CODES >> (3 * k)) & 7
        if code == 0:
            tl.store(out + k, bottom)
        elif code == 1:
            tl.store(out + k, top)
        elif code == 2:
            tl.store(out + k, norm)
        elif code == 3:
            tl.store(out + k, mean)
        elif code == 4:
            tl.store(out + k, zeros)
        elif code == 5:
            tl.store(out + k, (nans * many).to(tl.float32))
        else:
            tl.store(out + k, value)


_MONITOR_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_bounds: dict = {}  # (eps, dtype) -> eps rounded to the dtype, as a float
_scratch: dict = {}  # device -> the metadata row ``_partials`` writes and the monitor does not read


def monitor_figures(t, codes, eps, dense_view):
    """msprobe's monitor ops ``codes`` (runtime/monitor/metrics.py's CODES) of a plain strided float32, float16
    or bfloat16 tensor, in one read of it: a float32 tensor of one figure per code, on its device, nothing read
    back; None for any other tensor (the torch ops serve it). ``dense_view`` is ``statistics.dense_view``.
    Two launches: ``_partials`` with the |x| < eps count, then ``_figures``."""
    if type(t) is not torch.Tensor or t.layout is not torch.strided or t.dtype not in _MONITOR_DTYPES:
        return None
    if t.numel() == 0 or len(codes) > 8:
        return None
    scalar = t.dim() == 0
    if t.is_neg():
        t = t.resolve_neg()
    t, repeat = dense_view(t)
    contiguous = t.is_contiguous()
    if not contiguous and t.dim() > 4:
        return None
    bound = _bounds.get((eps, t.dtype))
    if bound is None:
        # torch's ``x.abs() < eps`` compares in the tensor's dtype: eps rounded to it (a CPU scalar: no sync)
        bound = _bounds[(eps, t.dtype)] = float(torch.tensor(float(eps), dtype=torch.float32).to(t.dtype))
    n = t.numel()
    iters = max(1, -(-n // (_BLOCK * _MAX_ROWS)))
    grid = -(-n // (_BLOCK * iters))
    sizes, strides = [1] * 4, [0] * 4
    if not contiguous:
        sizes[4 - t.dim() :] = t.shape
        strides[4 - t.dim() :] = t.stride()
    meta = _scratch.get(t.device)
    if meta is None:
        meta = _scratch[t.device] = torch.empty((1, _META), dtype=torch.int64, device=t.device)
    part = torch.empty((grid, 7), dtype=torch.float64, device=t.device)
    _partials[(grid,)](
        t,
        n,
        iters,
        part,
        meta,
        0,
        0,
        grid,
        repeat,
        _CODES[t.dtype],
        sizes[1],
        sizes[2],
        sizes[3],
        *strides,
        CONTIGUOUS=contiguous,
        WIDE=False,
        BLOCK=_BLOCK,
        ZEROS=1,
        EPS=bound,
        enable_fp_fusion=False,
    )
    out = torch.empty(len(codes), dtype=torch.float32, device=t.device)
    packed = 0
    for k, code in enumerate(codes):
        packed |= code << (3 * k)
    _figures[(1,)](
        part, grid, n, repeat, int(scalar), out, K=len(codes), CODES=packed, RB=_FINISH_BLOCK, enable_fp_fusion=False
    )
    return out


def _forget(pending):
    """The queued tensors of ``pending`` (lists of queue items) whose rows a failed launch never wrote: their
    slots are left out of the finish (null statistics), and their metadata says no rows, so ``_finish`` reads
    none."""
    for items in pending:
        for item in items:
            arena, tensor = item[8], item[5]
            arena.slots[tensor] = arena.counts[tensor] = None
            arena.missing.add(tensor)
            arena.meta[tensor].fill_(0)
            arena.meta[tensor, 2].fill_(1)


def _version(t):
    """``t``'s version counter; -1 for an inference tensor, which has none (and which nothing outside inference
    mode may change in place; the collector reads no input after its call inside it)."""
    try:
        return t._version
    except RuntimeError:
        return -1


# the kernels' launches, straight to the compiled kernel past each specialisation's first (triton_launch): Triton's
# own dispatch was the largest host cost of a call's records on a GPU (bench/triton_dispatch.py)
_PARTIALS = KernelLaunch(globals(), "_partials", ("CONTIGUOUS", "WIDE", "BLOCK", "LOW", "TOP"), enable_fp_fusion=False)
_PARTIALS_FEW = KernelLaunch(globals(), "_partials_few", ("BLOCK",), enable_fp_fusion=False)
_PARTIALS_MANY = KernelLaunch(globals(), "_partials_many", ("DT", "BLOCK", "T"), enable_fp_fusion=False)
_FINISH = KernelLaunch(globals(), "_finish", ("RB", "LOW"), enable_fp_fusion=False)
_DENSE = ((1, 1, 1, 1), (0, 0, 0, 0))  # a dense tensor's sizes and strides: not read by the kernel


def _launch_one(t, n, iters, grid, row0, tensor, repeat, code, arena, layout=_DENSE, dense=True, low=0, top=0.0):
    """One tensor's ``_partials`` launch into ``arena`` (its rows from ``row0``, its metadata row ``tensor``): a
    dense one's, or another layout's, ``layout`` the sizes and strides of its last four dimensions."""
    sizes, strides = layout
    return _PARTIALS(
        grid,
        (t, n, iters, arena.part, arena.meta, tensor, row0, grid, repeat, code, sizes[1], sizes[2], sizes[3], *strides),
        (dense, code == 3, _BLOCK, low, top),
    )


def few_arguments(items):
    """``(grid, arguments, constexprs)`` of a ``_partials_few`` launch of one to ``_FEW`` queue items of one arena
    and dtype (``TritonStats._queue``'s; ``triton_fingerprint`` launches them with a call's fingerprints)."""
    arena, code = items[0][8], items[0][7]
    if len(items) < _FEW:  # the unused places: the first tensor again, with no programs
        t = items[0][0]
        items = items + [(t, 1, 1, 0, 0, 0, 1)] * (_FEW - len(items))
    (x0, n0, i0, g0, r0, k0, p0), (x1, n1, i1, g1, r1, k1, p1) = items[0][:7], items[1][:7]
    (x2, n2, i2, g2, r2, k2, p2), (x3, n3, i3, g3, r3, k3, p3) = items[2][:7], items[3][:7]
    return (
        g0 + g1 + g2 + g3,
        (arena.part, arena.meta, x0, x1, x2, x3, n0, n1, n2, n3, i0, i1, i2, i3, g0, g1, g2, g3)
        + (r0, r1, r2, r3, k0, k1, k2, k3, p0, p1, p2, p3, code),
        (_BLOCK,),
    )


def _launch(items):
    """The partials of queue items of one arena and dtype (``TritonStats._launch_queue``), at most ``_MANY_MAX``.
    What the kernel's ``KernelLaunch`` returned, for one to ``_FEW`` tensors (``TritonStats._enter``)."""
    arena, code = items[0][8], items[0][7]
    count = len(items)
    if count == 1:  # one tensor: its own launch, no table to copy
        t, n, iters, grid, row0, tensor, repeat = items[0][:7]
        return _launch_one(t, n, iters, grid, row0, tensor, repeat, code, arena)
    if count <= _FEW:  # their addresses as arguments: no table to make and copy
        return _PARTIALS_FEW(*few_arguments(items))
    table, first = [], 0
    for t, n, iters, grid, row0, tensor, repeat, *_rest in items:
        table.append((t.data_ptr(), n, iters, first, grid, row0, tensor, repeat, code, 0))
        first += grid
    rows = torch.tensor(table, dtype=torch.int64)
    device = arena.part.device
    if device.type != "cpu":
        rows = rows.pin_memory().to(device, non_blocking=True)
    _PARTIALS_MANY(first, (rows, arena.part, arena.meta, count), (code, _BLOCK, max(4, 1 << (count - 1).bit_length())))
    return None


class _CallState(threading.local):
    """Per thread: the depth of the calls whose records are being made (``begin``), the API whose inputs
    are being queued to be read after it (``begin(watch)``), the call whose outputs are being queued
    (``begin(carry=...)``), and whether this thread's last call left its outputs for the next launch."""

    depth = 0
    watch = None
    carry = None
    carried = False


# MSPROBE_CARRY_OUTPUTS=1: a call's output records, queued, wait for the next call's launch (``TritonStats.end``): one
# launch for two calls. At most this many queued tensors, and bytes, wait: a waiting output is held for one call
# longer, which the next call's use of it mostly does anyway; the bytes bound what it can add to the peak.
_CARRY_ITEMS = 2
_CARRY_BYTES = 256 << 20
_ITEM_BYTES = (4, 2, 2)  # by the queue item's dtype code: float32, float16, bfloat16


class _Arena:
    """The partial rows and metadata of the tensors of one device and slot width, until the flush."""

    __slots__ = ("part", "meta", "rows", "capacity", "room", "slots", "counts", "groups", "key", "missing")

    def __init__(self, device, rows, columns):
        self.part = torch.empty((rows, columns), dtype=torch.float64, device=device)
        self.meta = torch.empty((_ARENA_TENSORS, _META), dtype=torch.int64, device=device)
        self.rows = 0  # rows taken (the native lane reads and writes these three too: TritonStats.attach)
        self.capacity = rows
        self.room = _ARENA_TENSORS  # tensors it holds at most
        self.slots = []  # a Slot per tensor; the lane's mark for a native Recorder's record; None once forgotten
        self.counts = []
        self.groups = None  # the group slots of its numbers, once closed (``TritonStats._close``)
        # what a native Recorder's record names it by (its row ``(mark, key, tensor)``): unique in the process, so
        # that the writing process finds its numbers by it (json_files.native_json)
        self.key = arena_key()
        self.missing = set()  # its tensors whose rows a failed launch never wrote (``_forget``): null statistics

    def packed(self):
        """Its numbers as the writing process reads them (records.device_numbers, on the writer thread, once they
        are on the host): ``(Max, Min, Mean, Norm of each tensor as native doubles, its NaN and Inf counts the same
        or empty, the tensors whose numbers never came)``; None where none came (an arena never closed, a copy that
        failed)."""
        groups = self.groups
        if groups is None:
            return None
        values = groups[0].doubles()
        counts = groups[1].doubles() if len(groups) > 1 else b""
        if values is None or counts is None:
            return None
        return values, counts, frozenset(self.missing)


class TritonStats:
    """``StatBuffer``'s kernels: ``add`` launches a tensor's partials and gives its slots, ``finish`` (at the
    flush) launches the combining kernel of every arena and gives their group slots. ``slot(pending, width,
    members=None)`` makes a slot and ``dense_view(t)`` gives ``(t, repeat)`` (``statistics.Slot`` and
    ``statistics.dense_view``: passed in, so that this module imports nothing of the runtime)."""

    def __init__(self, nan_inf_count, slot, dense_view):
        self.nan_inf_count = nan_inf_count
        self._slot = slot
        self._dense_view = dense_view
        self._lock = threading.Lock()
        self._arenas = {}  # (device, width) -> the _Arena filling
        self._done = []  # group slots of arenas closed before the flush (full)
        # the arenas that records of the native lane may name (``attach``), closed since the last ``take_closed``:
        # the writer sends their numbers to the writing process (records.device_numbers)
        self._closed = []
        self._lane_seen = False  # a lane was attached: its arenas, of width 4 and no float8, are kept in ``_closed``
        # the tensors of one call (``begin``/``end``): contiguous float32/16 and bfloat16 ones, their rows taken,
        # read by one ``_partials_many`` per arena and dtype when the call's records are made
        self._local = _CallState()
        self._queue = []
        # API names whose input, read after the call (``begin(watch)``, ``hold``), had moved by the launch: their
        # statistics left null (call_effects); the collector takes them (``Collector._inputs_changed``)
        self.changed = []
        self._watched = None  # the API of the last ``begin(watch)``: the native lane's items carry no name
        self._watching = False  # a ``begin(watch)`` since the last launch: versions to check (``_launch_queue``)
        # the native op's Recorder, whose lane queues a call's device tensors into ``_queue`` (``attach``)
        self._recorder = None
        # the compiled kernels the Recorder launches a queue to directly (``_enter``; the op reads it: changed in place)
        self._fast = {}
        self._direct = False  # the Recorder launches from ``_fast`` (``attach``)
        # a call's outputs may wait for the next call's launch (``end``); off for good once one changed meanwhile
        self.carrying = switched_on("MSPROBE_CARRY_OUTPUTS", "0")
        # the fingerprints of a checksum mode (triton_fingerprint.Fingerprints, set by the StatBuffer), whose queue
        # of a call's tensors ``end`` launches too
        self.fingerprints = None

    @property
    def calls(self):
        """The per-thread state of the calls whose records are being made (``begin``): their depth and watch."""
        return self._local

    def add(self, t, width):
        """``(slot, counts slot or None)`` of a plain strided tensor of float32, float16 or bfloat16 (``width``
        4: Max, Min, Mean, Norm), of float64 (2: Max and Min), or a 0-d one of these (1: its value); None for
        any other (the torch ops serve it). A plain float8 tensor (``width`` 4, any dimension: ``_add_low``'s
        slot) gets Max, Min, Mean, Norm of its values and a counts slot of NaN, Inf, zero and saturated counts
        (zero and saturated only, where NaN/Inf counts are off).

        ``t`` may be a ``torch.nn.Parameter`` or a tensor that requires grad, not detached (``StatBuffer.add``'s
        fast path): the common case (contiguous float32, float16 or bfloat16 within ``begin``/``end``) only
        queues it, and the kernel reads its memory, which is the detached tensor's, and its version counter is
        the detached one's too; every view made of it (``resolve_neg``, ``dense_view``, float8's bytes) is made of
        a detached tensor, so that no autograd node is recorded."""
        cls = type(t)
        if cls is not _TENSOR and cls is not _PARAMETER:
            return None
        local = self._local
        if local.depth and (width == 4 or width == 1):
            code = _QUEUED.get(t.dtype)
            # a call's contiguous tensor: queued, read by one launch when its records are made (``end``); the
            # checks of the general path below, in the order that decides the common case soonest
            if code is not None and t.layout is _STRIDED and t.is_contiguous() and not t.is_neg():
                n = t.numel()
                if n == 0:
                    return None
                return self._queued(t, n, width, code, local.watch)
        t = t.detach()  # the views below (resolve_neg, dense_view, float8's bytes) record no autograd node
        low = _LOW.get(t.dtype, 0)
        code = 0 if low else _CODES.get(t.dtype)
        if code is None or t.layout is not torch.strided:
            return None
        if width != 1 and width != (2 if code == 3 else 4) or low and width != 4:
            return None
        if not low and t.is_neg():
            t = t.resolve_neg()
        t, repeat = self._dense_view(t)
        top = float(torch.finfo(t.dtype).max) if low else 0.0  # the saturated magnitude
        if low:
            t = t.view(torch.uint8)  # its bytes, decoded in the kernel (_decode): no copy
        contiguous = t.is_contiguous()
        if not contiguous and t.dim() > 4:
            return None
        n = t.numel()
        if n == 0:
            return None
        iters = max(1, -(-n // (_BLOCK * _MAX_ROWS)))
        grid = -(-n // (_BLOCK * iters))
        sizes, strides = [1] * 4, [0] * 4
        if not contiguous:
            sizes[4 - t.dim() :] = t.shape
            strides[4 - t.dim() :] = t.stride()
        slot = self._slot(None, width)
        if low:
            counts = self._slot(None, 4 if self.nan_inf_count else 2)
        else:
            counts = self._slot(None, 2) if self.nan_inf_count else None
        with self._lock:
            arena = self._arena_for((t.get_device(), width, low != 0), t.device, grid, 8 if low else 6)
            row0, tensor = arena.rows, len(arena.slots)
            local = self._local
            if contiguous and not low and code != 3 and local.depth:
                # a tensor read after its call (begin's watch) keeps its version counter as it was at the call
                watch = local.watch
                version = _version(t) if watch is not None else None
                self._queue.append((t, n, iters, grid, row0, tensor, repeat, code, arena, version, watch))
                arena.rows += grid
                arena.slots.append(slot)
                arena.counts.append(counts)
                return slot, counts
            _launch_one(t, n, iters, grid, row0, tensor, repeat, code, arena, (sizes, strides), contiguous, low, top)
            arena.rows += grid
            arena.slots.append(slot)
            arena.counts.append(counts)
        return slot, counts

    def _queued(self, t, n, width, code, watch):
        """``add`` of a contiguous float32, float16 or bfloat16 tensor of ``n`` elements inside a call: its
        slots, its rows taken, queued for ``end``'s launch.

        ``t`` is queued as given, not detached (a detach allocates a tensor a record): no op runs on it, so no
        autograd node is recorded; the kernel reads its memory by address, the memory a detached alias would
        have; and a detached alias shares its version counter, so ``_launch_queue``'s check is the same. The
        queue holds it until ``end`` of the same call's records only (tests/runtime/test_triton_stats.py: a
        Parameter and a tensor that requires grad, the bits of their detached selves)."""
        if n <= _BLOCK * _MAX_ROWS:
            iters, grid = 1, -(-n // _BLOCK)
        else:
            iters = -(-n // (_BLOCK * _MAX_ROWS))
            grid = -(-n // (_BLOCK * iters))
        slot = self._slot(None, width)
        counts = self._slot(None, 2) if self.nan_inf_count else None
        version = None
        if watch is not None:  # read after its call: its version counter as it is at the call (``_launch_queue``)
            try:
                version = t._version
            except RuntimeError:  # an inference tensor (``_version``)
                version = -1
        with self._lock:
            arena = self._arena_for((t.get_device(), width, False), t.device, grid)
            self._queue.append((t, n, iters, grid, arena.rows, len(arena.slots), 1, code, arena, version, watch))
            arena.rows += grid
            arena.slots.append(slot)
            arena.counts.append(counts)
        return slot, counts

    def attach(self, recorder, mark, cpu=False):
        """Let the native op's ``recorder`` make the records of a call's float32, float16 and bfloat16 device
        tensors whose elements lie in one block of memory, or a copy of a slice's (CPU ones too with ``cpu``: tests),
        and queue them here, as ``_queued`` does, in the same arenas (``_arenas``, read by the op; ``_lane_arena``
        where one is full), each record's row ``(mark, arena's key, tensor)`` (json_files.native_json): one native
        call per record, where the Python path made five calls and three objects.
        The gradients of its backward hooks too, launched as each hook ends (``_lane_launch``)."""
        # the op holds these callables; through a weak reference, so that it and this object make no cycle, which
        # the garbage collector could not break (a native object is not traversed): both are freed with the collector
        ref = weakref.ref(self)

        def renew(t, rows):
            stats = ref()
            if stats is None:
                raise RuntimeError("the Triton kernels' state is gone")
            return stats._lane_arena(t, rows)

        def launch():
            stats = ref()
            if stats is not None:
                stats._lane_launch()

        recorder.lane(self._queue, self._arenas, renew, launch, mark, cpu, _BLOCK, _MAX_ROWS, self._local)
        self._recorder = recorder
        self._lane_seen = True
        if triton_launch.direct_on() and hasattr(recorder, "lane_direct"):  # an older op's source has none
            recorder.lane_direct(
                self._fast, triton_launch.driver, triton_launch.knobs.runtime, KNOB_OPTIONS, lock=self._lock
            )
            self._direct = True

    @property
    def lane_attached(self):
        """Whether the native op's lane makes records here (``attach``, not ``detach``ed since)."""
        return self._recorder is not None

    def detach(self):
        """The lane given up (a launch failed): the native Recorder leaves device tensors to the Python path."""
        self._fast.clear()
        self._direct = False
        recorder, self._recorder = self._recorder, None
        if recorder is not None:
            recorder.lane_off()

    def _lane_launch(self):
        """Launch what the native lane queued in a backward hook (``attach``): no call's ``end`` follows a hook.
        A failure goes to ``failed`` (the StatBuffer's: the torch ops from then on); its tensors' numbers null."""
        hashes = self.fingerprints  # its fingerprints' too (summary_mode fingerprint), in one launch where they fit
        try:
            with self._lock:
                self._launch_queue(hashes)
        except Exception as error:
            self.detach()
            self.failed(error)
        finally:
            if hashes is not None:  # those not launched with the statistics (never raises)
                hashes.launch()

    def failed(self, error):
        """A launch outside any call failed (``_lane_launch``); the StatBuffer sets what follows."""

    def _lane_arena(self, t, rows):
        """The arena for the native lane on ``t``'s device with room for ``rows`` rows and a tensor (the op found
        the one filling full; another thread may have made room meanwhile)."""
        with self._lock:
            return self._arena_for((t.get_device(), 4, False), t.device, rows)

    def _arena_for(self, key, device, rows, columns=6):
        """The arena filling under ``key`` (device index, slot width, float8) with room for ``rows`` rows and a
        tensor: the one there, or a fresh one, the full one closed first (the lock held)."""
        arena = self._arenas.get(key)
        if arena is not None:
            if arena.rows + rows <= arena.capacity and len(arena.slots) < arena.room:
                return arena
            self._done.extend(self._close(arena, key[1], key[2]))
        arena = self._arenas[key] = _Arena(device, max(_ARENA_ROWS, rows), columns)
        return arena

    def begin(self, watch=None, carry=None):
        """The records of one call begin: its contiguous tensors are read together at ``end``, by the time the
        call's records are made, before any user code runs (so with the values they had at the call).
        ``watch`` (an API name): these are the inputs of a call that leaves them as they are (call_effects),
        closed by ``hold``: they wait for the call's output and are read with it, in one launch, and each
        keeps its version counter, so that one the call changed after all is left null, not read.
        ``carry`` (the call's name): these are its outputs, which may wait for the next call's launch
        (``carrying``, ``end``)."""
        local = self._local
        local.depth += 1
        if watch is not None:
            local.watch = self._watched = watch
            self._watching = True
        if carry is not None and self.carrying:
            local.carry = carry

    def hold(self):
        """Close what ``begin(watch)`` opened without launching it: the next ``end`` (the call's output's, or
        any record's, or the flush) launches it."""
        local = self._local
        local.watch = None
        local.depth -= 1

    def end(self):
        """The records of the call ``begin`` opened are made: launch what it queued (nested: the outermost)."""
        local = self._local
        depth = local.depth = local.depth - 1
        if depth == 0:
            local.watch = None
            hashes = self.fingerprints
            carry = local.carry
            if carry is not None:
                local.carry = None
                if not local.carried and hashes is None and self._carried(carry):
                    local.carried = True
                    return
            local.carried = False
            try:
                if self._queue:
                    with self._lock:
                        self._launch_queue(hashes)  # with the call's fingerprints, in one launch where they fit
                elif hashes is not None and self._fast and hashes.queued:
                    with self._lock:  # a call of integer tensors only: its fingerprints alone, straight from the op
                        self._launch_hashes(hashes)
            finally:
                if hashes is not None:  # those not launched with the statistics (never raises: a failed launch's
                    launched = hashes.launch()  # fingerprints are the torch ops')
                    if launched:
                        self._enter_hashes(launched)

    def _carried(self, name):
        """Whether the queue, the outputs of call ``name`` now, waits for the next call's launch: one to
        ``_CARRY_ITEMS`` tensors of ``_CARRY_BYTES`` at most, each with its version counter. Each is marked as
        waiting (its last field), so that one changed before the launch is left null and said (``changed``)."""
        with self._lock:
            queue = self._queue
            if not 0 < len(queue) <= _CARRY_ITEMS:
                return False
            size = 0
            for item in queue:
                if len(item) != 11 or item[9] is None or item[10] is not None or not 0 <= item[7] <= 2:
                    return False
                size += item[1] * _ITEM_BYTES[item[7]]
            if size > _CARRY_BYTES:
                return False
            mark = ("outputs", name)
            queue[:] = [item[:10] + (mark,) for item in queue]  # in place: the native lane appends to this list
            self._watching = True  # their versions checked at the launch (``_launch_queue``; the op checks them)
        return True

    def _launch_queue(self, hashes=None):
        """The queued tensors launched (the lock held), without waiting: per arena and dtype, one alone by
        ``_partials``, two to ``_FEW`` by ``_partials_few`` (their addresses as arguments; up to twice that in two
        such launches where a waiting call's tensors are among them, as the native op's ``launch_direct``), more by
        ``_partials_many`` (a table of a row per tensor made on the host and copied to the device from pinned
        memory), ``_MANY_MAX`` at a time. ``hashes`` (``triton_fingerprint.Fingerprints``, at a call's ``end``):
        its queued fingerprints are launched with the first group of one to ``_FEW`` tensors, where they fit one
        launch (``Fingerprints.launch_with``): a call's records in one launch."""
        if not self._queue:  # launched already (an arena closed meanwhile launches what its tensors queued)
            return
        if self._fast:  # the native op launches it straight to the compiled kernel entered for it (``_enter``)
            try:
                if hashes is None:
                    launched = self._recorder.launch_direct()
                else:  # with the call's fingerprints where they fit, as ``launch_with`` below (its lock held too)
                    with hashes.lock:
                        launched = self._recorder.launch_direct(hashes=True)
            except Exception as error:  # the launch failed: the queue's numbers null, as below; the hashes the
                queue = self._queue[:]  # torch ops'
                del self._queue[: len(queue)]
                _forget([queue])
                if hashes is not None:
                    hashes.fail_queue(error)
                raise
            if launched:
                self._watching = False
                return
        # the list itself stays: the native lane appends to it (``attach``); what it holds now is taken
        queue = self._queue[:]
        del self._queue[: len(queue)]
        if self._watching:  # inputs read after their call are here: each checked against its version counter
            self._watching = False
            kept, moved = [], []
            for item in queue:
                (kept if item[9] is None or item[9] == _version(item[0]) else moved).append(item)
            if moved:  # changed by a call thought to leave it alone: null, never the values after the call
                _forget([moved])
                self.changed.extend(item[10] or self._watched for item in moved)
                queue = kept
                if not queue:
                    return
        first = queue[0]
        arena, code = first[8], first[7]
        for item in queue:
            if item[8] is not arena or item[7] != code:  # several arenas or dtypes: a group each
                groups: dict = {}
                for item in queue:
                    groups.setdefault((id(item[8]), item[7]), []).append(item)
                pending = list(groups.values())
                break
        else:
            pending = [queue]
        while pending:
            items = pending[0]
            if len(items) > _MANY_MAX:  # the rest in launches of their own
                pending[0:1] = [items[:_MANY_MAX], items[_MANY_MAX:]]
                items = pending[0]
            elif _FEW < len(items) <= 2 * _FEW and any(type(item[10]) is tuple for item in items):
                # five to eight with a waiting call's (``_carried``): launches of four, no table (as the op's)
                pending[0:1] = [items[:_FEW], items[_FEW:]]
                items = pending[0]
            fuse = hashes is not None and len(items) <= _FEW
            try:
                fused = hashes.launch_with(items) if fuse else None
                kept = _launch(items) if fused is None else None
            except Exception:
                _forget(pending)
                raise
            if fuse:
                hashes = None  # tried once: what it did not take, ``end`` launches on its own
            if self._recorder is not None and len(items) <= _FEW:
                if kept is not None:
                    self._enter(items, kept)
                elif fused is not None and fused[1] is not None:
                    self._enter(items, fused[1], fused[0])
            pending.pop(0)

    def _launch_hashes(self, hashes):
        """The fingerprints' queue launched alone by the native op (``Recorder.launch_direct``: one ``_hash_few`` of
        one to ``_FEW`` tensors of one arena), the lock held: a call whose statistics' queue is empty. Where the op
        does not serve it, nothing is done (``end`` launches it by ``hashes.launch``); a failed launch's tensors get
        the torch ops' parts, and it raises, as a direct launch with the statistics does."""
        try:
            with hashes.lock:
                self._recorder.launch_direct(hashes=True)
        except Exception as error:
            hashes.fail_queue(error)
            raise

    def _enter_hashes(self, launched):
        """Enter for the native op's ``launch_direct`` the compiled ``_hash_few`` of each launch that
        ``Fingerprints.launch`` made (``launched``: its queue items and what the KernelLaunch returned), so that the
        op launches the next such queue itself (``_launch_hashes``)."""
        if self._recorder is None or not self._direct:
            return
        for items, kept in launched:
            if kept is not None and len(items) <= _FEW:
                self._enter([], kept, items)

    def _enter(self, items, kept, hashed=None):
        """Enter for the native op's ``launch_direct`` (``attach``) the compiled kernel that ``_launch`` launched
        ``items`` to (``kept``, from its KernelLaunch), under the key by which the op looks up a queue like it (its
        ``direct_key``: the one rule of both): where that kernel's Triton key is the dtypes and alignments only, so
        that this key is as fine. ``hashed``: the fingerprints' queue items launched with them
        (``Fingerprints.launch_with``: ``kept`` is then its ``_partials_hash_few``'s)."""
        _, tail, plain, (callee, head, packed) = kept
        if not plain or not self._direct:
            return
        if hashed is None:
            key = self._recorder.direct_key(items)
        elif hasattr(self._recorder, "lane_fingerprints"):
            key = self._recorder.direct_key(items, hashed)
        else:  # an older op's source: no fused launch of its own
            return
        if key is None:  # not a launch the op makes (tests/runtime/test_triton_launch.py counts those it does)
            return
        if key[0] == 5:
            namespace, name = self.fingerprints.namespace, "_partials_hash_few"
        elif key[0] == 6:
            namespace, name = self.fingerprints.namespace, "_hash_few"
        else:
            namespace, name = globals(), "_partials" if key[0] == 1 else "_partials_few"
        self._fast[key] = (
            callee,
            head,
            packed,
            tail,
            knob_options(),
            namespace,
            name,
            namespace[name],
        )

    def _close(self, arena, width, low):
        """Launch ``_finish`` over ``arena``'s tensors; their group slots (the lock held)."""
        if self._queue:  # the partials it combines launched first
            self._launch_queue()
        count = len(arena.slots)
        device = arena.part.device
        values = torch.empty((count, 4), dtype=torch.float64, device=device)
        totals = torch.empty((count, 4 if low else 2), dtype=torch.float64, device=device)
        _FINISH(count, (arena.part, arena.meta, values, totals), (_FINISH_BLOCK, int(low)))
        kept = values if width == 4 else values[:, :width]
        groups = [self._slot(kept.reshape(-1), width * count, arena.slots)]
        if low and not self.nan_inf_count:  # float8's zero and saturated counts only, as ``_add_low``'s
            groups.append(self._slot(totals[:, 2:].reshape(-1), 2 * count, arena.counts))
        elif self.nan_inf_count:
            groups.append(self._slot(totals.reshape(-1), totals.shape[1] * count, arena.counts))
        arena.groups = groups
        if self._lane_seen and width == 4 and not low:
            self._closed.append(arena)
        return groups

    def take_closed(self):
        """The arenas closed since the last call whose records the native lane may have made: their numbers, once
        on the host, are what those records name (``_Arena.packed``)."""
        with self._lock:
            closed, self._closed = self._closed, []
        return closed

    def finish(self):
        """The group slots of every tensor added since the last flush, their numbers launched on the device."""
        with self._lock:
            groups, self._done = self._done, []
            # emptied in place: the native lane holds this dict (``attach``)
            arenas = dict(self._arenas)
            self._arenas.clear()
            for (_, width, low), arena in arenas.items():
                if arena.slots:
                    groups.extend(self._close(arena, width, low))
        return groups
