"""The environment's on/off switches (``MSPROBE_NATIVE_STATS``, ``MSPROBE_WRITER_PROCESS``...), read by name.

A leaf: it imports nothing of the runtime, so any module may read a switch. When ``switched_on`` lived in
``config``, ``native_stats`` importing it closed the cycle config -> checksums -> statistics -> native_stats ->
config (tests/test_import_graph.py).
"""

import os


def switched_on(name: str, default: str = "1") -> bool:
    """Whether the environment's on/off switch ``name`` is on: it is, unless set to 0, false, no or off (or unset,
    where ``default`` is "0")."""
    return os.environ.get(name, default).strip().lower() not in ("0", "false", "no", "off")
