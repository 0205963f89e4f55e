"""The progress line: one ``\\r``-updated line on stderr while files are processed, only when stderr is a
terminal (a log file or a CI capture gets the summary alone), and cleared before anything else is printed.
"""
from __future__ import annotations

import shutil
import sys
import time
from typing import Optional, TextIO


class Progress:
    # Redrawing for every file would cost more than a cached file takes to process.
    INTERVAL = 0.1

    def __init__(self, total: int, stream: Optional[TextIO] = None, enabled: Optional[bool] = None):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled and total > 0
        self.total = total
        self._last = 0.0
        self._shown = False

    def update(self, done: int, label: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < self.total and now - self._last < self.INTERVAL:
            return
        self._last = now
        width = shutil.get_terminal_size((80, 24)).columns - 1
        line = f"[{done}/{self.total}] {label}"
        if len(line) > width:
            # Keep the end of the path: the file name is the informative part.
            line = line[: max(0, width // 3)] + "…" + line[-(width - width // 3 - 1):] if width > 8 else line[:width]
        self.stream.write("\r" + line + "\x1b[K")
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False
