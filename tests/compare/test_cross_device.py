"""Compare across devices (fixtures/cross_device): every op nudged by a few ulp in both runs, one culprit op
in run A. The first suspect must be the culprit, and a noise-only pair must have no suspect."""

import csv
import glob
import json
import os
import subprocess
import sys

import pytest

from msprobe_rewrite.compare import compare_runs

from .conftest import ROOT, run_compare

ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _python(*args):
    done = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=1200
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _generate(out, model, seed, culprit=None, task="statistics"):
    args = ["fixtures.cross_device.generate", "--model", model, "--seed", str(seed), "--out", str(out), "--task", task]
    if culprit:
        args += ["--culprit", culprit]
    return _python(*args)["culprit_entry"]


def _scenarios(out, count, seed, models):
    from fixtures.cross_device.scenarios import judge

    _python(
        "fixtures.cross_device.scenarios",
        "--count",
        str(count),
        "--seed",
        str(seed),
        "--models",
        ",".join(models),
        "--out",
        str(out),
    )
    with open(os.path.join(str(out), "manifest.json")) as handle:
        return judge(json.load(handle))


@pytest.mark.slow  # over 2 s: `make check` leaves it to `make test`
def test_a_few_random_scenarios(tmp_path):
    result = _scenarios(tmp_path, 8, 3, ("mlp", "attention", "bignet"))
    misses = [(r["model"], r["culprit"], r["suspect"]) for r in result["rows"] if r["suspect"] != r["truth"]]
    assert not misses
    noisy = [(r["model"], r["noise_suspects"]) for r in result["rows"] if r["noise_suspects"]]
    assert not noisy


@pytest.mark.slow
def test_a_hundred_random_scenarios(tmp_path):
    # kind, model (the MLP, the attention stack, BigNet, megatron's GPT), op and call drawn at random; about
    # 80 s to write the 200 dumps. bench/cross_device.py prints the same figures beside msprobe's compare.
    result = _scenarios(tmp_path, 100, 16, ("mlp", "attention", "bignet", "megatron"))
    count = result["count"]
    print(
        f"\nfirst suspect {result['suspect_hits']}/{count}, first divergence {result['divergence_hits']}/{count}, "
        f"noise-only pairs with no suspect {result['noise_clean']}/{count}"
    )
    assert result["suspect_hits"] >= 95, [
        (r["culprit"], r["suspect"]) for r in result["rows"] if r["suspect"] != r["truth"]
    ]
    assert result["noise_clean"] == count, [r["noise_suspects"] for r in result["rows"] if r["noise_suspects"]]
    assert {r["model"] for r in result["rows"]} == {"mlp", "attention", "bignet", "megatron"}


@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    """The attention stack: a base run, and a run whose second softmax is computed in float16."""
    root = tmp_path_factory.mktemp("attention")
    _generate(root / "base", "attention", 0)
    truth = _generate(root / "half", "attention", 1, "half:Functional.softmax:1")
    return root, truth


@pytest.mark.slow  # over 2 s: `make check` leaves it to `make test`
def test_a_softmax_with_a_hundredfold_jump_is_named_where_thresholds_name_a_gradient(attention):
    root, truth = attention
    summary = compare_runs(str(root / "half"), str(root / "base"))
    suspect = summary["first_suspect"]
    assert truth == "Functional.softmax.1.forward" and suspect["entry"] == truth
    assert suspect["gain"] > 50 and suspect["input_error"] < 1e-5 and suspect["op_class"] == "exp"
    assert suspect["output_error"] > 10 * suspect["noise_floor"]
    # the per-dtype threshold is crossed first by the softmax's backward, whose gradient Mean sits near zero
    assert summary["first_divergence"]["entry"] == "Functional.softmax.1.backward"


@pytest.mark.slow  # over 2 s: `make check` leaves it to `make test`
def test_reports_tell_the_story(attention, tmp_path):
    root, truth = attention
    code, out, err = run_compare(root / "half", root / "base", "-o", tmp_path / "out")
    assert code == 1, out + err
    assert f"first suspect: {truth}" in out and "gain" in out and "noise floor" in out
    summary = json.loads((tmp_path / "out" / "compare_summary.json").read_text())
    first = summary["first_suspect"]
    with open(os.path.join(ROOT, "fixtures", "cross_device", "models.py")) as handle:
        line = next(n for n, text in enumerate(handle, 1) if "F.softmax(" in text)
    assert first["entry"] == truth and first["call_site"].endswith(f"models.py:{line}")
    for key in ("input_error", "output_error", "gain", "allowance", "noise_floor", "statistic", "tensor"):
        assert key in first
    assert summary["pairs"][0]["noise_floor"]["torch.float32"]["Max"] > 0
    page = (tmp_path / "out" / "compare_report.html").read_text()
    assert "Error propagation" in page and 'href="#suspect-0-1"' in page and 'id="suspect-0-1"' in page
    assert f"line {line}, in forward" in page  # the suspect's stack, shown when its mark is clicked
    assert "<script" not in page
    [suspects_csv] = glob.glob(str(tmp_path / "out" / "compare_suspects_*.csv"))
    with open(suspects_csv, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["entry"] == truth and float(rows[0]["gain"]) > 50


@pytest.mark.slow  # tensor dumps of two runs in fresh interpreters
def test_tensor_dumps(tmp_path):
    _generate(tmp_path / "base", "attention", 0, task="tensor")
    truth = _generate(tmp_path / "bad", "attention", 2, "softmax:Functional.softmax:0", task="tensor")
    _generate(tmp_path / "noise", "attention", 2, task="tensor")
    summary = compare_runs(str(tmp_path / "bad"), str(tmp_path / "base"))
    suspect = summary["first_suspect"]
    assert suspect["entry"] == truth
    # element-wise evidence: a bfloat16 softmax is hundreds of float32 ulp off, the noise a few
    assert suspect["ulp_median"] > 100 and suspect["cosine"] < 1 and suspect["max_relative_error"] > 1e-3
    assert compare_runs(str(tmp_path / "noise"), str(tmp_path / "base"))["first_suspect"] is None
