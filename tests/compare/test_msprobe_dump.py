"""compare reads dumps written by msprobe itself (fixtures/msprobe_dump, mindstudio-probe 26.2.0)."""

import json
import shutil

from msprobe_rewrite.compare import compare_runs

from .conftest import MSPROBE_DUMP


def test_msprobe_dump_against_itself(tmp_path):
    summary = compare_runs(MSPROBE_DUMP, MSPROBE_DUMP, str(tmp_path / "out"))
    assert summary["first_divergence"] is None
    [pair] = summary["pairs"]
    assert pair["level"] == "mix" and pair["task"] == "statistics"
    assert pair["matched"] == pair["entries_a"] == 18 and pair["tensors_compared"] == 48


def test_msprobe_dump_against_a_perturbed_copy(tmp_path):
    copy = tmp_path / "perturbed"
    shutil.copytree(MSPROBE_DUMP, copy)
    [dump_json] = copy.glob("step0/*/dump.json")
    dump = json.loads(dump_json.read_text())
    record = dump["data"]["Torch.tanh.0.forward"]["output"][0]
    for key in ("Max", "Min", "Mean", "Norm"):
        record[key] *= 1.01
    dump_json.write_text(json.dumps(dump, indent=1))
    summary = compare_runs(str(copy), MSPROBE_DUMP, str(tmp_path / "out"))
    first = summary["first_divergence"]
    assert first["entry"] == "Torch.tanh.0.forward" and first["kind"] == "outputs"
    assert first["call_site"].endswith("tiny_msprobe.py:17")  # from msprobe's stack.json, past its hooks
    assert first["chain_length"] == 0  # only that record was edited: nothing after it differs
    assert summary["pairs"][0]["matched"] == 18


def test_call_sites_are_the_users_lines_past_torch():
    from msprobe_rewrite.compare.loading import discover, read_call_sites

    [dump] = discover(MSPROBE_DUMP)
    sites = read_call_sites(dump)
    assert sites["Module.fc1.Linear.forward.0"].endswith("tiny_msprobe.py:16")
    # msprobe's stack for F.linear starts at torch's linear.py:134; the user's line is the self.fc1(x) that
    # led there (tests/runtime/test_tool_frames.py holds the same for our dumps)
    assert sites["Functional.linear.0.forward"].endswith("tiny_msprobe.py:16")
