"""CSV reports that a spreadsheet opens as text, never as formulas.

A cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is taken by Excel, LibreOffice
and Google Sheets for a formula, and a report's cells carry text from a dump (entry and module names, call
sites, messages) that whoever made the dump chose. Such a cell is written with a leading ``'``, the mark that
spreadsheets read as "text" (OWASP's advice for CSV injection); a number, negative or a percentage, is left as
it is. msprobe's own ``write_csv`` refuses these cells; escaping them keeps the row.
"""

from __future__ import annotations

import csv
import re

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?%?|inf|nan)", re.IGNORECASE)


def safe_cell(value):
    """``value`` as a cell no spreadsheet evaluates: text that would start a formula gets a leading ``'``."""
    if isinstance(value, str) and value.startswith(_FORMULA_START) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


class SafeCsvWriter:
    """``csv.writer(handle)`` whose rows go through ``safe_cell``."""

    __slots__ = ("_writer",)

    def __init__(self, handle):
        self._writer = csv.writer(handle)

    def writerow(self, row):
        return self._writer.writerow([safe_cell(value) for value in row])
