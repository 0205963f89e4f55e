"""The hooks through the real pre-commit: a temporary git repository whose .pre-commit-config.yaml points
at a snapshot of this checkout, hooks installed with `pre-commit install`, commits made with `git commit`.

pre-commit clones the hook repository at a rev and builds its environment with `pip install .`, so the
snapshot is a one-commit git repository of this checkout's files as they are on disk (tracked and untracked,
ignored ones left out): the test sees uncommitted work too, and works the same from a fresh clone in CI.
Slow (pre-commit builds a virtual environment); skipped when git or pre-commit is missing.
"""

import glob
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # git and pre-commit subprocesses, hook environment installed

pytest.importorskip("pre_commit", reason="pre-commit is in the test extras")
if shutil.which("git") is None:
    pytest.skip("git is not installed", allow_module_level=True)

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORIGINAL = b"import torch\r\n\r\n\r\ndef f(x):\r\n    return torch.relu(x)  # CRLF, restored byte for byte\r\n"
CLEAN = b"def g(x):\n    return x\n"
HIDDEN = b"import torch\n\n\ndef h(x, name):\n    return getattr(torch, name)(x)\n"


def git(cwd, *args, check=True):
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    result = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check and result.returncode:
        raise AssertionError(f"git {' '.join(args)}: {result.stdout}{result.stderr}")
    return result


def snapshot_of_checkout(target):
    """A one-commit repository of the checkout's files as they are now; returns its commit."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=CHECKOUT, capture_output=True, check=True
    ).stdout.split(b"\0")
    os.makedirs(target)
    for name in filter(None, (os.fsdecode(n) for n in listed)):
        source = os.path.join(CHECKOUT, name)
        if not os.path.isfile(source):
            continue  # listed but deleted in the working tree
        os.makedirs(os.path.dirname(os.path.join(target, name)), exist_ok=True)
        shutil.copy2(source, os.path.join(target, name))
    git(target, "init", "-q")
    git(target, "add", "-A")
    git(target, "commit", "-q", "-m", "snapshot")
    return git(target, "rev-parse", "HEAD").stdout.strip()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("pre_commit")
    hooks_repo = str(root / "hooks")
    rev = snapshot_of_checkout(hooks_repo)
    work = root / "project"
    work.mkdir()
    git(work, "init", "-q")
    (work / ".pre-commit-config.yaml").write_text(
        "repos:\n"
        f"  - repo: {hooks_repo}\n"
        f"    rev: {rev}\n"
        "    hooks:\n"
        "      - id: msprobe-no-instrumentation\n"
        "      - id: msprobe-restore\n"
        "        stages: [manual]\n"
        "      - id: msprobe-lint\n"
    )
    env = {**os.environ, "PRE_COMMIT_HOME": str(root / "cache"), "PRE_COMMIT_COLOR": "never"}
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "install", "--install-hooks"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    git(work, "add", ".pre-commit-config.yaml")
    configured = commit(work, env, "configure the hooks")
    assert configured.returncode == 0, configured.stdout + configured.stderr
    return work, env, root / "cache"


def commit(work, env, message):
    return subprocess.run(
        ["git", "commit", "-m", message],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **env,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.com",
        },
    )


def test_instrumented_commit_is_refused_then_accepted_after_the_fix_hook(project):
    from msprobe_rewrite.api import rewrite_source

    work, env, _ = project
    (work / "model.py").write_bytes(rewrite_source(ORIGINAL))
    (work / "clean.py").write_bytes(CLEAN)
    git(work, "add", "model.py", "clean.py")
    head = git(work, "rev-parse", "HEAD").stdout

    refused = commit(work, env, "instrumented")
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output
    assert "model.py: instrumented by msprobe-rewrite; restore it with: msprobe-rewrite --restore model.py" in output
    assert "clean.py:" not in output
    assert git(work, "rev-parse", "HEAD").stdout == head  # nothing was committed

    fixed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pre_commit",
            "run",
            "--hook-stage",
            "manual",
            "msprobe-restore",
            "--files",
            "model.py",
            "clean.py",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert fixed.returncode == 1 and "files were modified by this hook" in fixed.stdout, fixed.stdout + fixed.stderr
    assert (work / "model.py").read_bytes() == ORIGINAL

    git(work, "add", "model.py")
    accepted = commit(work, env, "restored")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert subprocess.run(["git", "show", "HEAD:model.py"], cwd=work, capture_output=True).stdout == ORIGINAL
    print(output, fixed.stdout, accepted.stdout, sep="\n")  # shown with -s: what a developer sees


def test_lint_hook_refuses_a_hidden_api_call(project):
    work, env, _ = project
    (work / "hidden.py").write_bytes(HIDDEN)
    git(work, "add", "hidden.py")
    refused = commit(work, env, "hidden")
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output
    assert "hidden.py:5:12: MSP001 " in output
    git(work, "reset", "-q", "hidden.py")


def test_the_hook_environment_has_no_torch(project):
    _, _, cache = project
    environments = glob.glob(os.path.join(str(cache), "*", "py_env-*"))
    assert environments
    for environment in environments:
        installed = glob.glob(os.path.join(environment, "lib", "python*", "site-packages", "*"))
        names = {os.path.basename(path).split("-")[0].lower() for path in installed}
        assert "msprobe_rewrite" in names and "libcst" in names
        assert not names & {"torch", "torch_npu", "megatron", "megatron_core"}, sorted(names)
