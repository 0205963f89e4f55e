"""seed_all: msprobe's seeding helper, so two runs can be compared bit for bit."""
from __future__ import annotations

import os
import random


def seed_all(seed=1234, mode=False, rm_dropout=False):
    """Seed Python, NumPy (when installed) and torch on every device; ``mode=True`` also asks for
    deterministic algorithms and deterministic communication (HCCL, cuBLAS workspace)."""
    import torch

    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        numpy = None
    if numpy is not None:
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
    if rm_dropout:
        raise NotImplementedError("rm_dropout would patch torch, which this runtime never does")
