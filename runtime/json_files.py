"""A step's JSON files, written atomically: by the writing process, or by the writer thread where there is none.

Run as a script (``python -I -S json_files.py``, with only the standard library), this module is the writing
process that ``writing_process.WritingProcess`` starts: it reads jobs from its stdin, writes their files, and
answers each job on its stdout. Encoding the JSON (most of all Python's ``float.__repr__`` of every
statistic) is the largest part of writing a step; in the training process it held the GIL, which the
training thread then waited for after each torch op. In a process of its own it runs on another core.

A job is ``(directory, [(file name, object), ...])``, then the numbers of its device records where it has
any, marshalled (the records are plain lists, dicts, strings and numbers by then) behind an 8-byte length.
A file may also come as ``(name, object, key)``: its text is kept, and a later ``(name, None, key)`` with
the same key writes that text again. stack.json and construct.json are the same step after step (the same
call sites, the same modules), so the training thread sends them once while they do not change
(``writer.Writer``). A record of a tensor that the native op read is still the tuple the training thread
made (``native/stats_op.cpp``'s ``Recorder``): it becomes msprobe's record here (``expand``), in the process
that writes, which is most of what turning a step's records into JSON used to cost the training thread. A
device tensor's record (the Recorder's lane onto the Triton kernels) names its numbers by place,
``(DEVICE_ROW, arena's key, tensor)``, and the job brings the numbers of the arenas it names
(``records.device_numbers``), so that its records too become JSON only here. The answer is
``(errno or -1 or 0, message)``: 0 when every file is written, otherwise the error, which the writer thread
raises as its own (docs: one loud message, the step not written, later steps tried again).
"""

from __future__ import annotations

import itertools
import json
import marshal
import os
import select
import struct
import sys
import time

_LENGTH = struct.Struct("<Q")
MARSHAL_VERSION = 4


def json_text(obj):
    return json.dumps(obj, ensure_ascii=False)  # no indent: only then does json use its C encoder


_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def exclusive_temp(path):
    """``(fd, name)`` of a new temporary file beside ``path``, under a name no one can guess, opened only if
    nothing was there (``O_EXCL``, no link followed), as CPython's own ``.pyc`` writer does: a link planted
    at a predictable name is never written through. Renamed onto ``path`` with ``os.replace``, which
    replaces a link at ``path`` itself, never what it points to."""
    directory, base = os.path.split(path)
    while True:
        tmp = os.path.join(directory, f".{base}.{os.urandom(8).hex()}.tmp")
        try:
            return os.open(tmp, _EXCLUSIVE, 0o666), tmp
        except FileExistsError:
            continue


def atomic_write_text(path, text):
    """Write ``text`` to ``path`` through a temporary file in the same directory; a failure (a full disk, a
    folder made read-only) leaves no temporary file behind and ``path`` as it was."""
    fd, tmp = exclusive_temp(path)
    try:
        with open(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def remove_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def write_files(directory, files, kept=None, numbers=None):
    """Make ``directory`` and write each ``(name, object)`` of ``files`` into it, in order (``expand``ed, a device
    record's numbers from ``numbers``: ``records.device_numbers``).

    ``kept``: the texts of files sent as ``(name, object, key)``, by ``(key[0], name)`` (a writer's stream and
    the file): ``(key[1], text)``, the latest of each. A file ``(name, None, key)`` is the text kept for that
    key; where it is not kept, nothing of the step is written (KeyError)."""
    texts = [(item[0], _text(item, kept, numbers)) for item in files]
    os.makedirs(directory, exist_ok=True)
    for name, text in texts:
        atomic_write_text(os.path.join(directory, name), text)


def _text(item, kept, numbers):
    if len(item) == 2:
        return json_text(expand(item[1], numbers))
    name, obj, (stream, version) = item
    if obj is None:
        known = kept.get((stream, name)) if kept is not None else None
        if known is None or known[0] != version:
            raise KeyError(f"{name} sent earlier as version {version} is not kept here")
        return known[1]
    text = json_text(expand(obj, numbers))
    if kept is not None:
        kept[(stream, name)] = (version, text)
    return text


def tensor_json(type_name, dtype, shape, requires_grad, top, low, mean, norm, counts):
    """msprobe's record of a tensor, in its key order (the one literal for it: ``records`` adds the optional
    checksum and file name)."""
    out = {"type": type_name, "dtype": dtype, "shape": list(shape), "Max": top, "Min": low, "Mean": mean, "Norm": norm}
    out["requires_grad"] = requires_grad
    if counts is not None:
        out["NaN_count"] = _count(counts[0])
        out["Inf_count"] = _count(counts[1])
    return out


def _count(value):
    """A NaN or Inf count as msprobe writes it, an int; None where it is no number (NaN or infinite: memory that a
    kernel never wrote), which ``int`` would raise for and so fail the whole step's file."""
    return int(value) if value - value == 0 else None


def native_json(record, numbers=None):
    """The record of a native record's tuple ``(dtype, shape, requires_grad, scalar, row)``: ``row``
    is Max, Min, Mean, Norm (a 0-d tensor's: its value first), then the NaN and Inf counts if any; for a float
    tensor it is those numbers packed as native doubles (``bytes``), for an integer or bool one a tuple; for a
    device tensor's ``(DEVICE_ROW, arena's key, tensor)``, its place in ``numbers`` (``records.device_numbers``),
    and in summary_mode fingerprint its fingerprint's place there after it (``_device_json``); for an integer or
    bool device tensor's ``(INTEGER_ROW, arena's key, index)`` (``_integer_json``)."""
    dtype, shape, requires_grad, scalar, row = record
    if type(row) is bytes:
        row = _DOUBLES.unpack(row) if len(row) == _DOUBLES.size else _DOUBLES_COUNTED.unpack(row)
    elif row and row[0] == DEVICE_ROW:  # a tuple of numbers otherwise, whose first is never a str
        return _device_json(record, numbers)
    elif row and row[0] == INTEGER_ROW:
        return _integer_json(record, numbers)
    return _row_json(dtype, shape, requires_grad, scalar, row)


def _row_json(dtype, shape, requires_grad, scalar, row):
    counts = row[4:6] if len(row) > 4 else None
    if scalar:
        return tensor_json("torch.Tensor", dtype, shape, requires_grad, row[0], row[0], row[0], row[0], counts)
    return tensor_json("torch.Tensor", dtype, shape, requires_grad, row[0], row[1], row[2], row[3], counts)


_DOUBLES = struct.Struct("=4d")  # the native op's row: Max, Min, Mean, Norm
_DOUBLES_COUNTED = struct.Struct("=6d")  # and the NaN and Inf counts
_COUNTS = struct.Struct("=2d")

# The mark that begins a device record's row (statistics.StatBuffer gives it to the native op's lane): a str, which
# marshal carries and no row of numbers holds
DEVICE_ROW = "msprobe:device-row"
# the mark of an integer or bool device tensor's row, ``(INTEGER_ROW, arena's key, index)``: its Max and Min in the
# numbers of an integer_lane.IntegerArena
INTEGER_ROW = "msprobe:device-integers"
FINGERPRINT_KEY = "fingerprint"  # summary_mode fingerprint's field (checksums)
EMPTY_FINGERPRINT = "0" * 16  # an empty tensor's: no bytes to hash
# the row of an empty device tensor's record in summary_mode fingerprint, which the native op's lane makes at once:
# no arena (null statistics, as the Python path's), its fingerprint given (``_device_json``)
EMPTY_FINGERPRINT_ROW = (DEVICE_ROW, None, None, None, EMPTY_FINGERPRINT)
_ARENA_KEYS = itertools.count(1)


def arena_key():
    """A key for a Triton arena (triton_stats', triton_fingerprint's), unique in the process: what a device record
    names its numbers by (``native_json``). Here, in a module never imported afresh, as tests do the kernels'."""
    return next(_ARENA_KEYS)


def fingerprint_hex(parts):
    """The 16 hex digits of a fingerprint's four parts read back from the host (numbers below 2**16 each)."""
    values = [int(v) for v in parts]
    return f"{(values[0] << 16) | values[1]:08x}{(values[2] << 16) | values[3]:08x}"


def _device_json(record, numbers):
    """A device record's dict: its numbers where ``numbers`` has them (a launch that failed, an arena never closed or
    read: null, as the Python path writes them); in summary_mode fingerprint (the row ``(DEVICE_ROW, key, tensor,
    fingerprints' key, their tensor)``) its fingerprint's digits after them, an empty tensor's given in its row
    (``EMPTY_FINGERPRINT_ROW``)."""
    dtype, shape, requires_grad, scalar, row = record
    arena = numbers.get(row[1]) if numbers else None
    tensor = row[2]
    if arena is None or tensor in arena[2]:
        out = tensor_json("torch.Tensor", dtype, shape, requires_grad, None, None, None, None, None)
    else:
        values = _DOUBLES.unpack_from(arena[0], 32 * tensor)
        if arena[1]:
            values += _COUNTS.unpack_from(arena[1], 16 * tensor)
        out = _row_json(dtype, shape, requires_grad, scalar, values)
    if len(row) == 5:
        out[FINGERPRINT_KEY] = _row_fingerprint(row, numbers)
    return out


def _integer_json(record, numbers):
    """An integer or bool device record's dict, as the Python path writes one: its Max and Min from its arena's
    numbers (each tensor's two ints in turn), Mean and Norm null (``KIND_NO_MEAN``); a bool's as bools (``any`` and
    ``all``: ``KIND_BOOL``, 0-d too); a 0-d integer's value as all four (``KIND_SCALAR``); all null where the
    numbers never came. In summary_mode fingerprint (the row ``(INTEGER_ROW, key, index, fingerprints' key, their
    tensor)``) its fingerprint's digits after them, as ``_device_json``'s."""
    dtype, shape, requires_grad, scalar, row = record
    values = numbers.get(row[1]) if numbers else None
    at = 2 * row[2]
    top = low = mean = norm = None
    if values is not None and len(values) >= at + 2:
        top, low = values[at], values[at + 1]
        if dtype == "torch.bool":
            top, low = bool(top), bool(low)
        elif not shape:
            mean = norm = top
    out = tensor_json("torch.Tensor", dtype, shape, requires_grad, top, low, mean, norm, None)
    if len(row) == 5:
        out[FINGERPRINT_KEY] = _row_fingerprint(row, numbers)
    return out


def _row_fingerprint(row, numbers):
    """The fingerprint a device record's row of five names: by the fingerprints' arena's key and the tensor's index
    there, or given in it (``EMPTY_FINGERPRINT_ROW``, whose key is None)."""
    if row[3] is None:
        return row[4]
    return _digits(numbers.get(row[3]) if numbers else None, row[4])


def _digits(arena, tensor):
    """The fingerprint of tensor ``tensor`` of a fingerprints' arena's numbers (``(its four parts a tensor as doubles,
    b"", the tensors whose parts never came, {tensor: the torch ops' parts, or None}``): a launch that failed gave the
    torch ops' parts; None where none came."""
    if arena is None:
        return None
    if tensor in arena[3]:
        parts = arena[3][tensor]
        return None if parts is None else fingerprint_hex(parts)
    if tensor in arena[2] or len(arena[0]) < 32 * (tensor + 1):  # never written, or the arena's copy never came
        return None
    return fingerprint_hex(_DOUBLES.unpack_from(arena[0], 32 * tensor))


def convert(obj, converters):
    """``obj``, its lists and dicts copied, each other value whose exact type ``converters`` names replaced by
    what that function makes of it (records hold only the runtime's own objects: no user type is asked)."""
    kind = type(obj)
    if kind is list:
        return [convert(o, converters) for o in obj]
    if kind is dict:
        return {k: convert(v, converters) for k, v in obj.items()}
    make = converters.get(kind)
    return obj if make is None else make(obj)


_NATIVE = {tuple: native_json}  # a native record is the only tuple in a record


def expand(obj, numbers=None):
    """``obj`` with every native record made into its dict (a device record's numbers from ``numbers``)."""
    if not numbers:
        return convert(obj, _NATIVE)
    return convert(obj, {tuple: lambda record: native_json(record, numbers)})


def copy_records(obj):
    """``obj`` with its lists and dicts copied, all the way down (its other values are immutable)."""
    return convert(obj, {})


def encode(message):
    """``message`` marshalled behind its length (ValueError for an object marshal cannot hold)."""
    payload = marshal.dumps(message, MARSHAL_VERSION)
    return _LENGTH.pack(len(payload)) + payload


def decode(message):
    """What ``encode`` made ``message`` from."""
    return marshal.loads(message[_LENGTH.size :])


def read_message(stream):
    """The next message of ``stream``, or None at its end (a cut message is its end too)."""
    head = _read_exactly(stream, _LENGTH.size)
    if head is None:
        return None
    payload = _read_exactly(stream, _LENGTH.unpack(head)[0])
    return None if payload is None else marshal.loads(payload)


def _read_exactly(stream, size):
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def serve(source, answers):
    """Write every job read from ``source`` and answer each on ``answers``, until ``source`` ends."""
    kept = {}
    last = None
    while True:
        if last is not None:
            _await(source, last)
        job = read_message(source)
        if job is None:
            return
        last = time.monotonic()
        directory, files = job[:2]
        try:
            write_files(directory, files, kept, job[2] if len(job) > 2 else None)
            answer = (0, "")
        except OSError as error:
            answer = (
                error.errno or -1,
                f"{error.strerror or error}" + (f": {error.filename!r}" if error.filename else ""),
            )
        except Exception as error:  # noqa: BLE001 - said to the writer thread, which reports it
            answer = (-1, f"{type(error).__name__}: {error}")
        answers.write(encode(answer))
        answers.flush()


_NAP = 0.002  # seconds between looks at the pipe while steps keep coming
_AWAKE = 1.0  # seconds after a message during which this process naps rather than blocks


def _await(source, last):
    """Return once ``source`` (unbuffered) can be read, or ``_AWAKE`` after the ``last`` message came. Until then
    this process naps and looks rather than blocking in a read: a reader blocked on the pipe is woken by the
    training thread's write, in that thread's time (a wake-up per step's message, more for a large one, which
    it reads in parts, each woken again; docs/benchmarks-log.md, 'The step's files sent once, and without waking
    the writing process'); a napping one costs the writer nothing."""
    fd = source.fileno()
    while time.monotonic() - last < _AWAKE:
        try:
            if select.select([fd], [], [], 0)[0]:
                return
        except (OSError, ValueError):  # a pipe select cannot watch (Windows): the read blocks, as before
            return
        time.sleep(_NAP)


def main():
    import signal

    # Ctrl-C reaches the whole process group: this process finishes what it was given and ends when the
    # training process closes its stdin (at exit, or when it dies)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(sys.stdin.buffer.raw, sys.stdout.buffer)  # unbuffered: ``_await`` asks the pipe itself


if __name__ == "__main__":
    main()
