"""seed_all: msprobe's seeding helper, so two runs can be compared bit for bit; and config.json's seed."""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .reproducibility import Reproducibility

DEFAULT_SEED = 1234


def seed_all(
    seed: int = DEFAULT_SEED, mode: bool = False, rm_dropout: bool = False, is_enhanced: bool = False
) -> "Reproducibility":
    """Seed Python, NumPy (when installed) and torch on every device; ``mode=True`` also asks for
    deterministic algorithms and deterministic communication (HCCL, cuBLAS workspace).

    ``rm_dropout=True`` runs every dropout with p=0 and ``is_enhanced=True`` resets the random state saved here
    around every torch random API call, as msprobe does, but on the calling thread through a torch function
    mode instead of replaced torch attributes (``reproducibility``). Returns a handle whose ``restore()``
    (or the end of a ``with`` block) turns both off again."""
    # msprobe's own checks (reproducibility/common.py): a float or bool seed is refused, not truncated
    if type(seed) is not int or not 0 <= seed <= 2**32 - 1:
        raise ValueError(f"seed_all: seed must be an int in [0, 2**32-1], got {seed!r}")
    if type(mode) is not bool:
        raise TypeError(f"seed_all: mode must be a bool, got {mode!r}")
    if type(rm_dropout) is not bool or type(is_enhanced) is not bool:
        raise TypeError(f"seed_all: rm_dropout and is_enhanced must be bools, got {rm_dropout!r}, {is_enhanced!r}")
    import torch

    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        pass  # no NumPy: nothing of it to seed
    else:
        numpy.random.seed(seed)
    torch.manual_seed(seed)  # seeds every device generator torch knows (CUDA, NPU through its backend)
    if mode:
        os.environ["HCCL_DETERMINISTIC"] = "true"
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        os.environ["LCCL_DETERMINISTIC"] = "1"
        torch.use_deterministic_algorithms(True)
        if hasattr(torch.backends, "cudnn"):
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
    from .reproducibility import Reproducibility, replace_for_thread

    if rm_dropout or is_enhanced:  # replaces an earlier call's settings; a plain seed_all keeps them, as msprobe's
        replace_for_thread()
    return Reproducibility(rm_dropout, is_enhanced)  # after seeding: is_enhanced saves the fresh state


def apply_config(config: Any) -> bool:
    """config.json's ``seed`` and ``is_deterministic``, applied when the debugger is built, as msprobe's
    PrecisionDebugger did with ``seed_all(seed, mode=is_deterministic)``. Neither key set: nothing happens, and
    torch is not imported (construction stays free of torch). Returns whether it seeded."""
    if config.seed is None and not config.is_deterministic:
        return False
    seed_all(DEFAULT_SEED if config.seed is None else config.seed, mode=config.is_deterministic)
    return True
