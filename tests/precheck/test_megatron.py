"""A tiny megatron-core GPT (fixtures/megatron_gpt/train_gpt.py, megatron rewritten by the compiler) with gelu
computed in bfloat16: the pre-check flags Functional.gelu alone; dropout is replayed from its dumped mask and
communication is named as such."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import api_of, run_precheck, verdicts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def megatron_copy(tmp_path_factory):
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core is not installed")
    site = Path(importlib.util.find_spec("megatron.core").submodule_search_locations[0]).parent
    copy = tmp_path_factory.mktemp("rewritten")
    done = subprocess.run([sys.executable, "-m", "msprobe_rewrite", "--out", str(copy / "megatron"), "--jobs", "2",
                           "-q", str(site)], capture_output=True, text=True, timeout=900)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return copy


def test_gpt_flags_gelu_alone(megatron_copy, injected_dump, tmp_path):
    dump = injected_dump("gpt", "Functional.gelu", "bf16", extra_path=(str(megatron_copy),), gpt=True)
    code, _, err = run_precheck(dump, tmp_path, "-j", "2")
    assert code == 1, err
    status, summary = verdicts(tmp_path)
    flagged = {api_of(call) for call, s in status.items() if s in ("error", "warning")}
    assert flagged == {"Functional.gelu"}, err
    assert sum(1 for call, s in status.items() if s == "pass") >= 100
    dropouts = [call for call in status if api_of(call) == "Functional.dropout"]
    assert dropouts and all(status[call] == "pass" for call in dropouts)
    for entry in summary["skipped"]:  # every call not replayed says why
        assert entry["reason"], entry
        if entry["api"].startswith("Distributed."):
            assert "communication" in entry["reason"]
