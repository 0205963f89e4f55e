"""A dump path's earlier dumps, met at a run's first ``start()``: refused by default, so that no run is lost by
mistake; replaced under ``MSPROBE_DUMP_OVERWRITE=1``, msprobe's behaviour (its FAQ: dumping into the same
directory again overwrites the last result).

Replacing removes every ``step{N}/{leaf}`` folder of the earlier dump that this process would write into or be
confused with (``rank{R}`` for its rank; without a rank, every leaf, as the refusal looks at), so that no step or
tensor file of the old run stays beside the new one for compare to pair. A ``proc{pid}`` folder of a process
still alive is kept: it may be a sibling writing now (test_overwrite_switch_replaces_the_earlier_dump).
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
from typing import List, Optional

from .switches import switched_on

logger = logging.getLogger("msprobe_runtime")

OVERWRITE_SWITCH = "MSPROBE_DUMP_OVERWRITE"
_MARKS = ("dump.json", "debug.json")  # a folder holding either is a dump


class DumpPathError(FileExistsError):
    """The dump path already holds a dump from another run; nothing was overwritten."""


def overwrite_requested() -> bool:
    return switched_on(OVERWRITE_SWITCH, default="0")


def _leaf(rank: Optional[int]) -> str:
    return f"rank{rank}" if rank is not None else "*"


def found(root: str, rank: Optional[int]) -> List[str]:
    """The dump.json and debug.json files of earlier dumps this process would collide with, sorted."""
    pattern = os.path.join(glob.escape(root), "step*", _leaf(rank))
    return sorted(path for mark in _MARKS for path in glob.glob(os.path.join(pattern, mark)))


def _alive(folder: str) -> bool:
    match = re.fullmatch(r"proc(\d+)", os.path.basename(folder))
    if match is None:
        return False
    try:
        os.kill(int(match.group(1)), 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # it exists: someone else's
        return True
    return True


def refuse_or_replace(root: str, rank: Optional[int]) -> None:
    """Raise DumpPathError when ``root`` holds an earlier dump, unless the overwrite switch is on: then remove it."""
    existing = found(root, rank)
    if not existing:
        return
    if not overwrite_requested():
        raise DumpPathError(
            f"msprobe_runtime: {root!r} already holds a dump ({os.path.relpath(existing[0], root)}); nothing was "
            f"overwritten. Choose a new dump_path, remove the old dump, or set {OVERWRITE_SWITCH}=1 to replace it "
            "as msprobe does."
        )
    folders = sorted({os.path.dirname(path) for path in existing})
    removed = [folder for folder in folders if not _alive(folder)]
    for folder in removed:
        shutil.rmtree(folder)
        try:
            os.rmdir(os.path.dirname(folder))  # the step folder, once nothing else is in it
        except OSError:
            pass
    logger.warning(
        "msprobe_runtime: %s=1: removed the earlier dump in %r (%d folder(s), %s)",
        OVERWRITE_SWITCH,
        root,
        len(removed),
        ", ".join(os.path.relpath(folder, root) for folder in removed[:4]) + (", ..." if len(removed) > 4 else ""),
    )
