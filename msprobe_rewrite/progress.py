"""The progress line: one ``\\r``-updated line on stderr while work goes on (files rewritten, dump entries
compared), only when stderr is a terminal (a log file or a CI capture gets the summary alone), and cleared
before anything else is printed. The one progress display of every command.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Optional, TextIO


class Progress:
    # Redrawing for every file would cost more than a cached file takes to process.
    INTERVAL = 0.1

    def __init__(
        self,
        total: Optional[int] = None,
        stream: Optional[TextIO] = None,
        enabled: Optional[bool] = None,
        interval: float = INTERVAL,
    ):
        """``total``: the count of the whole work, when known up front (0: nothing to show)."""
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled and total != 0
        self.total = total
        self.interval = interval
        self._last = 0.0
        self._shown = False

    def update(self, done: int, label: str = "", total: Optional[int] = None) -> None:
        """``done`` of ``total`` (or of the total given at construction) units, the current one ``label``."""
        if not self.enabled:
            return
        total = self.total if total is None else total
        now = time.monotonic()
        if (total is None or done < total) and now - self._last < self.interval:
            return
        self._last = now
        width = shutil.get_terminal_size((80, 24)).columns - 1
        line = f"[{done}/{total}] {label}" if total else f"[{done}] {label}"
        if len(line) > width:
            # Keep the end of the path: the file name is the informative part.
            line = line[: max(0, width // 3)] + "…" + line[-(width - width // 3 - 1) :] if width > 8 else line[:width]
        self.stream.write("\r" + line + "\x1b[K")
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False
