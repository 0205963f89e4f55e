"""Per-tensor statistics computed where the tensor lives, with no host sync.

``add`` launches the reductions for one tensor on its device and returns a ``Slot``: a floating tensor's are
seven ops (``aminmax`` in its own dtype, a float32 ``sum`` and Norm, two counts), each writing by ``out=`` into
its row of the flush's buffers (``_Rows``), whose Mean and rounding the writer thread finishes on the host;
another dtype's are stacked into a small tensor of their own. A small tensor is copied into a staging row
instead and reduced with the others of its size at the flush. A float32, float16 or bfloat16 CPU tensor is
read once by the native op of ``native_stats`` (every statistic and both counts in one pass), whose numbers
are ready when ``add`` returns, so its slots never wait for a flush; the torch ops above are the fallback
where the op cannot be built, and serve every other dtype and device. Nothing is read back on the training
thread: ``take`` concatenates every pending slot of a device into one device buffer (a cast and a concatenation per
dtype, then one more concatenation) and starts one non-blocking copy to the host; the writer thread waits on
the copy's event and reads the numbers. A slot learns its batch and offset at ``take`` time. A float8 tensor
(``KIND_LOW``) is never staged: read once by the native op's ``stats_low`` (CPU) or the Triton kernels (a plain
one on a device), else reduced from its values upcast to float32 a chunk at a time, and its counts slot also
holds its zero and saturated counts (docs/low-precision.md). The float8
data of a scaled tensor class (torchao's Float8TrainingTensor, Transformer Engine's Float8Tensor) comes as a
``float8_view`` that knows its scale: its statistics are those of the dequantized values, its fractions those of
the float8 data, and its slot one or two numbers longer, the dequantization factor (``fp8_scale``).
"""

from __future__ import annotations

import os
import threading
import weakref

# the mark of a native record whose row is ``(mark, arena's key, tensor)``: a device tensor's numbers, in a Triton
# arena (``TritonStats.attach``) until the flush; the writing process finds them by the key (json_files.native_json)
from .json_files import DEVICE_ROW, INTEGER_ROW
from .integer_lane import IntegerLane

# Kinds decide msprobe's null rules at write time.
KIND_FLOAT = 0  # Max, Min, Mean, Norm
KIND_NO_MEAN = 1  # float64 and integer tensors: Max and Min only (msprobe leaves Mean and Norm null)
KIND_BOOL = 2  # Max = any, Min = all
KIND_SCALAR = 3  # 0-d: all four equal to the value
KIND_EMPTY = 4  # no slot at all: every statistic null
KIND_LOW = 5  # float8 and float4: Max, Min, Mean, Norm of the values decoded, plus the zero and saturated

_WIDTH = {KIND_FLOAT: 4, KIND_NO_MEAN: 2, KIND_BOOL: 2, KIND_SCALAR: 1}

# The low-precision formats (KIND_LOW), by name, as a dtype missing from an older torch is simply not there
# (docs/low-precision.md). float8_e8m0fnu holds exponents only (MX scales: no zero, no sign): its values are
# decoded to float64, since 2**127 squared is past float32. float4_e2m1fn_x2 packs two values in a byte that no
# torch op unpacks (no copy kernel on the CPU): its bytes are decoded through a table of the 16 codes.
_LOW_NAMES = (
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
)
_FLOAT4_CODES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # E2M1
_LOW_CHUNK = 1 << 20  # elements upcast to float32 at a time: a 4 MiB temporary, not a float32 copy per tensor
_dtype_sets: list = []


def low_precision_dtypes():
    """``(float8 and float4 dtypes of this torch, those of them a scaled tensor class holds as its data)``:
    the second are the float8 formats of torchao's and TE's training tensors (not the MX scales, nor float4)."""
    if not _dtype_sets:
        import torch

        low = frozenset(getattr(torch, name) for name in _LOW_NAMES if hasattr(torch, name))
        _dtype_sets.append(low)
        _dtype_sets.append(frozenset(dtype for dtype in low if str(dtype)[6:] in _LOW_NAMES[:4]))
    return _dtype_sets[0], _dtype_sets[1]


# id(view) -> (weak reference to the view, scale tensor, whether the values are data / scale, not data * scale):
# the float8 views made by ``float8_view``, each forgotten when its view dies. Keyed by the view the runtime
# made, so nothing is ever read of a tensor it did not make.
_SCALED: dict = {}


def float8_view(data, scale, divide):
    """A new tensor over ``data``'s float8 elements (no copy; the runtime's own object) whose statistics are of
    ``data / scale`` (``divide``) or ``data * scale``: the values of a scaled float8 tensor class."""
    view = data.detach()
    key = id(view)
    _SCALED[key] = (weakref.ref(view, lambda _ref, key=key: _SCALED.pop(key, None)), scale, divide)
    return view


def float8_scaling(t):
    """``(scale, divide)`` of a view made by ``float8_view``; None for any other tensor (by identity only)."""
    entry = _SCALED.get(id(t)) if _SCALED else None
    if entry is None or entry[0]() is not t:
        return None
    return entry[1], entry[2]


def has_counts(kind, dtype, enabled):
    """Whether a tensor of this kind carries NaN/Inf counts (floating tensors only, when enabled)."""
    return enabled and kind != KIND_EMPTY and kind != KIND_BOOL and dtype.is_floating_point


_DTYPE_KINDS: dict = {}  # dtype -> the kind of its tensors of at least one dimension and one element


def _dtype_kind(dtype):
    import torch

    if dtype is torch.bool:
        return KIND_BOOL
    if dtype.itemsize == 1 and dtype.is_floating_point and dtype in low_precision_dtypes()[0]:
        return KIND_LOW
    if dtype.is_complex:
        return KIND_EMPTY
    if dtype.is_floating_point and dtype is not torch.float64:
        return KIND_FLOAT
    return KIND_NO_MEAN


def tensor_kind(t):
    """The null-rule kind of ``t``; metadata only, so no sync. The dtype's part is decided once per dtype."""
    if t.numel() == 0:
        return KIND_EMPTY
    dtype = t.dtype
    kind = _DTYPE_KINDS.get(dtype)
    if kind is None:
        kind = _DTYPE_KINDS[dtype] = _dtype_kind(dtype)
    if kind == KIND_FLOAT or kind == KIND_NO_MEAN or kind == KIND_EMPTY:  # bool, float8 and float4: 0-d ones too
        if t.dim() == 0:
            return KIND_SCALAR  # a complex 0-d tensor too, as before
    return kind


class Batch:
    """A copy on its way to the host, its event, and (once ``read`` on the writer thread) what it holds: one
    flush of one device (the numbers of its slots), or one tensor's bytes (checksums.HostCopy)."""

    __slots__ = ("host", "event", "read", "_flat", "_lock", "_doubles")

    def __init__(self, host, event, read=None):
        self.host = host
        self.event = event
        self.read = read or host_rows
        self._flat = None
        self._lock = threading.Lock()
        self._doubles = None  # a float64 copy's memory, as it came (``doubles``)

    def values(self):
        with self._lock:
            self._land()
            if self._flat is None and self._doubles is not None:
                self._flat = _unpack_doubles(self._doubles)
            return self._flat

    def doubles(self, offset, width):
        """The numbers at ``offset`` to ``offset + width`` packed as native doubles, the bytes of the copy as they came
        where it is a float64 one: the writing process unpacks them (records.device_numbers), so no float object is
        made here."""
        with self._lock:
            self._land()
            if self._doubles is None:
                return _pack_doubles(self._flat[offset : offset + width])
            return self._doubles[8 * offset : 8 * (offset + width)]

    def _land(self):
        """Wait for the copy and read it (the lock held): a float64 copy read as numbers by ``host_rows`` kept as its
        bytes, made numbers only where ``values`` asks."""
        if self.host is None:
            return
        import torch

        wait_event(self.event)
        if self.read is host_rows and self.host.dtype is torch.float64:
            self._doubles = host_bytes(self.host)
        else:
            self._flat = self.read(self.host)
        self.host = self.event = None


class Slot:
    """Where the numbers of one tensor's statistics will be: pending on the device, then in a Batch. A group
    slot (small tensors reduced together) hands its batch and offsets on to its ``members``. The native op's ``seal``
    may untrack one with its record (``records.TensorRecord``): what is assigned to it later (a Batch of numbers, a
    tensor) must not refer back to it."""

    __slots__ = ("pending", "batch", "offset", "width", "members", "exact")

    def __init__(self, pending, width, members=None, exact=False):
        self.pending = pending
        self.batch = None
        self.offset = 0
        self.width = width
        self.members = members
        self.exact = exact  # int64 numbers (a Max, a Min, a value), read as they are: not through float64

    def values(self):
        """The numbers (writer thread only); None if the slot was never flushed."""
        batch = self.batch
        if batch is None:
            return None
        flat = batch.values()
        return flat[self.offset : self.offset + self.width]

    def doubles(self):
        """The numbers packed as native doubles (``Batch.doubles``; writer thread only); None if never flushed."""
        batch = self.batch
        return None if batch is None else batch.doubles(self.offset, self.width)


def slot_values(slot):
    """The numbers of a record's statistics (writer thread only): a ``Slot``'s once flushed (None before),
    or the list itself where the native op computed them on the host at record time."""
    return slot if type(slot) is list else slot.values()


class _Stage:
    """Small tensors of one device, dtype and size, copied into the rows of one buffer as they are recorded
    and reduced row by row at the flush: four ops per group instead of six per tensor, where the per-op cost,
    not the data, is what small tensors pay for."""

    __slots__ = ("buffer", "rows", "views", "slots", "counts")

    def __init__(self, buffer):
        self.buffer = buffer
        self.rows = 0
        self.views = buffer.unbind(0)
        self.slots = []
        self.counts = []


_STAGE_MAX_NUMEL = 4096  # larger tensors are reduced in place: their passes cost more than the ops' overhead
_STAGE_MAX_BYTES = 64 << 20
_STAGE_FIRST_ROWS = 32


LATER = object()  # an item the native Recorder left for the caller to describe (StatBuffer.native_recorder)


_TENSOR = _PARAMETER = None  # torch.Tensor and torch.nn.Parameter, set by the first StatBuffer (no torch import here)
_grad_enabled = _set_grad_enabled = None  # torch's grad mode, read and set (``_gradless``), set with them
_forward_ad = None  # torch.autograd.forward_ad: whether a dual level is open (``StatBuffer.add``), set with them


def _gradless(fn, *args):
    """``fn(*args)`` with gradients off, so that a tensor that requires grad is read with no autograd node recorded
    and no detached alias made; grad mode is as it was after, whatever ``fn`` raised."""
    if not _grad_enabled():
        return fn(*args)
    _set_grad_enabled(False)
    try:
        return fn(*args)
    finally:
        _set_grad_enabled(True)


class StatBuffer:
    """Pending slots of the current step, handed over as one device buffer per device at each flush."""

    def __init__(self, nan_inf_count=True, native=None, triton_cpu=False):
        global _TENSOR, _PARAMETER, _grad_enabled, _set_grad_enabled, _forward_ad
        import torch
        import torch.autograd.forward_ad

        _TENSOR, _PARAMETER = torch.Tensor, torch.nn.Parameter
        _grad_enabled, _set_grad_enabled = torch.is_grad_enabled, torch._C._set_grad_enabled
        _forward_ad = torch.autograd.forward_ad
        self.nan_inf_count = nan_inf_count
        # the Triton kernels of ``triton_stats`` for device tensors: None until the first one asks, False where
        # they do not serve; ``triton_cpu`` gives them CPU tensors too (tests, under TRITON_INTERPRET=1)
        self._fused = None
        self._fused_devices = ("cuda", "cpu") if triton_cpu else ("cuda",)
        # the fingerprint kernel (``triton_fingerprint``) serves these devices' tensors: where the statistics
        # kernels do, until it fails once
        self._fingerprint_devices = self._fused_devices
        self._fingerprints = None  # their triton_fingerprint.Fingerprints, made by the first fingerprint asked
        # the fused op, built or loaded here (the first start() of a run), so one run uses one path throughout
        if native is None:
            from . import native_stats

            native = native_stats.load()
        self._native = native or None  # native=False: the torch ops only
        # ``add``'s device fast path takes CPU tensors too (tests), where no native op would serve them first;
        # ``triton_cpu="lane"`` (tests, bench/per_entry.py's triton-stub) gives them to the native op's lane too
        self._fused_cpu = bool(triton_cpu and self._native is None or triton_cpu == "lane")
        self._recorder = None  # the native op's Recorder (``native_recorder``)
        self._recorder_fingerprints = False  # its records have fingerprints (``native_recorder(fingerprints=True)``)
        self._native_types = ()
        if self._native is not None:
            import torch

            # plain tensors only (the op also refuses any tensor whose data is not its own memory)
            self._native_types = frozenset((torch.Tensor, torch.nn.Parameter))
        # float8's one pass (_add_low); None where the op has none (a build of an older source is never loaded:
        # its cache key hashes the source)
        self._native_low = getattr(self._native, "stats_low", None)
        self._lock = threading.Lock()
        self._pending = []
        self._stages = {}  # (device, dtype, shape) -> [_Stage], the last one filling
        # rows each device key's stages held at the last flush: its next step's first stage has as many (``_stage``)
        self._stage_sizes = {}
        self._staged_bytes = 0
        self._rows = {}  # device -> [_Rows], the last one filling: the torch ops' reductions of larger tensors
        self._rows_off = False  # set when a reduction into rows failed: the stacked ops from then on
        # the Triton arenas that the native lane's records name, closed by the flushes since ``closed_arenas``
        self._closed = []
        self._integers = None  # the lane's integer records' arenas (integer_lane), once the lane is attached

    def native(self, t):
        """``(kind, row)`` of ``t`` computed by the native op in one pass, or None where it does not serve (no
        op, another type, device or dtype, no readable data, no elements): ``row`` is Max, Min, Mean, Norm,
        then the NaN and Inf counts when they are on. The op checks device, dtype and layout
        itself, so the caller need not read any attribute first: for a tensor it serves, the kind is decided
        here from its dimension alone (float16, bfloat16, float32). For ``add``: a record that also writes a
        tensor file or a checksum; every other record of such a tensor is the native ``Recorder``'s."""
        if type(t) not in self._native_types:
            return None
        try:
            values = self._native.stats(t, self.nan_inf_count)
        except Exception:  # a layout it could not copy: the torch ops serve (or say why)
            return None
        if not values:
            return None
        return (KIND_SCALAR if t.dim() == 0 else KIND_FLOAT), values

    def native_recorder(self, below, keep, fingerprints=False):
        """The native op's ``Recorder``, or None where there is no op. ``recorder.records(values)`` gives the
        records of a tuple or list of values as ``(list, todo)``: plain tensors it serves, None and exact
        builtins; each other item is ``LATER`` in the list, and ``todo`` counts them. A tensor of ``below``
        elements or more is looked for among the last ``keep`` it read, as ``Collector._reuse`` does;
        ``recorder.clear()`` forgets them. See ``native/stats_op.cpp``.

        ``fingerprints`` (summary_mode fingerprint): a record has its tensor's fingerprint too, so the Recorder
        makes only those of its lane onto the Triton kernels, the fingerprint queued with the statistics
        (``fused_fingerprint`` attaches it: ``Fingerprints.attach``), and leaves every other to the Python path;
        None where the op's source has no such lane."""
        if self._native is None:
            return None
        recorder = self._native.Recorder(self.nan_inf_count, below, keep, LATER)
        if fingerprints:
            if not hasattr(recorder, "lane_fingerprints"):
                return None
            recorder.checksums()
            self._recorder_fingerprints = True
        self._recorder = recorder  # its lane serves the Triton kernels' device tensors (``_attach``)
        if self._fused is None and self._fused_cpu:  # CPU tensors are the lane's (tests): no device tensor asks first
            self._kernels()  # made with the lane attached
        elif self._fused:
            self._attach(self._fused)
        return recorder

    def add(self, t, kind):
        """Launch the statistics of ``t``; returns ``(slot, count_slot or None)``: ``Slot`` objects that a
        flush fills, or lists of numbers where the native op computed them already."""
        fused = self._fused
        if fused and self._fused_devices and (kind == KIND_FLOAT or kind == KIND_SCALAR):
            # the device path's common case first, before the native op declines it: a plain tensor on a device
            # the kernels serve, not detached (``TritonStats.add`` detaches what it makes views of)
            cls = type(t)
            if (cls is _TENSOR or cls is _PARAMETER) and (t.is_cuda or self._fused_cpu and t.is_cpu):
                done = self._fused_add(t, kind)
                if done is not None:
                    return done
        if kind == KIND_FLOAT or kind == KIND_SCALAR:
            done = self.native(t)
            if done is not None:  # the row split into the slot's numbers and the count slot's (lists)
                row = done[1]
                return (row[:1] if done[0] == KIND_SCALAR else row[:4]), (row[4:6] if len(row) > 4 else None)
        import torch

        if kind == KIND_LOW:
            return self._add_low(t.detach(), float8_scaling(t))
        if kind == KIND_FLOAT and not self._on_fused_device(t):
            # the torch ops' common case (an NPU's tensors): a contiguous one read as it is, with gradients off, not
            # by a detached alias (a dispatch the host pays for: on an NPU several µs); a small one copied into its
            # stage without a flat view of it too (``_stage``): one op where the general path below made three. Not
            # within a forward-AD dual level: gradients off leave forward AD on, and a dual tensor's copy would give
            # the stage a tangent (a detached alias has none)
            cls = type(t)
            if (
                (cls is _TENSOR or cls is _PARAMETER)
                and t.is_contiguous()
                and getattr(_forward_ad, "_current_level", -1) < 0
            ):
                done = self._stage_or_rows(t, 1)
                if done is not None:
                    return done
        t = t.detach()
        if type(t) is torch.Tensor and t.device.type in self._fused_devices:
            fused = self._fused_add(t, kind)
            if fused is not None:
                return fused
        repeat = 1
        if not t.is_contiguous():
            # first, so that a view of a tensor's elements (a transpose) is reduced as that tensor is, the same
            # ops in the same order: its statistics served again for the view are the bits it would get read
            # afresh (tests/runtime/test_statistics_reuse.py)
            t, repeat = dense_view(t)
        if kind == KIND_FLOAT and type(t) is torch.Tensor:  # not a subclass: a DTensor cannot be copied into a stage
            done = self._stage_or_rows(t, repeat)
            if done is not None:
                return done
        if kind == KIND_FLOAT:
            if t.dtype is torch.float32 and t.is_contiguous():
                flat = t.reshape(-1)
                norm = torch.dot(flat, flat).sqrt()  # BLAS: one fast pass; same value to float32 rounding
            else:
                norm = torch.linalg.vector_norm(t)
            if repeat != 1:
                norm = norm * (repeat**0.5)
            values = torch.stack((t.amax(), t.amin(), t.mean(), norm))
        elif kind == KIND_NO_MEAN:
            values = torch.stack((t.amax(), t.amin()))
        elif kind == KIND_BOOL:
            values = torch.stack((t.any(), t.all()))
        else:  # KIND_SCALAR
            values = t.reshape(1).clone()  # a copy: the user may change the tensor in place before the flush
        slot = Slot(values, _WIDTH[kind], exact=values.dtype is torch.int64)
        counts = None
        if self.nan_inf_count and kind != KIND_BOOL and t.dtype.is_floating_point:
            counts = torch.stack((torch.isnan(t).sum(), torch.isinf(t).sum()))
            counts = Slot(counts * repeat if repeat != 1 else counts, 2)
        with self._lock:
            self._pending.append(slot)
            if counts is not None:
                self._pending.append(counts)
        return slot, counts

    def one_launch(self):
        """A context for the records of one call: the Triton kernels read its contiguous tensors in one launch
        per dtype as it exits, before any user code runs (``TritonStats.begin``); a shared no-op where they do
        not serve. The collector's hot paths open it by hand instead (``_fused``, ``fused.begin()``, then
        ``end_call``): no call at all on the CPU path."""
        fused = self._fused
        return _Batching(self, fused) if fused else _NO_BATCH

    def end_call(self, fused):
        """Close what ``fused.begin()`` opened: launch the tensors it queued."""
        try:
            fused.end()
        except Exception as error:  # the slots it queued stay unfilled: null statistics, the records kept
            self._fused_devices = ()
            fused.detach()
            _fused_failed(error)

    def _add_rows(self, t, repeat):
        """A float tensor's statistics by the torch ops, each written into its place in a buffer of the flush
        (``_Rows``) by its ``out=``: Max and Min by one ``aminmax`` in the tensor's dtype, the Sum and the Norm
        by ``sum`` and ``linalg.vector_norm`` with float32 accumulation and output (``dtype=torch.float32``: on
        CUDA a bfloat16 or float16 tensor is read in its own dtype, no float32 copy of it), the NaN and Inf
        counts by ``isnan``/``isinf`` and a sum each: seven ops a tensor, no stack, no division, no cast. Mean
        (Sum / elements) and the rounding of Mean and Norm to the tensor's dtype are done for the whole flush on
        the host, by the writer thread (``_Rows.finish``): the numbers the stacked ops gave, within the
        rounding of the dtype (tests/runtime/test_native_stats.py compares them with the native op's). None
        where a backend lacks an op. Not in inference mode (``_stage_or_rows``, its caller, checks)."""
        with self._lock:  # launched under the lock, so that a flush never takes rows still being written
            arenas = self._rows.setdefault(t.device, [])
            arena = arenas[-1] if arenas else None
            if arena is None or arena.count == arena.capacity:
                arena = _Rows(t.device, self.nan_inf_count, 2 * arena.capacity if arena else _ROWS_FIRST)
                arenas.append(arena)
            try:
                return arena.add(t, repeat)
            except Exception as error:  # an op this backend lacks: the stacked ops serve from now on
                import logging

                self._rows_off = True
                logging.getLogger("msprobe_runtime").debug("msprobe_runtime: no statistics rows (%s)", error)
                return None

    def _stage_or_rows(self, t, repeat):
        """The slots of a plain float tensor (``t``, or a dense view of one, read ``repeat`` times) in the torch ops'
        buffers of the flush: its stage where it is small, contiguous, read once and not an inference tensor, else its
        rows; None where neither serves (inference mode: a buffer made in it could not be written outside it; the
        staging memory used up and the rows off, MPS): the stacked ops then. Both read ``t`` with gradients off
        (``_gradless``): it may require grad. Inference mode is checked here once, for both."""
        import torch

        if torch.is_inference_mode_enabled():
            return None
        if repeat == 1 and t.numel() <= _STAGE_MAX_NUMEL and t.is_contiguous() and not t.is_inference():
            staged = self._stage(t)
            if staged is not None:
                return staged
        if self._rows_off or t.is_mps:
            return None
        return _gradless(self._add_rows, t, repeat)

    def _on_fused_device(self, t):
        """Whether ``t`` lives where the Triton kernels may serve it (``_fused_add``): CUDA (and ROCm), the CPU for
        tests; none once they failed, or where they are not made (``MSPROBE_TRITON=0``, no Triton: ``_fused`` False;
        None, not asked yet, may still make them)."""
        devices = self._fused_devices
        return self._fused is not False and bool(devices) and (t.is_cuda or "cpu" in devices and t.is_cpu)

    def _fused_add(self, t, kind):
        """``add`` by the Triton kernels (``triton_stats``), or None where they do not serve this tensor, are
        switched off (``MSPROBE_TRITON=0``) or Triton does not import: the torch ops serve then."""
        fused = self._fused
        if fused is None:
            fused = self._kernels()
        width = 4 if kind == KIND_LOW else _WIDTH.get(kind) if kind != KIND_BOOL else None
        if not fused or width is None:
            return None
        try:
            return fused.add(t, width)
        except Exception as error:  # a kernel that does not compile or launch here: the torch ops from now on
            self._fused_devices = ()  # (the tensors it took already are still finished at the flush)
            fused.detach()
            _fused_failed(error)
            return None

    def _kernels(self):
        """The Triton kernels (``triton_stats.TritonStats``), made by the first tensor that asks, with the native
        Recorder's lane attached where there is one (``_attach``); False where they do not serve."""
        fused = self._fused = _fused_stats(self.nan_inf_count) or False
        if fused and self._recorder is not None:
            self._attach(fused)
        return fused

    def _attach(self, fused):
        """The native Recorder's lane onto the Triton kernels (``TritonStats.attach``), unless
        ``MSPROBE_NATIVE_LANE`` is 0 (the Python path, for a comparison); where it cannot be (an op built from an
        older source has no lane), the Python path serves, as before."""
        if os.environ.get("MSPROBE_NATIVE_LANE", "1") == "0":
            return
        try:
            fused.failed = self._lane_failed
            fused.attach(self._recorder, DEVICE_ROW, cpu=self._fused_cpu)
            if hasattr(self._recorder, "lane_integers"):  # an older op's source has none
                if self._integers is None:
                    self._integers = IntegerLane(_exact_slot)
                self._integers.attach(self._recorder, INTEGER_ROW)
        except Exception as error:
            import logging

            logging.getLogger("msprobe_runtime").debug("msprobe_runtime: no native lane (%s)", error)

    def _lane_failed(self, error):
        """A launch of the native lane's failed in a backward hook: the torch ops from now on."""
        self._fused_devices = ()
        _fused_failed(error)

    def fused_fingerprint(self, t, by_torch_ops):
        """The slot of the fingerprint's four parts of ``t`` (readable, at least one element) by the Triton kernels
        in one read of its bytes (``triton_fingerprint.Fingerprints``: a call's tensors in one launch), launched, not
        read; None where they do not serve (another device or type, ``MSPROBE_TRITON=0``, no Triton, a kernel that
        failed here once): ``by_torch_ops`` (``checksums.fingerprint_parts``, passed in: this module does not import
        ``checksums``, which imports it) serves then, with the same digits, and for the tensors of a launch that
        failed (tests/runtime/test_triton_fingerprint.py)."""
        import torch

        device = t.device.type
        if device not in self._fingerprint_devices or device not in self._fused_devices:
            return None  # the CPU path, or the kernels failed here (the statistics': Triton does not serve)
        t = t.detach()
        if type(t) is not torch.Tensor:  # a subclass's memory may not be its values: the torch ops serve it
            return None
        hashes = self._fingerprints
        if hashes is None:
            fused = self._fused
            if fused is None:  # made here where a fingerprint asks first (a float8 tensor's, whose statistics are not
                fused = self._kernels()  # theirs): the native lane attached too
            if not fused:
                return None
            try:
                from . import triton_fingerprint

                hashes = triton_fingerprint.Fingerprints(fused.calls, Slot, fused.changed, by_torch_ops)
            except Exception as error:  # Triton imports, but not the kernels' module: the torch ops from now on
                self._fingerprints_failed(error)
                return None
            self._fingerprints = fused.fingerprints = hashes  # the statistics' ``end`` launches its queue too
            if self._recorder_fingerprints and fused.lane_attached:  # its records' fingerprints queued here too
                try:
                    hashes.attach(self._recorder)
                except Exception as error:  # the Python path's records, as before
                    import logging

                    logging.getLogger("msprobe_runtime").debug("msprobe_runtime: no fingerprints lane (%s)", error)
        elif hashes.error is not None:  # a launch at a call's end failed: the torch ops from now on
            self._fingerprints_failed(hashes.error)
            return None
        try:
            # a layout that is not dense is copied first, as the torch ops do; a negative or conjugate view
            # resolved into its values (the bytes of the values, as ``checksums.fingerprint_parts``)
            slot = hashes.add(t.contiguous().resolve_conj().resolve_neg())
        except Exception as error:  # not a launch (Fingerprints keeps those): the torch ops serve
            self._fingerprints_failed(error)
            return None
        if hashes.error is not None:  # its launch failed: the torch ops gave its parts, and serve from now on
            self._fingerprints_failed(hashes.error)
        return slot

    def _fingerprints_failed(self, error):
        """The fingerprint kernels do not serve here (said once): the torch ops from now on."""
        if self._recorder_fingerprints and self._recorder is not None:  # its records the Python path's from now on
            self._recorder.fingerprints_off()
        if self._fingerprint_devices:
            self._fingerprint_devices = ()
            _fused_failed(error, "fingerprint kernel", "fingerprints")

    def _add_low(self, t, scaling=None):
        """A float8 tensor's slots: Max, Min, Mean, Norm (the slot) and the counts (NaN, Inf when they are on,
        then the elements equal to zero and those at the format's largest magnitude), all of the values
        upcast to float32 chunk by chunk, since torch has no reduction of float8 itself; a plain tensor in one
        read where the native op (CPU) or the Triton kernels (a device: ``_fused_add``) take it, the same numbers
        (tests/runtime/test_triton_stats.py). Nothing is read back; the tensor is only read.

        ``scaling`` (``float8_scaling``): the statistics and the NaN/Inf counts are of the dequantized values,
        the zero and saturated counts of the float8 data, and the slot carries the dequantization factor after
        the four (one number for a per-tensor scale; its Max and Min for a scale per row, column or block,
        where the whole tensor is dequantized at once, broadcast as the class does)."""
        import torch

        if scaling is None and type(t) in self._native_types and self._native_low is not None:
            try:
                row = self._native_low(t, self.nan_inf_count)
            except Exception:  # a layout it could not copy: the torch ops below serve
                row = None
            if row:  # one pass (native/stats_op.cpp's stats_low): Max, Min, Mean, Norm, then the counts
                return row[:4], row[4:]
        if scaling is None and type(t) is torch.Tensor and t.device.type in self._fused_devices:
            fused = self._fused_add(t, KIND_LOW)  # one read by the Triton kernels; None: the torch ops below
            if fused is not None:
                return fused
        top, decode, per_element = _low_format(t.dtype)
        if per_element != 1:
            t = t.view(torch.uint8)  # float4: its bytes, each two values (decode)
        factor = None
        if scaling is not None:
            scale, divide = scaling
            scale = scale.detach().to(torch.float32)
            factor = scale.reciprocal() if divide else scale
        if factor is not None and factor.numel() != 1:
            raw = t.to(torch.float32)
            chunks = [(raw.reshape(-1), (raw / scale if divide else raw * scale).reshape(-1))]
            n, repeat = raw.numel(), 1
            extra = (factor.amax(), factor.amin())
        else:
            t, repeat = dense_view(t)
            flat = t.reshape(-1)  # a dense view as it is; another layout copied at one byte an element
            one = factor.reshape(()) if factor is not None else None
            chunks = ((decode(flat[start : start + _LOW_CHUNK]), None) for start in range(0, flat.numel(), _LOW_CHUNK))
            n = flat.numel() * per_element
            extra = (one,) if one is not None else ()
        values, counts = [], []
        for f, v in chunks:
            if v is None:
                # torchao divides by its scale, TE multiplies by the inverse: each as its class does
                v = f if factor is None else (f / scale.reshape(()) if divide else f * scale.reshape(()))
            values.append(torch.stack((v.amax(), v.amin(), v.sum(), torch.dot(v, v))))
            counts.append(
                torch.stack((torch.isnan(v).sum(), torch.isinf(v).sum(), (f == 0).sum(), (f.abs() == top).sum()))
            )
        if len(values) == 1:
            part, count = values[0], counts[0]
            total, squares = part[2], part[3]
        else:
            parts = torch.stack(values)
            part = torch.stack((parts[:, 0].amax(), parts[:, 1].amin()))
            count = torch.stack(counts).sum(0)
            total, squares = parts[:, 2].sum(), parts[:, 3].sum()
        if repeat != 1:
            total, squares, count = total * repeat, squares * repeat, count * repeat
        slot = Slot(torch.stack((part[0], part[1], total / (n * repeat), squares.sqrt()) + extra), 4 + len(extra))
        counts_slot = Slot(count if self.nan_inf_count else count[2:], 4 if self.nan_inf_count else 2)
        with self._lock:
            self._pending.append(slot)
            self._pending.append(counts_slot)
        return slot, counts_slot

    def add_values(self, values, width):
        """A slot for ``width`` numbers already launched on the device (a checksum's parts)."""
        slot = Slot(values, width)
        with self._lock:
            self._pending.append(slot)
        return slot

    def _stage(self, t):
        """Copy a small contiguous tensor into its stage (a copy, since the user may change it in place before the
        flush); None where the staging memory is used up. A stage's rows have ``t``'s shape, so that the copy needs
        no view of ``t``; and it is made with gradients off, so that ``t`` (a parameter, an activation that requires
        grad) needs no detached alias: the row's memory gets ``t``'s values and no autograd node is recorded
        (tests/runtime/test_torch_op_cost.py)."""
        import torch

        shape = t.shape
        key = (t.device, t.dtype, shape)
        with self._lock:
            stages = self._stages.setdefault(key, [])
            stage = stages[-1] if stages else None
            if stage is None or stage.rows == len(stage.views):
                if stage is None:  # a device's stages are made afresh each step: as many rows as the last one's
                    rows = max(_STAGE_FIRST_ROWS, self._stage_sizes.get(key, 0))
                else:
                    rows = 2 * len(stage.views)
                size = rows * t.numel() * t.element_size()
                if self._staged_bytes + size > _STAGE_MAX_BYTES:
                    return None
                stage = _Stage(torch.empty((rows, *shape), dtype=t.dtype, device=t.device))
                self._staged_bytes += size
                stages.append(stage)
            _gradless(stage.views[stage.rows].copy_, t)
            stage.rows += 1
            slot = Slot(None, 4)
            counts = Slot(None, 2) if self.nan_inf_count else None
            stage.slots.append(slot)
            stage.counts.append(counts)
        return slot, counts

    def _reduce_stages(self, stages_by_key):
        """Row-wise statistics of every stage, as group slots; returns them, the emptied buffers that may serve
        the next step, and the rows each device key's stages held (``_stage_sizes``)."""
        import torch

        groups, kept, sizes = [], {}, {}
        for key, stages in stages_by_key.items():
            for stage in stages:
                if not stage.rows:
                    continue
                m = stage.buffer[: stage.rows].reshape(stage.rows, -1)  # a row per tensor (a view: rows are whole)
                values = torch.stack((m.amax(1), m.amin(1), m.mean(1), torch.linalg.vector_norm(m, dim=1)), 1)
                groups.append(Slot(values.reshape(-1), 4 * stage.rows, stage.slots))
                if self.nan_inf_count:
                    counts = torch.stack((torch.isnan(m).sum(1), torch.isinf(m).sum(1)), 1)
                    groups.append(Slot(counts.reshape(-1), 2 * stage.rows, stage.counts))
            # CPU ops are done when they return: the largest buffer serves again. A device's reductions may
            # still be queued, so its next step gets a fresh buffer, never one they read: one of as many rows as
            # this step's stages of the key took, where growing from the first size made a buffer, its row views
            # and its reductions at each doubling (tests/runtime/test_torch_op_cost.py)
            if not stages:
                continue
            if self._keeps_stage(key[0]):
                keep = stages[-1]
                keep.rows, keep.slots, keep.counts = 0, [], []
                kept[key] = keep
            else:
                sizes[key] = sum(stage.rows for stage in stages)
        return groups, kept, sizes

    @staticmethod
    def _keeps_stage(device):
        """Whether a stage's buffer on ``device`` serves the next step (its reductions done when they returned)."""
        return device.type == "cpu"

    def closed_arenas(self):
        """The Triton arenas closed by ``take`` since the last call whose numbers the native lane's records name
        (their rows ``(DEVICE_ROW, key, tensor)``, and the fingerprints' arena's key and index in summary_mode
        fingerprint): a step's writer reads their numbers (records.device_numbers)."""
        closed, self._closed = self._closed, []
        return closed

    def take(self):
        """Start the transfer of every pending slot: one buffer and one non-blocking copy per device. Returns
        whether every number is on the host already (CPU tensors only), so that reading them waits for
        nothing."""
        import torch

        with self._lock:
            pending, self._pending = self._pending, []
            stages, self._stages = self._stages, {}
            rows, self._rows = self._rows, {}
        groups, kept, sizes = self._reduce_stages(stages)  # torch ops, outside the lock
        pending.extend(groups)
        if self._recorder is not None and hasattr(self._recorder, "take_lane_error"):
            error = self._recorder.take_lane_error()
            if error:  # the lane gave itself up: the Python path made its records from then on
                import logging

                logging.getLogger("msprobe_runtime").warning(
                    "msprobe_runtime: the native op's records of device tensors stopped (%s); the Python path "
                    "makes them",
                    error.splitlines()[0][:200] if error.strip() else "an error",
                )
        if self._fingerprints is not None:
            try:
                pending.extend(self._fingerprints.finish())
            except Exception as error:  # their finish failed: null fingerprints this flush, the torch ops after
                self._fingerprints_failed(error)
            self._closed.extend(self._fingerprints.take_closed())
            if self._fingerprints.error is not None:
                self._fingerprints_failed(self._fingerprints.error)
        if self._fused:
            try:
                pending.extend(self._fused.finish())
            except Exception as error:  # the slots it held stay unfilled: null statistics, the records kept
                self._fused_devices = ()
                self._fused.detach()
                _fused_failed(error)
            self._closed.extend(self._fused.take_closed())
        if self._integers is not None:
            slots, arenas, error = self._integers.close()
            pending.extend(slots)  # into the int64 batch of their device, as the Python path's int64 slots
            self._closed.extend(arenas)
            if error is not None:  # that arena's records null; the lane goes on
                import logging

                logging.getLogger("msprobe_runtime").warning(
                    "msprobe_runtime: the integer Max and Min of the native lane's records could not be read this "
                    "flush (%s: %s); those records are written null",
                    type(error).__name__,
                    str(error).strip()[:200],
                )
        with self._lock:
            self._stage_sizes = sizes
            for key, keep in kept.items():
                self._stages.setdefault(key, [keep])
            self._staged_bytes = sum(
                stage.buffer.numel() * stage.buffer.element_size()
                for stages in self._stages.values()
                for stage in stages
            )
        on_host = True
        for arenas in rows.values():
            for arena in arenas:
                if arena.count and not arena.take():
                    on_host = False
        by_device = {}
        for slot in pending:
            # an int64 Max or Min keeps its type, in a batch of its own: through float64 an extreme past 2**53
            # would be rounded (counts are int64 too, but below 2**53: they join the others)
            key = (slot.pending.device, slot.exact)
            by_device.setdefault(key, {}).setdefault(slot.pending.dtype, []).append(slot)
        for (device, exact), by_dtype in by_device.items():
            target = torch.int64 if exact else (torch.float32 if device.type == "mps" else torch.float64)
            if not _launch(device, by_dtype, target):
                on_host = False
        return on_host


class _Batching:
    __slots__ = ("stats", "fused")

    def __init__(self, stats, fused):
        self.stats, self.fused = stats, fused

    def __enter__(self):
        self.fused.begin()

    def __exit__(self, *exc):
        self.stats.end_call(self.fused)
        return False


class _NoBatch:
    __slots__ = ()

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NO_BATCH = _NoBatch()
_ROWS_FIRST = 64  # tensors of a device's first rows buffer in a flush; each next one holds twice as many
_ROWS_MAX = 1 << 14


class _Rows:
    """The buffers one flush's float tensors of one device are reduced into by ``StatBuffer._add_rows``: Min and
    Max in a buffer of the tensor's dtype, Sum and Norm in a float32 one, the two counts in an int64 one, one
    row per tensor; at the flush one cast and concatenation per buffer, one copy to the host, and the writer
    thread makes the slots' numbers of the whole flush at once (``finish``)."""

    __slots__ = (
        "device",
        "counting",
        "capacity",
        "count",
        "sums",
        "counts",
        "extremes",
        "used",
        "entries",
        "slots",
        "views",
    )

    def __init__(self, device, counting, capacity):
        import torch

        self.device = device
        self.counting = counting
        self.capacity = min(capacity, _ROWS_MAX)
        self.count = 0
        self.sums = torch.empty((self.capacity, 2), dtype=torch.float32, device=device)
        self.counts = torch.empty((self.capacity, 2), dtype=torch.int64, device=device) if counting else None
        self.extremes = {}  # dtype -> (capacity, 2) of that dtype: Min, Max
        self.used = {}  # dtype -> rows of extremes used
        # every number's place as a 0-d view, made by one unbind per buffer: no select per tensor
        self.views = {"sums": self.sums.view(-1).unbind(0)}
        if counting:
            self.views["counts"] = self.counts.view(-1).unbind(0)
        # (dtype, elements, repeat, row of extremes, Norm squared) a tensor, which the Batch's ``read`` keeps; its
        # (slot, counts slot) apart: a slot may be untracked with its record (seal), and refers to the Batch, so the
        # Batch must not refer back to it (a cycle the garbage collector could no longer see: tests/runtime/
        # test_entry_tracking.py)
        self.entries = []
        self.slots = []

    def add(self, t, repeat):
        import torch

        dtype = t.dtype
        extremes = self.extremes.get(dtype)
        if extremes is None:
            extremes = self.extremes[dtype] = torch.empty((self.capacity, 2), dtype=dtype, device=self.device)
            self.used[dtype] = 0
            self.views[dtype] = extremes.view(-1).unbind(0)
        row, at = self.count, self.used[dtype]
        dims = tuple(range(t.dim()))
        views, sums = self.views[dtype], self.views["sums"]
        torch.aminmax(t, out=(views[2 * at], views[2 * at + 1]))
        torch.sum(t, dims, dtype=torch.float32, out=sums[2 * row])
        squared = dtype is torch.float32 and t.is_contiguous()
        if squared:  # BLAS: one fast pass, and closer than the CPU's float32 vector_norm (1 ulp, not 10)
            flat = t.reshape(-1)
            torch.dot(flat, flat, out=sums[2 * row + 1])  # the sum of squares: its root taken on the host
        else:
            torch.linalg.vector_norm(t, dtype=torch.float32, out=sums[2 * row + 1])
        counts = None
        if self.counting:
            counted = self.views["counts"]
            torch.sum(torch.isnan(t), dims, out=counted[2 * row])
            torch.sum(torch.isinf(t), dims, out=counted[2 * row + 1])
            counts = Slot(None, 2)
        slot = Slot(None, 4)
        self.count += 1
        self.used[dtype] = at + 1
        self.entries.append((dtype, t.numel(), repeat, at, squared))
        self.slots.append((slot, counts))
        return slot, counts

    def take(self):
        """Start the copy of the used rows to the host as one Batch that ``finish`` reads; whether it is there
        already (the CPU)."""
        import torch

        n = self.count
        parts, base = [], {}
        offset = 0
        for dtype, extremes in self.extremes.items():
            used = self.used[dtype]
            parts.append(extremes[:used].reshape(-1).to(torch.float64))
            base[dtype] = offset
            offset += 2 * used
        parts.append(self.sums[:n].reshape(-1).to(torch.float64))
        if self.counting:
            parts.append(self.counts[:n].reshape(-1).to(torch.float64))
        flat = torch.cat(parts)
        if self.device.type == "cpu":
            host, event = flat, None
        else:
            host = flat.to("cpu", non_blocking=True)
            event = record_event(self.device)
        entries, counting = self.entries, self.counting
        batch = Batch(host, event, read=lambda host: _finish_rows(host, entries, base, offset, counting))
        for index, (slot, counts) in enumerate(self.slots):
            slot.batch, slot.offset = batch, 4 * index
            if counts is not None:
                counts.batch, counts.offset = batch, 4 * n + 2 * index
        return event is None


def _finish_rows(host, entries, base, sums_at, counting):
    """The numbers of a ``_Rows`` flush (writer thread, on the host): each tensor's Max, Min, Mean and Norm,
    then every tensor's two counts, Mean and Norm rounded to the tensor's dtype (by way of float32, as the
    native op rounds them)."""
    import torch

    n = len(entries)
    flat = host.contiguous()
    at = torch.tensor([base[e[0]] + 2 * e[3] for e in entries], dtype=torch.int64)
    elements = torch.tensor([e[1] for e in entries], dtype=torch.float64)
    repeats = torch.tensor([e[2] for e in entries], dtype=torch.float64)
    sums = flat[sums_at : sums_at + 2 * n].view(n, 2)
    mean = sums[:, 0] / elements  # the Sum of the dense view: repeat copies of each value, repeat times the elements
    squared = torch.tensor([e[4] for e in entries], dtype=torch.bool)
    # a float32 sum of squares (dot) rooted in float64 and rounded to float32 below: the float32 root's bits
    norm = torch.where(squared, sums[:, 1].sqrt(), sums[:, 1]) * repeats.sqrt()
    by_dtype: dict = {}
    for index, entry in enumerate(entries):
        by_dtype.setdefault(entry[0], []).append(index)
    for dtype, indices in by_dtype.items():
        index = torch.tensor(indices, dtype=torch.int64)
        for column in (mean, norm):
            column[index] = column[index].to(torch.float32).to(dtype).to(torch.float64)
    rows = torch.stack((flat[at + 1], flat[at], mean, norm), 1).reshape(-1)
    if counting:
        counts = flat[sums_at + 2 * n : sums_at + 4 * n].view(n, 2) * repeats[:, None]
        rows = torch.cat((rows, counts.reshape(-1)))
    return host_rows(rows)


def _fused_stats(nan_inf_count):
    """A ``triton_stats.TritonStats``, or None where ``MSPROBE_TRITON`` is off or Triton does not import (an NPU
    image, a CPU build of torch): imported at the first device tensor only, never on the CPU path."""
    from .switches import switched_on

    if not switched_on("MSPROBE_TRITON"):
        return None
    try:
        from . import triton_stats
    except Exception as error:  # no Triton, or one that does not load here: the torch ops serve
        import logging

        logging.getLogger("msprobe_runtime").debug("msprobe_runtime: no Triton statistics (%s)", error)
        return None
    return triton_stats.TritonStats(nan_inf_count, Slot, dense_view)


def _exact_slot(pending, width):
    """A slot of int64 numbers read as they are (integer_lane's arenas)."""
    return Slot(pending, width, exact=True)


def _fused_failed(error, what="statistics kernels", which="statistics"):
    import logging

    lines = str(error).strip().splitlines()
    logging.getLogger("msprobe_runtime").warning(
        "msprobe_runtime: the Triton %s failed here (%s: %s); %s use torch ops",
        what,
        type(error).__name__,
        lines[0][:200] if lines else "",
        which,
    )


def _launch(device, by_dtype, target):
    """One flat tensor of ``target`` type for the slots of one device (``{dtype: [slots]}``), on its way to the
    host as one Batch; whether it is there already (a CPU device)."""
    import torch

    parts, slots, offset = [], [], 0
    for dtype, group in by_dtype.items():
        joined = torch.cat([slot.pending for slot in group])
        parts.append(joined if dtype == target else joined.to(target))
        for slot in group:
            slot.offset = offset
            offset += slot.width
        slots.extend(group)
    flat = parts[0] if len(parts) == 1 else torch.cat(parts)
    if device.type == "cpu":
        host, event = flat, None
    else:
        host = flat.to("cpu", non_blocking=True)
        event = record_event(device)
    batch = Batch(host, event)
    for slot in slots:
        slot.batch = batch
        slot.pending = None
        if slot.members is not None:
            for index, member in enumerate(slot.members):
                if type(member) is Slot:  # None once forgotten, or the native lane's mark (TritonStats.attach)
                    member.batch = batch
                    member.offset = slot.offset + index * member.width
    return event is None


_FLOAT4_TABLES: dict = {}  # device -> the 16 E2M1 values, float32, made once per device


def _low_format(dtype):
    """``(the format's largest magnitude, chunk -> its values as floats, values per stored element)`` of a
    KIND_LOW dtype: float8 upcast to float32, e8m0 to float64 (its squares pass float32's range), float4's bytes
    split into their two codes and looked up (``_FLOAT4_CODES``)."""
    import torch

    name = str(dtype)[6:]
    if name == "float4_e2m1fn_x2":
        return 6.0, _float4_values, 2
    target = torch.float64 if name == "float8_e8m0fnu" else torch.float32
    return torch.finfo(dtype).max, lambda chunk: chunk.to(target), 1


def _float4_values(chunk):
    """The float4 values of ``chunk``'s bytes (uint8), the low code then the high one of each: every statistic
    here is independent of element order."""
    import torch

    table = _FLOAT4_TABLES.get(chunk.device)
    if table is None:
        table = _FLOAT4_TABLES[chunk.device] = torch.tensor(_FLOAT4_CODES, dtype=torch.float32, device=chunk.device)
    codes = torch.stack((chunk & 15, chunk >> 4)).reshape(-1)
    return table[codes.long()]


def dense_view(t):
    """The same multiset of values in a cheaper layout: a permuted one (a transposed matrix: Linear's weight
    gradient) is reduced in memory order, as the tensor it is a view of, and a broadcast (stride-0) dimension
    once, with ``repeat`` copies of each value. Every statistic here is independent of element order."""
    repeat = 1
    if any(stride == 0 for stride in t.stride()):
        for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
            if stride == 0 and size > 1:
                t = t.narrow(dim, 0, 1)
                repeat *= size
    if not t.is_contiguous():
        strides = t.stride()
        in_memory_order = t.permute(sorted(range(t.dim()), key=lambda dim: -strides[dim]))
        if in_memory_order.is_contiguous():
            t = in_memory_order
    return t, repeat


def record_event(device):
    """An event on ``device``'s current stream, through torch's device-generic API (nothing CUDA-only)."""
    import torch

    try:
        event = torch.Event(device=device)
        event.record()
        return event
    except Exception:  # a backend without generic events: the writer synchronises the device instead
        return device


def wait_event(event):
    """Block (on the writer thread) until a copy started by ``take`` has landed on the host."""
    if event is None:
        return
    import torch

    if isinstance(event, torch.device):
        module = getattr(torch, event.type, None)
        if module is not None and hasattr(module, "synchronize"):
            module.synchronize()
        return
    event.synchronize()


def host_rows(host):
    """A host tensor (float64, float32 or int64) as a list of numbers, read from its memory directly (no
    Tensor.tolist/.numpy/.item)."""
    import struct

    import torch

    raw = host_bytes(host)
    n = host.numel()
    if n == 0:
        return []
    code = "q" if host.dtype is torch.int64 else ("d" if host.element_size() == 8 else "f")
    return list(struct.unpack(f"<{n}{code}", raw))


def host_bytes(host):
    """A host tensor's memory, its elements in order, as bytes."""
    import ctypes

    host = host.contiguous()
    return ctypes.string_at(host.data_ptr(), host.numel() * host.element_size()) if host.numel() else b""


def _unpack_doubles(raw):
    from array import array

    out = array("d")
    out.frombytes(raw)
    return out.tolist()


def _pack_doubles(values):
    from array import array

    return array("d", values).tobytes()
