"""The tool's one cache folder, and its sub-folder for each user of it.

``$MSPROBE_CACHE_DIR``, else ``$XDG_CACHE_HOME/msprobe-rewrite``, else ``~/.cache/msprobe-rewrite``, holds
``rewrite/`` (the rewrite command's result cache, ``msprobe_rewrite/cache.py``) and ``native/`` (the native
statistics op's build, ``native_stats.py``). Before, the two had separate roots whose default names differed
by one character (``msprobe-rewrite`` and ``msprobe_rewrite``), so a user who cleared one kept the other
(tests/test_cache_folders.py). ``$MSPROBE_REWRITE_CACHE_DIR``, the rewrite cache's own variable before the
root existed, is kept for compatibility: set, it is that cache's folder itself.

Here, in the runtime, because the runtime must find its build folder without libcst; the compiler imports it
from here. Only ``os``: importing it imports neither torch nor libcst.
"""

import os

ROOT_VARIABLE = "MSPROBE_CACHE_DIR"
REWRITE_VARIABLE = "MSPROBE_REWRITE_CACHE_DIR"  # older name of the rewrite cache's folder (compatibility)
NAME = "msprobe-rewrite"
REWRITE = "rewrite"
NATIVE = "native"


def cache_root():
    """The folder that holds every cache of the tool (an empty variable counts as unset, as before)."""
    root = os.environ.get(ROOT_VARIABLE)
    if root:
        return root
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, NAME)


def rewrite_cache_folder():
    """The rewrite command's result cache: ``$MSPROBE_REWRITE_CACHE_DIR`` where set, else ``rewrite/``."""
    return os.environ.get(REWRITE_VARIABLE) or os.path.join(cache_root(), REWRITE)


def native_cache_folder():
    """Where the native statistics op's builds go, one folder per build key."""
    return os.path.join(cache_root(), NATIVE)
