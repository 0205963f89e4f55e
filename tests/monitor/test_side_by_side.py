"""msprobe 26.2's own TrainerMon and ours, side by side (issue 35's tests, second bullet): the same tiny MLP, data,
seed and config, each in a subprocess (msprobe in its venv, fixtures/msprobe_env.py), then the same CSV file names,
the same columns and rows, the same figures within float32 rounding; msprobe's csv2tb reads ours; and where we
differ by design (docs/monitor.md), the difference is asserted, not skipped.

What msprobe's TrainerMon needs on a CPU with torch only: nothing stubbed (no torch_npu needed); but where megatron
is importable (our venv has it) msprobe patches megatron's gradient buckets and hooks no weight gradient of a plain
module, so it writes no grad_unreduced file; side_by_side_run.py hides megatron from msprobe's process, as a bare
module's user has it.

Tolerance: msprobe casts each tensor to float64 before its figures, ours accumulates norm and mean in float32. min,
max and the NaN count are exact; norm, mean and the share of zeros agree within ``REL = 1e-6`` (about 8 float32
units in the last place) of the tensor's largest magnitude: a mean near zero is a difference of large sums, so its
error is relative to the elements, not to itself. Written with ``ndigits`` 12 so that the files show it.
"""

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from msprobe_rewrite import cli, monitor_report

pytestmark = pytest.mark.slow  # each run starts a Python with torch (msprobe's imports take seconds)

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "side_by_side_run.py"
OPS = ["min", "max", "norm", "zeros", "nans", "mean"]
CONFIG = {
    "targets": {},
    "wg_distribution": True,
    "param_distribution": True,
    "mv_distribution": True,
    "ur_distribution": True,  # msprobe 26.2 cancels it with CSV output; we write it (asserted below)
    "ops": OPS,
    "format": "csv",
    "ndigits": 12,
}
STEPS = 4
REL = 1e-6
EXACT = ("min", "max", "nans")
OURS_ONLY = ("adam_update", "adam_ratio")
CSV2TB_KINDS = ("exp_avg", "exp_avg_sq", "grad_unreduced", "grad_reduced", "param_origin", "param_updated")


def _env():
    # our runtime and msprobe_rewrite as this process finds them (a symlinked msprobe_runtime or an install)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def _run(python, which, folder, *extra, config=None, steps=STEPS):
    """One monitored run -> (the rank folder, the runner's JSON line, its log: stdout and stderr)."""
    folder.mkdir(parents=True)
    config_path = folder / "config.json"
    config_path.write_text(json.dumps(CONFIG if config is None else config))
    output = folder / "monitor_output"
    done = subprocess.run(
        [python, str(RUNNER), which, str(config_path), str(output), str(steps), *extra],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=folder,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ranks = [entry for entry in output.iterdir() if "-rank0-" in entry.name] if output.exists() else []
    assert len(ranks) <= 1, ranks
    return (ranks[0] if ranks else None), result, done.stdout + done.stderr  # msprobe logs to stdout


@pytest.fixture(scope="module")
def runs(msprobe_python, tmp_path_factory):
    root = tmp_path_factory.mktemp("side_by_side")
    theirs = _run(msprobe_python, "msprobe", root / "msprobe")
    ours = _run(sys.executable, "ours", root / "ours")
    return theirs, ours


def _read(path):
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    return rows[0], rows[1:]


def test_the_same_file_names_but_ur_distribution(runs):
    (theirs, their_result, their_log), (ours, our_result, _) = runs
    assert their_result["error"] is None and our_result["error"] is None
    their_files, our_files = set(os.listdir(theirs)), set(os.listdir(ours))
    expected = {f"{kind}_{s}-{s}.csv" for kind in ("grad_unreduced", "grad_reduced", "param_origin") for s in range(4)}
    expected |= {f"param_updated_{s}-{s}.csv" for s in range(STEPS)}
    expected |= {f"{kind}_{s}-{s}.csv" for kind in ("exp_avg", "exp_avg_sq") for s in range(1, STEPS)}
    assert their_files == expected  # Adam's moments from the second step on, in both
    # by design (docs/monitor.md, config keys): msprobe cancels ur_distribution with CSV output, we write it
    assert "ur_distribution is not supported in CSV format" in their_log
    assert our_files - their_files == {f"{kind}_{s}-{s}.csv" for kind in OURS_ONLY for s in range(1, STEPS)}
    assert our_files & their_files == their_files


def test_the_same_columns_metric_names_and_layers(runs):
    (theirs, their_result, _), (ours, _, _) = runs
    for name in sorted(os.listdir(theirs)):
        their_header, their_rows = _read(theirs / name)
        our_header, our_rows = _read(ours / name)
        assert our_header == their_header == ["vpp_stage", "name", "step", *OPS, "shape", "dtype"], name
        # the same rows in the same order: stage, layer, step, shape and dtype
        assert [row[:3] + row[-2:] for row in our_rows] == [row[:3] + row[-2:] for row in their_rows], name
        # every parameter, once (grad_unreduced in the order backward reaches them, in both)
        assert sorted(row[1] for row in their_rows) == sorted(their_result["params"])


def test_the_same_figures_within_float32_rounding(runs):
    (theirs, _, _), (ours, _, _) = runs
    compared = 0
    for name in sorted(os.listdir(theirs)):
        header, their_rows = _read(theirs / name)
        _, our_rows = _read(ours / name)
        for their_row, our_row in zip(their_rows, our_rows):
            figures = dict(zip(header[3:-2], map(float, their_row[3:-2])))
            scale = max(abs(figures["min"]), abs(figures["max"]))
            for op, their_text, our_text in zip(header[3:-2], their_row[3:-2], our_row[3:-2]):
                theirs_value, ours_value = float(their_text), float(our_text)
                if op in EXACT:
                    assert ours_value == theirs_value, (name, their_row[1], op)
                else:
                    bound = REL * max(abs(theirs_value), scale)
                    assert abs(ours_value - theirs_value) <= bound, (name, their_row[1], op, theirs_value, ours_value)
                compared += 1
    assert compared == 22 * 6 * len(OPS)  # 22 files of 6 layers, 6 figures each


CSV2TB = """
import glob, json, os, sys
from msprobe.pytorch.monitor.csv2tb import csv2tensorboard_by_step
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
root, out = sys.argv[1], sys.argv[2]
csv2tensorboard_by_step(root, process_num=1, output_dirpath=out)
result = {}
for folder in sorted(glob.glob(os.path.join(out, "rank*", "*"))):
    accumulator = EventAccumulator(folder)
    accumulator.Reload()
    result[os.path.relpath(folder, out)] = {
        tag: [[event.step, event.value] for event in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]
    }
print(json.dumps(result))
"""


def test_msprobe_csv2tb_reads_our_csv(runs, msprobe_python, tmp_path):
    _, (ours, _, _) = runs
    done = subprocess.run(
        [msprobe_python, "-c", CSV2TB, str(ours.parent), str(tmp_path / "tb")],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "failed" not in done.stderr  # csv2tb logs a file it cannot parse and goes on
    scalars = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(scalars) == {f"rank0/{kind}" for kind in CSV2TB_KINDS}  # adam_* is not a kind csv2tb converts
    for kind in CSV2TB_KINDS:
        expected = {}
        for name in os.listdir(ours):
            if name.startswith(kind + "_") and name[len(kind) + 1].isdigit():
                header, rows = _read(ours / name)
                for row in rows:
                    for op, text in zip(header[3:-2], row[3:-2]):
                        expected.setdefault(f"vp{row[0]}:{row[1]}/{op}", []).append([int(row[2]), float(text)])
        got = scalars[f"rank0/{kind}"]
        assert set(got) == set(expected), kind
        for tag, points in expected.items():
            points.sort()
            assert [step for step, _ in got[tag]] == [step for step, _ in points], tag
            for (_, value), (_, written) in zip(got[tag], points):  # TensorBoard keeps float32
                assert value == pytest.approx(written, rel=REL, abs=1e-30), tag


def test_params_have_main_grad_without_main_grad(msprobe_python, runs, tmp_path):
    """msprobe's default params_have_main_grad=True on a module without megatron's DDP: msprobe's hook raises
    AttributeError into the training loop; ours warns once, reads .grad, and writes what the run with
    params_have_main_grad=False writes (docs/monitor.md)."""
    _, (plain, _, _) = runs
    _, their_result, _ = _run(msprobe_python, "msprobe", tmp_path / "msprobe", "main_grad")
    assert their_result["error"] is not None
    assert their_result["error"].startswith("AttributeError") and "main_grad" in their_result["error"]
    ours, our_result, our_log = _run(sys.executable, "ours", tmp_path / "ours", "main_grad")
    assert our_result["error"] is None
    assert our_log.count("params_have_main_grad=True but a parameter has no main_grad") == 1
    for name in ("grad_unreduced_2-2.csv", "grad_reduced_2-2.csv"):
        assert (ours / name).read_text() == (plain / name).read_text()


def test_our_report_reads_msprobe_output(runs, capsys):
    """monitor-report reads msprobe's own CSV (pandas-written) as it reads ours: the same plots."""
    (theirs, _, _), (ours, _, _) = runs
    assert cli.main(["monitor-report", str(theirs.parent), "-o", str(theirs.parent.parent / "theirs.html")]) == 0
    assert cli.main(["monitor-report", str(ours.parent), "-o", str(ours.parent.parent / "ours.html")]) == 0
    their_page = (theirs.parent.parent / "theirs.html").read_text(encoding="utf-8")
    our_page = (ours.parent.parent / "ours.html").read_text(encoding="utf-8")
    assert their_page.count('<svg class="plot"') == 6 * 6 * len(OPS)  # 6 kinds x 6 layers x 6 ops
    assert our_page.count('<svg class="plot"') == 8 * 6 * len(OPS)  # and adam_update, adam_ratio


ALERT_CONFIG = {
    "targets": {},
    "wg_distribution": True,
    "param_distribution": True,
    "mv_distribution": True,
    "ops": ["min", "max", "norm", "zeros", "nans"],
    "format": "csv",
    "alert": {
        "rules": [{"rule_name": "AnomalyNan"}, {"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}}],
        "dump": True,
    },
}
MESSAGE = re.compile(
    r"Rule (\w+) reports anomaly signal in \('([^']+)', '(\w+)'\) at step (\d+), current value (\S+), "
    r"history mean (\S+)\.$"
)


def test_the_same_anomalies_with_the_learning_rate_x1000(msprobe_python, tmp_path):
    """Both monitors' alert rules on one run whose learning rate is x1000 from step 7: the same records (rule,
    tensor, op, step), figures within float32 rounding. By design (docs/monitor.md): our anomaly.json keeps the
    earliest 8 of each step (anomaly_analyse's default), msprobe's every record; msprobe gives the weights' rows
    call id -1 (it registers none for them), ours their call order."""
    theirs, _, _ = _run(msprobe_python, "msprobe", tmp_path / "msprobe", "lr@7", config=ALERT_CONFIG, steps=10)
    ours, our_result, _ = _run(sys.executable, "ours", tmp_path / "ours", "lr@7", config=ALERT_CONFIG, steps=10)
    their_file = json.loads((theirs.parent / "anomaly_detected" / "rank0" / "anomaly.json").read_text())
    our_file = json.loads((ours.parent / "anomaly_detected" / "rank0" / "anomaly.json").read_text())
    their_records = list(their_file.values())
    made = our_result["anomalies"]
    assert {item["step"] for item in made} >= {7, 8, 9}  # the spike's steps (and msprobe's moment turbulence)
    by_tag = {(item["step"], item["tag_name"]): item for item in their_records}
    assert sorted(by_tag) == sorted((item["step"], item["tag_name"]) for item in made)  # the same records
    for item in made:
        theirs_item = by_tag[(item["step"], item["tag_name"])]
        their_parts = MESSAGE.match(theirs_item["message"]).groups()
        our_parts = MESSAGE.match(item["message"]).groups()
        assert our_parts[:4] == their_parts[:4]  # rule, tensor, op, step
        for their_text, our_text in zip(their_parts[4:], our_parts[4:]):  # value, history mean
            assert float(our_text) == pytest.approx(float(their_text), rel=REL)
        if item["tag_name"].endswith(("/param_origin", "/param_updated")):
            assert theirs_item["call_id"] == -1 and item["call_id"] >= 0
        else:
            assert theirs_item["call_id"] == item["call_id"]
        assert {key: item[key] for key in item if key not in ("message", "call_id")} == {
            key: theirs_item[key] for key in theirs_item if key not in ("message", "call_id")
        }
    # the file: msprobe's holds every record, ours the earliest 8 of each step, in msprobe's execution order (its
    # ties, the weights' rows at call -1, in msprobe's own order)
    assert len(their_file) == len(made) > len(our_file)
    for step in {item["step"] for item in made}:
        earliest = sorted((item for item in their_records if item["step"] == step), key=monitor_report.execution_order)
        kept = [item["tag_name"] for item in our_file.values() if item["step"] == step]
        assert kept == [item["tag_name"] for item in earliest[:8]], step
