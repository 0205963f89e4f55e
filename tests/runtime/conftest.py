"""Shared helpers for the runtime tests: rewrite a plain fixture into a temporary directory and run it."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rewrite_file(src, dst_dir, name=None):
    """Instrument ``src`` with the compiler (the plain source under fixtures/ is the truth)."""
    from msprobe_rewrite.api import rewrite_source

    with open(src, "rb") as handle:
        out = rewrite_source(handle.read(), path=src)
    dst = os.path.join(str(dst_dir), name or os.path.basename(src))
    with open(dst, "wb") as handle:
        handle.write(out)
    return dst


def run_json(script, *args, cwd=None, env=None):
    """Run ``script`` in a fresh interpreter and parse the JSON object it prints last."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    done = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=600
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.fixture
def instrument(tmp_path):
    def _instrument(relative_path, name=None):
        return rewrite_file(os.path.join(ROOT, relative_path), tmp_path, name)

    return _instrument


@pytest.fixture(scope="session")
def run_script():
    return run_json


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session", autouse=True)
def native_statistics_loaded():
    """Build or load the native statistics op once, before any test: its one-time messages (the first
    build, or the warning where no compiler is found) then never land in a test that checks the log."""
    from msprobe_runtime import native_stats

    native_stats.load()


@pytest.fixture(scope="module")
def native():
    """The native statistics op; its tests are skipped where it cannot be built (no compiler or ninja), and fail
    there under MSPROBE_REQUIRE_NATIVE=1."""
    from msprobe_runtime import native_stats

    module = native_stats.load()
    if module is None:
        if os.environ.get("MSPROBE_REQUIRE_NATIVE") == "1":
            pytest.fail("the native statistics op could not be built")
        pytest.skip("the native statistics op cannot be built here (no compiler or ninja)")
    return module


@pytest.fixture
def fresh_process(monkeypatch, tmp_path):
    """A writing process wanted (whatever the environment says), none started yet; the dump folder's path."""
    from msprobe_runtime import writing_process

    monkeypatch.delenv("MSPROBE_WRITER_PROCESS", raising=False)
    writing_process.close_shared()
    yield tmp_path / "dump"
    writing_process.close_shared()  # a process this test broke is not the next test's


@pytest.fixture
def posted(monkeypatch):
    """Whether each step the training thread tried to post to the writing process was posted, in order."""
    from msprobe_runtime import writing_process

    answers = []
    real_post = writing_process.WritingProcess.post

    def spy(self, owner, directory, message):
        answer = real_post(self, owner, directory, message)
        answers.append(answer[0])
        return answer

    monkeypatch.setattr(writing_process.WritingProcess, "post", spy)
    return answers
