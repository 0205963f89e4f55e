"""A tiny megatron-core GPT (fixtures/megatron_gpt/train_gpt.py, megatron rewritten by the compiler) with gelu
computed in bfloat16: the pre-check flags Functional.gelu alone; dropout is replayed from its dumped mask and
communication is named as such."""

import pytest

from .conftest import api_of, run_precheck, verdicts

pytestmark = pytest.mark.slow


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
