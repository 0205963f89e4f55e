"""The rewritten copy of megatron-core, shared by the tests of this directory (made once per session; the CLI's
cache makes a second session fast)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SITE_MEGATRON = (Path(importlib.util.find_spec("megatron.core").submodule_search_locations[0]).parent
                 if importlib.util.find_spec("megatron") is not None else None)


@pytest.fixture(scope="session")
def megatron_copy(tmp_path_factory):
    """``COPY`` with ``COPY/megatron`` = megatron-core as rewritten by ``python -m msprobe_rewrite --out``."""
    if SITE_MEGATRON is None:
        pytest.skip("megatron-core is not installed")
    copy = tmp_path_factory.mktemp("rewritten")
    result = subprocess.run([sys.executable, "-m", "msprobe_rewrite", "--out", str(copy / "megatron"), "--jobs", "2",
                             str(SITE_MEGATRON)], capture_output=True, text=True, timeout=900)
    assert result.returncode in (0, 1), result.stdout[-2000:] + result.stderr[-4000:]  # 1: files changed
    assert "0 failed" in result.stdout + result.stderr, result.stdout + result.stderr
    assert (copy / "megatron" / "core" / "models" / "gpt" / "gpt_model.py").read_text().count("__msprobe__") > 10
    return copy
