"""Dump entry names taken apart, by the grammar the collector builds them with (``msprobe_runtime.dump_names``):
the API or module, the direction, and the call index that alignment ignores."""

from __future__ import annotations

from msprobe_runtime.dump_names import DIRECTIONS, forward_name, is_module, split_name  # noqa: F401
