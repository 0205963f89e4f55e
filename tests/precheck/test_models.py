"""The pre-check flags exactly the API made imprecise, and passes every other API of the same dump (BigNet,
the nested model, msprobe's own tensor dump); the tiny megatron GPT is in test_megatron.py (slow)."""

import json
import os

import pytest

from .conftest import MSPROBE_TENSOR_DUMP, api_of, run_precheck, verdicts

pytestmark = pytest.mark.slow  # over 2 s a test: each test dumps and replays a model


def flagged_apis(out):
    status, _ = verdicts(out)
    return {api_of(call) for call, s in status.items() if s in ("error", "warning")}, status


# one case per model in the fast subset (make check); the other two in the full suite
@pytest.mark.parametrize(
    "fixture, api, mode",
    [
        ("fixtures/bignet/bignet.py", "Tensor.__add__", "bias"),
        pytest.param("fixtures/bignet/bignet.py", "Tensor.__add__", "bf16", marks=pytest.mark.slow),
        ("fixtures/nested_model/nested.py", "Functional.silu", "bf16"),
        pytest.param("fixtures/nested_model/nested.py", "Torch.tanh", "bias", marks=pytest.mark.slow),
    ],
)
def test_flags_exactly_the_imprecise_api(injected_dump, tmp_path, fixture, api, mode):
    dump = injected_dump(fixture, api, mode)
    code, _, err = run_precheck(dump, tmp_path, "-j", "2")
    assert code == 1, err
    flagged, status = flagged_apis(tmp_path)
    assert flagged == {api}, err
    calls = [call for call in status if api_of(call) == api]
    assert calls and all(status[call] == "error" for call in calls)
    # everything else was replayed and passed: nothing silently left out
    others = {call: s for call, s in status.items() if api_of(call) != api}
    assert len(others) >= 8 and set(others.values()) <= {"pass"}, others
    assert "Traceback" not in err


def test_a_clean_dump_passes_and_compares_backward(injected_dump, tmp_path):
    dump = injected_dump("fixtures/nested_model/nested.py")
    code, _, err = run_precheck(dump, tmp_path, "-j", "1")
    assert code == 0, err
    status, summary = verdicts(tmp_path)
    assert summary["counts"]["error"] == 0 and summary["counts"]["skip"] == 0
    rows = open(os.path.join(tmp_path, "precheck_result.csv")).read()
    assert ",backward,grad_input.0," in rows  # input gradients were replayed through autograd and graded
    assert {api_of(c) for c in status} >= {
        "Functional.linear",
        "Functional.layer_norm",
        "Functional.gelu",
        "Torch.tanh",
        "Tensor.__mul__",
        "Functional.silu",
    }


def test_reads_msprobes_own_tensor_dump(tmp_path):
    code, _, err = run_precheck(MSPROBE_TENSOR_DUMP, tmp_path, "-j", "1")
    assert code == 0, err
    status, summary = verdicts(tmp_path)
    assert set(status) == {
        "Functional.linear.0",
        "Functional.gelu.0",
        "Torch.tanh.0",
        "Tensor.__add__.0",
        "Functional.linear.1",
        "Tensor.sum.0",
    }
    assert set(status.values()) == {"pass"}
    rows = open(os.path.join(tmp_path, "precheck_result.csv")).read()
    assert "Functional.linear.0,step0/proc16458,backward,grad_input.2" in rows  # weightᵀ, in the node's order


def test_reports_list_failing_apis_first_with_a_plot(injected_dump, tmp_path):
    dump = injected_dump("fixtures/nested_model/nested.py", "Functional.silu", "bf16")
    run_precheck(dump, tmp_path, "-j", "2")
    page = open(os.path.join(tmp_path, "precheck_report.html"), encoding="utf-8").read()
    failing = page.index("Failing APIs")
    assert page.index("Functional.silu.0", failing) < page.index("Passed (")
    assert page.count("<svg") >= 1 and "Functional.silu.0 forward output.0" in page
    summary = json.load(open(os.path.join(tmp_path, "precheck_summary.json")))
    assert summary["failing"][0]["api"] == "Functional.silu.0"
    assert summary["counts"]["pass"] >= 8


def test_full_runs_the_cpu_replay_for_every_row(injected_dump, tmp_path):
    # by default the CPU replay runs only where it can change a verdict; --full fills every row's CPU figure
    dump = injected_dump("fixtures/nested_model/nested.py")
    code, _, err = run_precheck(dump, tmp_path, "-j", "2", "--full")
    assert code == 0, err
    import csv

    with open(os.path.join(tmp_path, "precheck_result.csv"), encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["Status"] in ("pass", "error", "warning")]
    assert rows and all(r["CPU"] != "" for r in rows)
