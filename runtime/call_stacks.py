"""Call stacks for stack.json: captured raw on the training thread, made into msprobe's lines by the writer.

``capture`` runs once per recorded entry, so it keeps only what each frame cannot give later: its code object
and the offset of the instruction it is executing (``f_lasti``, an integer read). The line number, the file
and function names, and the filtering of the runtime's own frames are worked out by ``resolve`` on the writer
thread, from the code object's line table, once per distinct stack. Reading ``f_lineno`` for every frame, as
the training thread did before, walks that table there, frame by frame, entry by entry.

A stack says what the user's program was doing, as msprobe's does: ``resolve`` leaves out the frames of the
tools (this runtime's, and the compiler's: ``msprobe-rewrite run``'s launcher and whatever started it, which a
program started by ``python`` does not have), and torch's ``__torch_function__`` dispatch that brings a call
to the observing mode (``handle_torch_function`` and the function that called it), so that such a call's
stack starts where the call was made, as it does for a call msprobe's wrapper sees.
"""

from __future__ import annotations

import os
import sys

MAX_FRAMES = 64  # stack.json's lines per entry, innermost first
MAX_RAW = 4 * MAX_FRAMES  # frames walked before the runtime's and nn.Module's call frames are dropped

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
# f_lasti is a byte offset into the code, and co_lines maps those offsets to lines, from Python 3.10;
# before that the line itself is taken on the training thread
_OFFSETS = sys.version_info >= (3, 10)


# Code objects of launchers (``msprobe-rewrite run``'s, which runs the user's program): a stack ends at the
# frame inside one, and runpy's frames directly inside it, so that the program's outermost frame is its
# ``<module>`` as under ``python`` (tests/runtime/test_tool_frames.py)
_LAUNCHERS = set()


def hide_launcher(*codes):
    """Leave ``codes``' frames, every frame outside them and runpy's frames just inside them out of stacks."""
    _LAUNCHERS.update(codes)


_CAPTURED = {}  # (code ids, positions, id(outer) or None) -> pair: capture's equal stacks as one object
_CAPTURED_KEPT = 1 << 13  # past it the table starts over (a few thousand call paths is usual)


def capture(frame, anchor=None, outer=None, limit=MAX_RAW):
    """The stack from ``frame`` outwards as a pair ``((code, position, code, position, ...), outer)``.

    ``anchor``: a frame known to be on this stack whose own outer part is already captured as ``outer``
    (``Anchors``, a pair of the same form); the walk stops there, and the pair refers to ``outer`` rather
    than copying it, so every call inside one module shares its outer part, and the resolver reads it once.
    A frame is compared by identity, and only while it runs, so a stack that does not pass through
    ``anchor`` (another thread's) is walked to its end (``outer`` None), or to ``limit`` frames.

    Equal stacks are one pair: a call site gives back the same object every step (the native op's capture
    keeps the same rule), so the resolver knows a stack by its ``id``. The table holds every code object and
    outer pair its keys name by ``id``."""
    raw = []
    append = raw.append
    count = 0
    lasti = _OFFSETS
    anchored = False
    while frame is not None and count < limit:
        append(frame.f_code)
        append(frame.f_lasti if lasti else frame.f_lineno)
        if frame is anchor:
            anchored = True
            break
        frame = frame.f_back
        count += 1
    key = (tuple(map(id, raw[0::2])), tuple(raw[1::2]), id(outer) if anchored else None)
    pair = _CAPTURED.get(key)
    if pair is None:
        pair = (tuple(raw), outer if anchored else None)
        if len(_CAPTURED) >= _CAPTURED_KEPT:
            _CAPTURED.clear()
        pair = _CAPTURED.setdefault(key, pair)
    return pair


def capture_function(native=None):
    """``capture`` as the native op does it (``native.capture``, Python 3.11+: the same pair, made without a
    Python step per frame), or this module's where it has none."""
    made = getattr(native, "capture", None) if native is not None else None  # built on 3.11+ only
    return made if made is not None else capture


class Anchors:
    """The stacks of the module calls running now, so that an API call inside one walks only its own frames.

    nn.Module's ``_call_impl`` calls the global forward pre-hook; that frame (the anchor) and every frame
    outside it stay where they are until the module's forward returns, so the stack outside it is the same for
    every call made inside. It is captured once, on first use, itself up to the enclosing module's anchor.
    ``push`` and ``pop`` follow the module tracker's hooks; the frames are held only while they run."""

    __slots__ = ("_open", "_capture")

    def __init__(self, capture_stack=None):
        self._open = []  # [anchor frame or None, its outer stack or None until first used]
        self._capture = capture_stack if capture_stack is not None else capture  # capture's signature

    def push(self, anchor):
        self._open.append([anchor, None])

    def pop(self):
        if self._open:
            self._open.pop()

    def clear(self):
        """Forget every anchor (a new session: a call left open by the last one, stopped inside a forward,
        would otherwise hold its frame, and the frame its locals)."""
        self._open.clear()

    def capture(self, frame):
        """``capture(frame)``, through the innermost running module call's anchor."""
        open_calls = self._open
        if open_calls:  # the usual case, once the innermost call's outer part is captured: no step below
            anchor, outer = open_calls[-1]
            if outer is not None:
                return self._capture(frame, anchor, outer, MAX_RAW)
        anchor, outer = self._anchored(len(open_calls))
        return self._capture(frame, anchor, outer, MAX_RAW)

    def _anchored(self, end):
        """(anchor, the stack outside it) of the innermost open call before ``end`` that has an anchor, the
        stack captured on first use; (None, None) where none has."""
        open_calls = self._open
        index = end - 1
        while index >= 0 and open_calls[index][0] is None:
            index -= 1
        if index < 0:
            return None, None
        entry = open_calls[index]
        if entry[1] is None:
            anchor, outer = self._anchored(index)
            entry[1] = self._capture(entry[0].f_back, anchor, outer, MAX_RAW)  # a pair
        return entry[0], entry[1]


class Resolver:
    """``resolve(stack)``: the (file, line, function) frames of a captured stack, without the runtime's own
    frames or nn.Module's call machinery, innermost first. One per writer; it remembers what it resolved
    across steps, since the same call sites come back every step.

    A captured stack is one object per distinct stack (``capture``), its outer part too, so both are looked up
    by ``id``, never hashed: a code object's hash is computed from its contents at every call (hundreds of
    nanoseconds for a large function), and a stack's from its every frame. Every table keeps what it names by
    id alive, so no id is taken by another meanwhile. Equal stacks resolve to one tuple (interned), so a caller
    may group entries by the tuple's id; the tables start over only in ``trim``, between steps, so that holds
    throughout a step."""

    _LIMIT = 100_000  # stacks remembered; past it the tables start over

    def __init__(self, skip_files=None):
        self.skip_files = frozenset(_module_call_files() if skip_files is None else skip_files)
        self._tool_dirs = _tool_dirs()
        self._dispatch_file = _dispatch_file()
        self._op_calls = _op_call_codes()
        self._runpy_files = _runpy_files()
        self._codes = {}  # id(code) -> (code, kind, {position: line})
        self._stacks = {}  # id(pair) -> (pair, frames): a stack, or the outer part of one
        self._interned = {}  # frames -> frames

    def trim(self):
        """Start over where the tables grew past their limits (called between steps)."""
        if len(self._stacks) >= self._LIMIT:
            self._stacks.clear()
            self._interned.clear()

    def resolve(self, stack):
        known = self._stacks.get(id(stack))
        if known is not None and known[0] is stack:
            return known[1]
        raw, outer = stack
        frames = []
        kinds = []
        launched = False
        for code, position in zip(raw[0::2], raw[1::2]):
            info = self._code(code)
            kind = info[1]
            if kind is _LAUNCHER:
                launched = True
                break
            if kind is not _DROPPED:
                frames.append((code.co_filename, self._line(info, position), code.co_name))
                kinds.append(kind)
                if len(frames) == MAX_FRAMES:
                    break
        if launched:  # runpy's frames between the launcher and the program are the launcher's too
            while kinds and kinds[-1] is _RUNPY:
                kinds.pop()
                frames.pop()
        if kinds and kinds[0] is _DISPATCH:
            # a call the observing mode saw through handle_torch_function: that frame and the function that
            # called it (the API itself) are not the call site; msprobe's wrapper is called where the user
            # called the API (Functional.batch_norm at batchnorm.py:210, not at overrides.py)
            start = 0
            while start < len(kinds) and kinds[start] is _DISPATCH:
                start += 1
            frames = frames[start + 1 :]
        elif kinds and kinds[0] is _OP_CALL:
            # a torch.ops operator the observing mode saw (custom_op_namespaces): its __call__ frames are the
            # operator's machinery; msprobe's wrapper of torch.ops.<ns>.<op> is called at the user's line
            # (tests/runtime/test_custom_ops.py)
            start = 0
            while start < len(kinds) and kinds[start] is _OP_CALL:
                start += 1
            frames = frames[start:]
        outer_frames = () if outer is None or launched else self.resolve(outer)
        frames = (tuple(frames) + outer_frames)[:MAX_FRAMES]
        frames = self._interned.setdefault(frames, frames)
        self._stacks[id(stack)] = (stack, frames)
        return frames

    def _code(self, code):
        info = self._codes.get(id(code))
        if info is None:
            info = self._codes[id(code)] = (code, self._kind(code), {})
        return info

    def _kind(self, code):
        filename = code.co_filename
        if code in _LAUNCHERS:
            return _LAUNCHER
        if (
            filename.startswith(_RUNTIME_DIR)
            or filename in self.skip_files
            or any(filename.startswith(folder) for folder in self._tool_dirs)
        ):
            return _DROPPED
        if filename == self._dispatch_file:
            return _DISPATCH
        if any(code is call for call in self._op_calls):
            return _OP_CALL
        if filename in self._runpy_files:
            return _RUNPY
        return _KEPT

    @staticmethod
    def _line(info, position):
        if not _OFFSETS:
            return position
        lines = info[2]
        line = lines.get(position)
        if line is None:
            line = lines[position] = _line_at(info[0], position)
        return line


# what a frame is to ``resolve`` (compared by identity)
_KEPT, _DROPPED, _LAUNCHER, _DISPATCH, _RUNPY = "kept", "dropped", "launcher", "dispatch", "runpy"
_OP_CALL = "operator call"  # an OpOverload's, a packet's or a CustomOpDef's __call__: dropped where innermost


def _tool_dirs():
    """The compiler's package folder (its import hook, its CLI) where it is loaded: none of its frames is the
    user's. This runtime's own folder is ``_RUNTIME_DIR``."""
    module = sys.modules.get("msprobe_rewrite")
    path = getattr(module, "__file__", None) if module is not None else None
    return (os.path.dirname(os.path.abspath(path)) + os.sep,) if isinstance(path, str) else ()


def _dispatch_file():
    """torch's overrides.py, whose handle_torch_function hands a call to a TorchFunctionMode."""
    overrides = sys.modules.get("torch.overrides")
    return getattr(overrides, "__file__", None) if overrides is not None else None


def _op_call_codes():
    """The code of the ``__call__`` of torch's operator objects (torch.ops packets and overloads, and the
    CustomOpDef of torch.library.custom_op), where torch is loaded."""
    codes = []
    for module_name, class_names in (
        ("torch._ops", ("OpOverload", "OpOverloadPacket")),
        ("torch._library.custom_ops", ("CustomOpDef",)),
    ):
        module = sys.modules.get(module_name)
        for class_name in class_names:
            call = getattr(getattr(module, class_name, None), "__call__", None)
            code = getattr(call, "__code__", None)
            if code is not None:
                codes.append(code)
    return tuple(codes)


def _runpy_files():
    import runpy

    return frozenset({runpy.run_module.__code__.co_filename, runpy.__file__})


def _module_call_files():
    """nn.Module's own file, whose ``_call_impl`` frames msprobe's stacks do not show (torch is imported by
    the time a stack is resolved: the collector that captured it imported it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    return (os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "nn", "modules", "module.py"),)


def _line_at(code, offset):
    """The line of the instruction at byte ``offset`` (what ``frame.f_lineno`` reads), None where none is."""
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line
    return None
