"""Fixtures shared by every test directory."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Triton's interpreter runs the statistics kernels on CPU tensors (tests/runtime/test_triton_stats.py) only if
# TRITON_INTERPRET is set before Triton is first imported: a kernel defined or launched after an import without
# it fails inside the interpreter. Set here, first, on a machine with no NVIDIA or AMD GPU (their device nodes,
# looked for without importing torch); nothing else runs a Triton kernel on such a machine.
if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")):
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def msprobe_python():
    """An interpreter with mindstudio-probe 26.2 (fixtures/msprobe_env.py), or a skip that says why not."""
    from fixtures import msprobe_env

    try:
        return msprobe_env.msprobe_python()
    except msprobe_env.Unavailable as reason:
        pytest.skip(str(reason))


@pytest.fixture(scope="session")
def megatron_copy(tmp_path_factory):
    """``COPY`` with ``COPY/megatron`` = megatron-core as rewritten by ``python -m msprobe_rewrite --out`` (made once
    per session; the CLI's cache makes a second session fast)."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core is not installed")
    site = Path(importlib.util.find_spec("megatron.core").submodule_search_locations[0]).parent
    copy = tmp_path_factory.mktemp("rewritten")
    result = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "--out", str(copy / "megatron"), "--jobs", "2", str(site)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "0 failed" in result.stdout + result.stderr, result.stdout + result.stderr
    assert (copy / "megatron" / "core" / "models" / "gpt" / "gpt_model.py").read_text().count("__msprobe__") > 10
    return copy
