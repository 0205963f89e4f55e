"""``msprobe-rewrite monitor-report DIR``: the HTML page (plots per metric and layer, anomalies marked and listed)
and the terminal summary (the layers whose gradient norms grew first), from a real monitor output of the tiny MLP
with an injected fault, and from hand-made CSV files for the scale and the bad inputs."""

import math
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from msprobe_rewrite import cli, monitor_report

REPO = Path(__file__).resolve().parents[2]
OPS = ["min", "max", "norm", "zeros", "nans"]  # no mean: see test_anomalies.py (its turbulence fires when clean)
RULES = [{"rule_name": "AnomalyNan"}, {"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}}]
CONFIG = {"wg_distribution": True, "param_distribution": True, "ops": OPS, "alert": {"rules": RULES, "dump": True}}
LAYERS = ["0:fc1.weight", "0:fc1.bias", "0:fc2.weight", "0:fc2.bias", "0:head.weight", "0:head.bias"]
KINDS = ["grad_reduced", "grad_unreduced", "param_origin", "param_updated"]


class Page(HTMLParser):
    """The page as the tests read it: each plot's attributes with its polyline points, NaN marks and anomaly
    marks; the anomaly and onset tables' rows; the collapsible sections."""

    def __init__(self, text):
        super().__init__()
        self.plots, self.anomaly_rows, self.onset_rows, self.details = [], [], [], []
        self._plot = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg":
            self._plot = dict(attrs, polyline=[], nonfinite=[], anomalies=[])
            self.plots.append(self._plot)
        elif tag == "polyline" and self._plot is not None:
            self._plot["polyline"].extend(tuple(map(float, p.split(","))) for p in attrs["points"].split())
        elif tag == "circle" and self._plot is not None and attrs.get("class") == "pt":
            self._plot["polyline"].append((float(attrs["cx"]), float(attrs["cy"])))
        elif tag == "path" and self._plot is not None and attrs.get("class") == "nonfinite":
            self._plot["nonfinite"].append((int(attrs["data-step"]), int(attrs["data-last"])))
        elif tag == "circle" and self._plot is not None and attrs.get("class") == "anomaly":
            self._plot["anomalies"].append(int(attrs["data-step"]))
        elif tag == "tr" and attrs.get("class") == "anomaly":
            self.anomaly_rows.append((int(attrs["data-step"]), attrs["data-layer"]))
        elif tag == "tr" and attrs.get("class") == "onset":
            self.onset_rows.append((attrs["data-layer"], int(attrs["data-step"])))
        elif tag == "details":
            self.details.append(attrs)

    def handle_endtag(self, tag):
        if tag == "svg":
            self._plot = None

    def plot(self, kind, op, layer):
        found = [p for p in self.plots if (p["data-kind"], p["data-op"], p["data-layer"]) == (kind, op, layer)]
        assert len(found) == 1, (kind, op, layer, len(found))
        return found[0]


def _report(folder, *extra):
    """The CLI in a subprocess, as a user runs it: (exit code, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + sys.path))
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "monitor-report", str(folder), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return done.returncode, done.stdout, done.stderr


def _summary_layers(stdout):
    """The layers of the terminal summary's ranking, in its order."""
    return [line.split()[1] for line in stdout.splitlines() if line.startswith("  ") and line.split()[0][:-1].isdigit()]


def test_a_nan_in_one_weight_is_plotted_listed_and_named_first(train):
    run = train(CONFIG, steps=12, fault=("nan", 7, "fc2.weight"))
    code, out, err = _report(run.output)
    assert code == 0, err
    assert "wrote 120 plots" in err and "Traceback" not in err
    page = Page((run.output / "monitor_report.html").read_text(encoding="utf-8"))
    assert {(p["data-kind"], p["data-op"], p["data-layer"]) for p in page.plots} == {
        (kind, op, layer) for kind in KINDS for op in OPS for layer in LAYERS
    }
    assert all(p["data-steps"] == "12" for p in page.plots)
    # the weight's own plots carry the anomaly mark at step 7, and its NaN from step 7 on
    marked = page.plot("param_origin", "min", "0:fc2.weight")
    assert marked["anomalies"][0] == 7  # and every step after: the NaN stays in the weight
    assert marked["nonfinite"] == [(7, 11)]  # one band over the steps 7-11
    assert len(marked["polyline"]) == 7  # steps 0-6 finite: the line stops where the NaN starts
    # fc1's weight is finite at step 7, spoiled by step 7's update
    assert page.plot("param_origin", "min", "0:fc1.weight")["nonfinite"] == [(8, 11)]
    assert page.plot("grad_reduced", "norm", "0:head.weight")["nonfinite"] == [(7, 11)]
    # the table lists the anomalies in execution order: the weight before the gradients it spoiled
    assert page.anomaly_rows[0] == (7, "0:fc2.weight")
    assert all(step >= 7 for step, _ in page.anomaly_rows)
    # every gradient is NaN at step 7; the layer whose own weight was NaN is named first
    assert _summary_layers(out)[0] == "0:fc2.weight"
    assert sorted(_summary_layers(out)) == sorted(LAYERS)
    assert "step 7" in out.splitlines()[0] and "0:fc2.weight" in out.splitlines()[0]
    assert page.onset_rows[0] == ("0:fc2.weight", 7)
    # the sections with an anomaly or a NaN are open, the others closed
    opened = {d["data-kind"] for d in page.details if d.get("class") == "kind" and "open" in d}
    assert opened == set(KINDS)


def test_a_learning_rate_spike_ranks_layers_by_gradient_growth(train):
    run = train(CONFIG, steps=12, fault=("lr", 7, 1000.0))
    code, out, err = _report(run.output, "-o", str(run.output / "elsewhere" / "page.html"))
    assert code == 0, err
    assert not (run.output / "monitor_report.html").exists()
    page = Page((run.output / "elsewhere" / "page.html").read_text(encoding="utf-8"))
    # the turbulence rule fires at step 7 (the weights updated with the large rate), marked on param_updated
    assert page.anomaly_rows[0][0] == 7
    assert 7 in page.plot("param_updated", "norm", page.anomaly_rows[0][1])["anomalies"]
    # gradients are untouched at step 7 and grow at step 8; the ranking, recomputed here from the gradients
    # themselves (float64): growth = norm at step 8 over the median of steps 0-7
    names = [f"0:{name}" for name, _ in run.model.named_parameters()]
    growth = {}
    for index, name in enumerate(names):
        norms = [run.grads[step][index].double().norm().item() for step in range(12)]
        assert max(norms[:8]) < 10 * sorted(norms[:7])[3]  # no onset before step 8
        growth[name] = norms[8] / ((sorted(norms[:8])[3] + sorted(norms[:8])[4]) / 2)
    expected = sorted((name for name in names if growth[name] > 10), key=lambda name: -growth[name])
    assert expected  # the spike is visible in the gradients
    assert _summary_layers(out) == expected
    assert {step for _, step in page.onset_rows} == {8}


def test_a_clean_run_reports_nothing(train):
    run = train(CONFIG, steps=30)
    code, out, err = _report(run.output)
    assert code == 0, err
    page = Page((run.output / "monitor_report.html").read_text(encoding="utf-8"))
    assert len(page.plots) == 120 and not page.anomaly_rows and not page.onset_rows
    assert not any(p["anomalies"] or p["nonfinite"] for p in page.plots)
    assert out.splitlines() == [
        "anomalies: none recorded",
        "gradient norms: none grew past 10x the median of earlier steps, none NaN/Inf",
    ]


def _write_run(folder, layers, steps, value, kinds=("grad_reduced",), rank_id=0):
    """Hand-made monitor CSV files, one per step and kind: ``value(layer, step)`` -> the norm."""
    rank = folder / f"Dec05_10-00-00-rank{rank_id}-abcdef1{rank_id}"
    rank.mkdir(parents=True)
    for kind in kinds:
        for step in range(steps):
            lines = ["vpp_stage,name,step,min,max,norm,shape,dtype"]
            for layer in range(layers):
                norm = value(layer, step)
                lines.append(f'0,layers.{layer}.weight,{step},{-norm},{norm},{norm},"[4, 4]",torch.float32')
            (rank / f"{kind}_{step}-{step}.csv").write_text("\n".join(lines) + "\n")
    return rank


def test_hundreds_of_layers_downsampled_with_the_spike_kept(tmp_path, capsys):
    def value(layer, step):
        base = 1.0 + 0.01 * ((layer * 7 + step * 13) % 10)
        if layer == 123 and step == 301:  # a one-step spike, on a step no bucket boundary favours
            return 500.0
        if layer == 42 and step >= 250:  # grows, and stays up
            return 50.0
        if layer == 7 and (100 <= step <= 350 or step == 390):  # NaN for 251 steps, then once more
            return math.nan
        return base

    _write_run(tmp_path, layers=150, steps=400, value=value)
    assert cli.main(["monitor-report", str(tmp_path), "--max-points", "40", "--ops", "norm,max"]) == 0
    out = capsys.readouterr().out
    page = Page((tmp_path / "monitor_report.html").read_text(encoding="utf-8"))
    assert len(page.plots) == 2 * 150
    assert all(len(p["polyline"]) <= 40 and int(p["data-points"]) <= 40 for p in page.plots)
    spike = page.plot("grad_reduced", "norm", "0:layers.123.weight")
    assert min(y for _, y in spike["polyline"]) == monitor_report.PAD_TOP  # the spike is the top of its plot
    assert [d["data-op"] for d in page.details if d.get("class") == "op"] == ["norm", "max"]
    assert _summary_layers(out) == ["0:layers.7.weight", "0:layers.42.weight", "0:layers.123.weight"]
    assert "step 100" in out and "step 250" in out and "step 301" in out
    assert page.plot("grad_reduced", "norm", "0:layers.7.weight")["nonfinite"] == [(100, 350), (390, 390)]


def test_ranks_are_told_apart(tmp_path, capsys):
    # the same layer names on two ranks: rank 1's fc grows at step 5, rank 0's at step 6
    _write_run(tmp_path, layers=2, steps=8, value=lambda layer, step: 40.0 if layer == 1 and step >= 6 else 1.0)
    _write_run(tmp_path, 2, 8, lambda layer, step: 40.0 if layer == 1 and step >= 5 else 1.0, rank_id=1)
    assert cli.main(["monitor-report", str(tmp_path), "--ops", "norm"]) == 0
    out = capsys.readouterr().out
    page = Page((tmp_path / "monitor_report.html").read_text(encoding="utf-8"))
    assert sorted((p["data-rank"], p["data-layer"]) for p in page.plots) == [
        (rank, f"0:layers.{layer}.weight") for rank in "01" for layer in range(2)
    ]
    assert [line.split()[1:4] for line in out.splitlines()[2:]] == [
        ["rank1", "0:layers.1.weight", "step"],
        ["rank0", "0:layers.1.weight", "step"],
    ]
    assert "step 5" in out.splitlines()[2] and "step 6" in out.splitlines()[3]


def test_downsample_keeps_each_bucket_extremes():
    points = [(step, math.sin(step / 10.0)) for step in range(1000)] + [(1000, math.nan)]
    points[517] = (517, 9.0)
    points[733] = (733, -9.0)
    kept = monitor_report.downsample(points, 50)
    assert len(kept) <= 50 and kept == sorted(kept)
    assert (517, 9.0) in kept and (733, -9.0) in kept
    assert all(math.isfinite(value) for _, value in kept)
    assert monitor_report.downsample(points[:30], 50) == points[:30]


def test_a_rank_folder_finds_its_anomalies_one_level_up(tmp_path, capsys):
    rank = _write_run(tmp_path, layers=3, steps=6, value=lambda layer, step: 1.0 if step < 4 or layer else math.nan)
    detected = tmp_path / "anomaly_detected" / "rank0"
    detected.mkdir(parents=True)
    message = (
        "Rule AnomalyNan reports anomaly signal in ('0:layers.0.weight/rank0/post_grad', 'norm') at step 4, "
        "current value nan, history mean 1.0."
    )
    record = {"rank": 0, "step": 4, "micro_step": 0, "pp_stage": 0, "vpp_stage": 0, "call_id": 0}
    record.update(tag_name="0:layers.0.weight/rank0/post_grad", message=message, group_mates=[0])
    (detected / "anomaly.json").write_text(f'{{"k": {__import__("json").dumps(record)}}}')
    assert cli.main(["monitor-report", str(rank)]) == 0
    page = Page((rank / "monitor_report.html").read_text(encoding="utf-8"))
    assert page.anomaly_rows == [(4, "0:layers.0.weight")]
    assert page.plot("grad_reduced", "norm", "0:layers.0.weight")["anomalies"] == [4]
    assert page.plot("grad_reduced", "max", "0:layers.0.weight")["anomalies"] == []  # the record names norm
    assert "earliest: step 4, 0:layers.0.weight (grad_reduced norm = nan)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda root: root / "missing", "no such folder"),
        (lambda root: root, "no monitor CSV files"),
        (lambda root: (root / "Dec05_10-00-00-rank0-abcdef12" / "events.out.tfevents.1.host").parent, "CSV"),
        (lambda root: root / "grad_reduced_0-0.csv", "not a folder"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, said):
    (tmp_path / "Dec05_10-00-00-rank0-abcdef12").mkdir()
    (tmp_path / "Dec05_10-00-00-rank0-abcdef12" / "events.out.tfevents.1.host").write_bytes(b"\0")
    (tmp_path / "grad_reduced_0-0.csv").write_text("")
    target = make(tmp_path)
    if target == tmp_path:
        (tmp_path / "grad_reduced_0-0.csv").unlink()
        (tmp_path / "Dec05_10-00-00-rank0-abcdef12" / "events.out.tfevents.1.host").unlink()
    assert cli.main(["monitor-report", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("msprobe-rewrite monitor-report: error: ") and said in err, err
    assert len(err.splitlines()) == 1
    if said == "CSV":
        assert '"format": "csv"' in err


@pytest.mark.parametrize(
    "csv_text, anomaly_text, said",
    [
        ("a,b,c\n1,2,3\n", None, "not a monitor CSV"),
        ("vpp_stage,name,step,norm\n0,fc1.weight,x,1.0\n", None, "not a whole number"),
        ("vpp_stage,name,step,norm\n0,fc1.weight\n", None, "2 fields"),
        ("vpp_stage,name,step,norm\n0,fc1.weight,0,1.0\n", "{not json", "not readable as JSON"),
        ("vpp_stage,name,step,norm\n0,fc1.weight,0,1.0\n", '{"k": {"step": 1}}', "without tag_name"),
    ],
)
def test_malformed_files_are_named(tmp_path, capsys, csv_text, anomaly_text, said):
    rank = tmp_path / "Dec05_10-00-00-rank0-abcdef12"
    rank.mkdir()
    (rank / "grad_reduced_0-0.csv").write_text(csv_text)
    if anomaly_text is not None:
        (tmp_path / "anomaly_detected" / "rank0").mkdir(parents=True)
        (tmp_path / "anomaly_detected" / "rank0" / "anomaly.json").write_text(anomaly_text)
    assert cli.main(["monitor-report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.splitlines()) == 1, err


def test_a_missing_folder_from_the_shell_prints_no_traceback(tmp_path):
    code, out, err = _report(tmp_path / "nope")
    assert code == 2 and out == ""
    assert "no such folder" in err and "Traceback" not in err


def test_unknown_ops_are_refused(tmp_path, capsys):
    _write_run(tmp_path, layers=2, steps=3, value=lambda layer, step: 1.0)
    assert cli.main(["monitor-report", str(tmp_path), "--ops", "norm,mean"]) == 2
    assert "--ops: mean not in the CSV files (they hold min, max, norm)" in capsys.readouterr().err


def test_the_report_imports_no_torch():
    """The report reads text: it imports no torch (a quick command on a login node)."""
    code = "import sys, msprobe_rewrite.monitor_report; print('torch' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + sys.path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_the_anomaly_table_is_capped_the_marks_are_not(tmp_path, monkeypatch):
    monkeypatch.setattr(monitor_report, "MAX_TABLE_ROWS", 5)
    _write_run(tmp_path, layers=1, steps=8, value=lambda layer, step: 1.0)
    detected = tmp_path / "anomaly_detected" / "rank0"
    detected.mkdir(parents=True)
    tag = "0:layers.0.weight/rank0/post_grad"
    records = {
        f"r{step}": {"rank": 0, "step": step, "call_id": 0, "tag_name": tag, "message": f"in ('{tag}', 'max') at step"}
        for step in range(8)
    }
    (detected / "anomaly.json").write_text(__import__("json").dumps(records))
    assert cli.main(["monitor-report", str(tmp_path), "-q"]) == 0
    text = (tmp_path / "monitor_report.html").read_text(encoding="utf-8")
    page = Page(text)
    assert [step for step, _ in page.anomaly_rows] == [0, 1, 2, 3, 4]
    assert "... and 3 more (marked on the plots)" in text
    assert page.plot("grad_reduced", "max", "0:layers.0.weight")["anomalies"] == list(range(8))
