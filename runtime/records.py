"""Turn call arguments and results into dump records (msprobe's record shapes), with statistics as slots.

Describing a value never reads a tensor's data: a tensor becomes a ``TensorRecord`` holding its metadata and
the slot where its statistics are being computed on the device. The writer thread resolves slots into numbers.
A tensor the native op read at record time becomes a plain tuple instead (made by its ``Recorder``:
``(dtype name, shape tuple, requires_grad, 0-d, row)``, the row a float tensor's numbers packed as doubles in
``bytes``, an integer or bool tensor's a tuple), of strings, bytes and numbers only, which the op
leaves untracked by the garbage collector, so the records a step keeps until its flush are neither walked by
its young collections nor piled up in its oldest generation, where they brought on full collections. It stays
a tuple until the writing process makes it into msprobe's record (``json_files.native_json``). A device tensor's
native record (the Recorder's lane onto the Triton kernels) has the row ``(DEVICE_ROW, arena's key, tensor)``: plain
data too, whose numbers the writing process is sent with the step's files (``device_numbers``); in summary_mode
fingerprint ``(DEVICE_ROW, arena's key, tensor, fingerprints' arena's key, tensor there)``, its fingerprint's parts
sent the same way; an int64 device tensor's ``(INTEGER_ROW, arena's key, index)``, its Max and Min in an
``integer_lane.IntegerArena`` sent the same way.
"""

from __future__ import annotations

from .foreign import is_subclass, type_name
from . import dump_names
from .json_files import convert, copy_records, tensor_json
from .statistics import KIND_BOOL, KIND_FLOAT, KIND_LOW, KIND_NO_MEAN, KIND_SCALAR, slot_values

MAX_DEPTH = 32


class TensorRecord:
    """A tensor seen at record time; ``to_json`` runs on the writer thread once the statistics landed.

    The native op's ``seal`` may untrack one whose fields hold nothing tracked (``Collector``'s ``seal_types``): the
    garbage collector no longer looks into it, so nothing assigned to it later may refer back to it."""

    __slots__ = ("dtype", "shape", "requires_grad", "kind", "slot", "counts", "data_name", "type", "checksum")

    def __init__(self, type_name, dtype, shape, requires_grad, kind, slot, counts, data_name=None, checksum=None):
        self.type = type_name
        self.dtype = dtype
        self.shape = shape  # a tuple of ints: untracked by the garbage collector, unlike a list
        self.requires_grad = requires_grad
        self.kind = kind
        self.slot = slot  # statistics.Slot or the numbers themselves (statistics.slot_values); None: empty
        self.counts = counts  # the NaN and Inf counts, as ``slot``, or None
        self.data_name = data_name
        self.checksum = checksum  # checksums.Checksum (summary_mode md5 or fingerprint), or None

    def to_json(self):
        kind, dtype = self.kind, self.dtype
        row = slot_values(self.slot) if self.slot is not None else None
        counts = slot_values(self.counts) if self.counts is not None else None
        top = low = mean = norm = None
        fractions = scale = None
        if kind == KIND_LOW and counts is not None:  # float8: the last two counts are its own fields
            counts, fractions = (counts[:2] if len(counts) == 4 else None), counts[-2:]
        if row is None:
            pass
        elif kind == KIND_LOW:
            top, low, mean, norm = row[:4]
            if len(row) == 5:  # a scaled float8 class's per-tensor dequantization factor (statistics.float8_view)
                scale = row[4]
            elif len(row) == 6:  # a factor per row, column or block: its range
                scale = {"Max": row[4], "Min": row[5]}
            if not self.shape and dtype not in _PACKED:  # a 0-d tensor: all four are its value, as KIND_SCALAR's
                low = mean = norm = top
        elif kind == KIND_FLOAT:
            top, low, mean, norm = row
        elif kind == KIND_BOOL:
            top, low = bool(row[0]), bool(row[1])
        elif kind == KIND_SCALAR:
            top = low = mean = norm = _num(row[0], dtype)
        elif kind == KIND_NO_MEAN:
            top, low = _num(row[0], dtype), _num(row[1], dtype)
        out = tensor_json(self.type, dtype, self.shape, self.requires_grad, top, low, mean, norm, counts)
        if fractions is not None:
            numel = _PACKED.get(dtype, 1)
            for size in self.shape:
                numel *= size
            # after msprobe's fields, which its compare reads; zero's and the largest magnitude's share of the
            # elements (docs/low-precision.md)
            out[FP8_ZERO_FRACTION] = fractions[0] / numel
            out[FP8_SATURATED_FRACTION] = fractions[1] / numel
        if scale is not None:
            out[FP8_SCALE] = scale
        if self.checksum is not None:
            out[self.checksum.key] = self.checksum.value()
        if self.data_name is not None:
            out["data_name"] = self.data_name
        return out


# a float8 record's own fields: the fraction of its elements equal to zero (+0 or -0: underflowed, or zero
# already) and the fraction whose magnitude is the format's largest finite one (torch.finfo(dtype).max:
# saturated, or that large already); only the float8 values are seen, not what they were cast from
FP8_ZERO_FRACTION = "fp8_zero_fraction"
# dtypes whose every stored element holds several values (float4's two a byte): the fractions are of the values
_PACKED = {"torch.float4_e2m1fn_x2": 2}
FP8_SATURATED_FRACTION = "fp8_saturated_fraction"
# a scaled float8 class's record (docs/low-precision.md): the factor its float8 values are multiplied by to give
# its values (1 / scale for torchao's Float8TrainingTensor, scale_inv for Transformer Engine's Float8Tensor)
FP8_SCALE = "fp8_scale"

_INT_DTYPES = frozenset(
    {
        "torch.int8",
        "torch.int16",
        "torch.int32",
        "torch.int64",
        "torch.uint8",
        "torch.uint16",
        "torch.uint32",
        "torch.uint64",
    }
)


def _num(value, dtype):
    if dtype in _INT_DTYPES and value == value and abs(value) != float("inf"):
        return int(value)
    return value


def resolve(obj):
    """Replace every TensorRecord inside ``obj`` (the lists and dicts of an entry, all the collector's own) by
    its JSON form; native records stay tuples (``json_files.expand`` makes them into theirs where they are
    written)."""
    return convert(obj, _RESOLVE)


def device_numbers(arenas):
    """The numbers of ``arenas`` (``StatBuffer.closed_arenas``: Triton arenas closed, their numbers on the host or on
    their way) as the writing process reads them (json_files.native_json): by each arena's key, its ``packed()``
    (``triton_stats._Arena``'s statistics, ``triton_fingerprint._Arena``'s fingerprint parts). An arena whose numbers
    never came is left out: its records are written null."""
    out = {}
    for arena in arenas:
        packed = arena.packed()
        if packed is not None:
            out[arena.key] = packed
    return out


_RESOLVE = {TensorRecord: TensorRecord.to_json}


def describe_builtin(value):
    """Records of non-tensor values, as msprobe writes them; None for anything unsupported."""
    kind = type(value)  # never isinstance: the value may be the user's object (see foreign.py)
    if kind is slice:
        parts = []
        for part in (value.start, value.stop, value.step):
            # an int-like tensor inside a slice would need a host sync to read; it is recorded as null
            parts.append(part if part is None or type(part) is int else None)
        return {"type": "slice", "value": parts}
    if value is Ellipsis:
        return {"type": "ellipsis", "value": "..."}
    if kind is bool or kind is int or kind is float or kind is str:
        return {"type": kind.__name__, "value": value}
    for base in (int, float, str):  # an IntEnum or a str subclass: its base's value, by the base's own slot
        if is_subclass(kind, base):
            return {"type": type_name(kind), "value": base(_BASE_VALUE[base](value))}
    return None


_BASE_VALUE = {int: int.__index__, float: float.__float__, str: str.__str__}


def copied(data):
    """A step's entries (``Collector.snapshot``'s ``data``) as they are now: each entry that later hooks of the
    step may still fill (all but forward entries) copied, down to its lists and dicts (``copy_records``)."""
    return {name: entry if dump_names.is_forward(name) else copy_records(entry) for name, entry in data.items()}
