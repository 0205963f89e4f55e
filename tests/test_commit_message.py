"""The commit-msg hook (tools/check_commit_message.py, run by .pre-commit-config.yaml): a subject of at most
72 characters, then a blank line and a body; merges and fixup!/squash! commits let through. The script is run
as the hook runs it, on a message file, outside any git repository (so no merge is in progress)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "check_commit_message.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import check_commit_message  # noqa: E402

SUBJECT_72 = "compiler: " + "x" * 62
BODY = "\nWhy: the reason the diff cannot show.\n"


def run(tmp_path, text):
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text(text, encoding="utf-8")
    return subprocess.run(
        [sys.executable, SCRIPT, str(message)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


GOOD = {
    "subject and body": "docs: split the benchmarks\n" + BODY,
    "a subject of exactly 72 characters": SUBJECT_72 + "\n" + BODY,
    "git's template comments and a verbose diff below the scissors": (
        "runtime: one pass\n\nBecause it reads memory once.\n# Please enter the commit message\n"
        "# ------------------------ >8 ------------------------\n" + "x" * 100 + "\n"
    ),
    "blank lines before the subject": "\n\nfix: a thing\n\nThe reason.\n",
    "a merge": "Merge branch 'wt-p' into main with a subject that is long enough to pass the limit of 72\n",
    "a fixup": "fixup! " + "y" * 80 + "\n",
    "a squash": "squash! runtime: one pass\n",
}

BAD = {
    "a subject over 72 characters": (SUBJECT_72 + "z\n" + BODY, "73 characters"),
    "no body": ("docs: split the benchmarks\n", "no body"),
    "no body, only comments after the subject": ("docs: split\n\n# Please enter the commit message\n", "no body"),
    "a body with no blank line before it": ("docs: split\nbecause it was long\n", "not blank"),
    "an empty message": ("# only a comment\n\n", "empty"),
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_accepted(tmp_path, name):
    result = run(tmp_path, GOOD[name])
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


@pytest.mark.parametrize("name", sorted(BAD))
def test_refused_with_the_reason(tmp_path, name):
    text, reason = BAD[name]
    result = run(tmp_path, text)
    assert result.returncode == 1
    assert reason in result.stderr


def test_both_reasons_at_once():
    found = check_commit_message.problems("x" * 80 + "\n")
    assert len(found) == 2


def test_an_unreadable_file(tmp_path):
    result = subprocess.run(
        [sys.executable, SCRIPT, str(tmp_path / "missing")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2


def test_the_pre_commit_config_runs_it_at_the_commit_msg_stage():
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(ROOT, ".pre-commit-config.yaml"), encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    assert [repo["repo"] for repo in config["repos"]] == ["local"]  # nothing fetched
    (hook,) = [hook for repo in config["repos"] for hook in repo["hooks"] if hook["id"] == "commit-message"]
    assert hook["stages"] == ["commit-msg"]
    assert hook["entry"] == "tools/check_commit_message.py"
    assert os.access(SCRIPT, os.X_OK)  # language: script runs the file itself
