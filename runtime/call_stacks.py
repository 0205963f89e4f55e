"""Call stacks for stack.json: captured raw on the training thread, made into msprobe's lines by the writer.

``capture`` runs once per recorded entry, so it keeps only what each frame cannot give later: its code object
and the offset of the instruction it is executing (``f_lasti``, an integer read). The line number, the file
and function names, and the filtering of the runtime's own frames are worked out by ``resolve`` on the writer
thread, from the code object's line table, once per distinct stack. Reading ``f_lineno`` for every frame, as
the training thread did before, walks that table there, frame by frame, entry by entry.
"""
from __future__ import annotations

import os
import sys

MAX_FRAMES = 64       # stack.json's lines per entry, innermost first
MAX_RAW = 4 * MAX_FRAMES  # frames walked before the runtime's and nn.Module's call frames are dropped

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
# f_lasti is a byte offset into the code, and co_lines maps those offsets to lines, from Python 3.10;
# before that the line itself is taken on the training thread
_OFFSETS = sys.version_info >= (3, 10)


def capture(frame, anchor=None, outer=None, limit=MAX_RAW):
    """The stack from ``frame`` outwards as a pair ``((code, position, code, position, ...), outer)``.

    ``anchor``: a frame known to be on this stack whose own outer part is already captured as ``outer``
    (``Anchors``, a pair of the same form); the walk stops there, and the pair refers to ``outer`` rather
    than copying it, so every call inside one module shares its outer part, and the resolver reads it once.
    A frame is compared by identity, and only while it runs, so a stack that does not pass through
    ``anchor`` (another thread's) is walked to its end (``outer`` None), or to ``limit`` frames."""
    raw = []
    append = raw.append
    count = 0
    lasti = _OFFSETS
    while frame is not None and count < limit:
        append(frame.f_code)
        append(frame.f_lasti if lasti else frame.f_lineno)
        if frame is anchor:
            return tuple(raw), outer
        frame = frame.f_back
        count += 1
    return tuple(raw), None


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
        index = self._anchored(len(self._open) - 1)
        if index < 0:
            return self._capture(frame, None, None, MAX_RAW)
        anchor, outer = self._outer(index)
        return self._capture(frame, anchor, outer, MAX_RAW)

    def _anchored(self, index):
        """The nearest open call at or below ``index`` that has an anchor; -1 where none has."""
        while index >= 0 and self._open[index][0] is None:
            index -= 1
        return index

    def _outer(self, index):
        """(anchor, the stack outside it) of open call ``index``, captured on first use."""
        entry = self._open[index]
        if entry[1] is None:
            parent = self._anchored(index - 1)
            start = entry[0].f_back
            anchor, outer = self._outer(parent) if parent >= 0 else (None, None)
            entry[1] = self._capture(start, anchor, outer, MAX_RAW)  # a pair
        return entry[0], entry[1]


class Resolver:
    """``resolve(stack)``: the (file, line, function) frames of a captured stack, without the runtime's own
    frames or nn.Module's call machinery, innermost first. One per writer; it remembers what it resolved
    across steps, since the same call sites come back every step.

    Code objects and outer parts are looked up by ``id``, never hashed: a code object's hash is computed from
    its contents at every call (hundreds of nanoseconds for a large function), and a stack's from its every
    frame. Every table keeps what it names by id alive, so no id is taken by another meanwhile. Equal stacks
    resolve to one tuple (interned), so a caller may group entries by the tuple's id; the tables start over
    only in ``trim``, between steps, so that holds throughout a step."""

    _LIMIT = 100_000  # stacks remembered; past it the tables start over
    _OUTER_LIMIT = 4096  # outer parts remembered: new ones come with every step's module calls

    def __init__(self, skip_files=None):
        self.skip_files = frozenset(_module_call_files() if skip_files is None else skip_files)
        self._codes = {}     # id(code) -> (code, kept, {position: line})
        self._stacks = {}    # (code ids, positions, id(outer frames)) -> (raw, outer frames, frames)
        self._outers = {}    # id(outer pair) -> (outer pair, frames): one module call's outer part
        self._interned = {}  # frames -> frames

    def trim(self):
        """Start over where the tables grew past their limits (called between steps)."""
        if len(self._outers) >= self._OUTER_LIMIT:
            self._outers.clear()  # a key of ``_stacks`` names resolved frames, which ``_interned`` holds
        if len(self._stacks) >= self._LIMIT:
            self._stacks.clear()
            self._interned.clear()

    def resolve(self, stack):
        raw, outer = stack
        if outer is None:
            outer_frames = ()
        else:
            known = self._outers.get(id(outer))
            if known is None or known[0] is not outer:
                known = self._outers[id(outer)] = (outer, self.resolve(outer))
            outer_frames = known[1]
        codes, positions = raw[0::2], raw[1::2]
        key = (tuple(map(id, codes)), positions, id(outer_frames))
        known = self._stacks.get(key)
        if known is not None:
            return known[2]
        frames = []
        for code, position in zip(codes, positions):
            info = self._code(code)
            if info[1]:
                frames.append((code.co_filename, self._line(info, position), code.co_name))
                if len(frames) == MAX_FRAMES:
                    break
        frames = (tuple(frames) + outer_frames)[:MAX_FRAMES]
        frames = self._interned.setdefault(frames, frames)
        self._stacks[key] = (raw, outer_frames, frames)
        return frames

    def _code(self, code):
        info = self._codes.get(id(code))
        if info is None:
            filename = code.co_filename
            kept = not filename.startswith(_RUNTIME_DIR) and filename not in self.skip_files
            info = self._codes[id(code)] = (code, kept, {})
        return info

    @staticmethod
    def _line(info, position):
        if not _OFFSETS:
            return position
        lines = info[2]
        line = lines.get(position)
        if line is None:
            line = lines[position] = _line_at(info[0], position)
        return line


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
