"""Read a JSON object one member at a time, so a dump.json of any size never sits whole in memory.

``json`` has no incremental parser; ``JSONDecoder.raw_decode`` (C-accelerated) decodes one value from a
string at an offset, so a buffer that grows only while a single value is incomplete is enough. A dump's
entries are small; the whole file is large.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Optional, TextIO, Tuple

_WS = " \t\n\r"
_CHUNK = 1 << 20


class JsonStreamError(ValueError):
    """The file is not the JSON object it should be (with the byte offset where reading failed)."""


class _Reader:
    def __init__(self, handle: TextIO):
        self.handle = handle
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.consumed = 0  # characters dropped from the front of buf, for error positions
        self.decoder = json.JSONDecoder()

    def _more(self, want: int = _CHUNK) -> bool:
        if self.eof:
            return False
        chunk = self.handle.read(max(want, _CHUNK))
        if not chunk:
            self.eof = True
            return False
        if self.pos:
            self.consumed += self.pos
            self.buf = self.buf[self.pos :]
            self.pos = 0
        self.buf += chunk
        return True

    def peek(self) -> str:
        """The next non-whitespace character ('' at the end of the file), not consumed."""
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self._more():
                return ""

    def expect(self, char: str) -> None:
        found = self.peek()
        if found != char:
            self.fail(f"expected {char!r}, found {found or 'the end of the file'!r}")
        self.pos += 1

    def value(self) -> Any:
        """Decode one JSON value; the buffer grows until the value is complete."""
        self.peek()
        want = _CHUNK
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as error:
                if self.eof or not self._more(want):
                    self.fail(error.msg)
                want *= 2  # a value longer than the buffer: grow geometrically, not chunk by chunk
                continue
            # a number or literal that ends exactly at the buffer's end may continue in the next chunk
            if end >= len(self.buf) and not self.eof and self._more(want):
                continue
            self.pos = end
            return value

    def fail(self, message: str):
        raise JsonStreamError(f"{message} at character {self.consumed + self.pos}")


def iter_members(
    handle: TextIO,
    stream_key: Optional[str] = None,
    on_header: Optional[Callable[[str, Any], None]] = None,
    on_stream: Optional[Callable[[], None]] = None,
) -> Iterator[Tuple[str, Any]]:
    """Yield the members of the top-level object in ``handle``.

    With ``stream_key``, that member's value (an object) is not built: its members are yielded one by one
    instead (``on_stream()`` is called when it is reached, so that an empty one is told from none), and every
    other top-level member goes to ``on_header(key, value)`` as it is read.
    """
    reader = _Reader(handle)
    if stream_key is None:
        yield from _inner(reader)
        return
    reader.expect("{")
    if reader.peek() == "}":
        reader.pos += 1
        return
    while True:
        key = reader.value()
        if not isinstance(key, str):
            reader.fail("expected a member name")
        reader.expect(":")
        if key == stream_key:
            if on_stream is not None:
                on_stream()
            if reader.peek() == "{":
                yield from _inner(reader)
            else:
                value = reader.value()
                if value is not None:
                    reader.fail(f"{stream_key!r} is not an object")
        else:
            value = reader.value()
            if on_header is not None:
                on_header(key, value)
        following = reader.peek()
        reader.pos += 1
        if following == "}":
            return
        if following != ",":
            reader.pos -= 1
            reader.fail("expected ',' or '}'")


def _inner(reader: _Reader) -> Iterator[Tuple[str, Any]]:
    reader.expect("{")
    if reader.peek() == "}":
        reader.pos += 1
        return
    while True:
        key = reader.value()
        if not isinstance(key, str):
            reader.fail("expected a member name")
        reader.expect(":")
        yield key, reader.value()
        following = reader.peek()
        reader.pos += 1
        if following == "}":
            return
        if following != ",":
            reader.pos -= 1
            reader.fail("expected ',' or '}'")
