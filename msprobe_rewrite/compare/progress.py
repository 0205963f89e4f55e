"""A one-line progress display on stderr, shown only when stderr is a terminal (never in logs or pipes)."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class Progress:
    def __init__(self, stream: Optional[TextIO] = None, enabled: Optional[bool] = None, interval: float = 0.2):
        self.stream = stream or sys.stderr
        if enabled is None:
            enabled = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.enabled = enabled
        self.interval = interval
        self._last = 0.0
        self._shown = False

    def update(self, label: str, done: int, total: Optional[int] = None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        self._last = now
        text = f"{label}: {done}" + (f"/{total} ({100 * done // max(total, 1)}%)" if total else "")
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False
