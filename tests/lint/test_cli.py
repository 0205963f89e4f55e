"""`msprobe-rewrite check` and `msprobe-rewrite guard` as commands: exit codes, output formats, selection,
noqa, and that neither imports torch (the pre-commit hook environment has none)."""

import json
import os
import subprocess
import sys

import pytest

from msprobe_rewrite.cli import main
from msprobe_rewrite.lint.noqa import suppressed_codes
from msprobe_rewrite.lint.rules import RuleSelectionError, enabled_codes

HIDDEN = b"import torch\n\n\ndef f(x, name):\n    return getattr(torch, name)(x)\n"
CLEAN = b"import torch\n\n\ndef f(x):\n    return torch.relu(x)\n"


def write(path, data):
    path.write_bytes(data)
    return str(path)


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


# -- selection and noqa -----------------------------------------------------------------------------
def test_defaults_leave_the_informational_rule_off():
    assert enabled_codes() == {"MSP001", "MSP002", "MSP003", "MSP004"}


def test_select_replaces_extend_adds_ignore_removes():
    assert enabled_codes(["MSP001"]) == {"MSP001"}
    assert enabled_codes(["ALL"]) == {"MSP001", "MSP002", "MSP003", "MSP004", "MSP901"}
    assert enabled_codes(extend_select=["MSP9"]) == {"MSP001", "MSP002", "MSP003", "MSP004", "MSP901"}
    assert enabled_codes(ignore=["MSP00"]) == set()
    # the more specific selector wins, as in ruff; ignore wins a tie
    assert enabled_codes(["MSP003"], ignore=["MSP"]) == {"MSP003"}
    assert enabled_codes(["MSP003"], ignore=["MSP003"]) == set()


def test_unknown_selector_is_an_error():
    with pytest.raises(RuleSelectionError):
        enabled_codes(["E501"])


def test_noqa_forms():
    assert suppressed_codes("x = 1") is None
    assert suppressed_codes("x = 1  # msprobe: noqa") == frozenset()
    assert suppressed_codes("x = 1  # msprobe: noqa[MSP001, msp004]") == {"MSP001", "MSP004"}
    assert suppressed_codes("x = 1  # noqa: E501  # msprobe:noqa[MSP003]") == {"MSP003"}


# -- check --------------------------------------------------------------------------------------------
def test_exit_codes(tmp_path, capsys):
    clean, hidden = write(tmp_path / "clean.py", CLEAN), write(tmp_path / "hidden.py", HIDDEN)
    assert run(["check", clean], capsys)[0] == 0
    code, out, err = run(["check", clean, hidden], capsys)
    assert code == 1
    assert (
        out == f"{hidden}:5:12: MSP001 `getattr(torch, name)` fetches an API of torch by a computed name: "
        "no static name, only the run-time identity check sees it\n"
    )
    assert "1 finding in 1 of 2 files" in err
    assert run(["check", "--ignore", "MSP001", hidden], capsys)[0] == 0
    assert run(["check", "--exit-zero", hidden], capsys)[0] == 0
    assert run(["check", str(tmp_path / "missing.py")], capsys)[0] == 2
    assert run(["check", "--select", "NOPE", clean], capsys)[0] == 2
    assert run(["check", "--bogus-flag", clean], capsys)[0] == 2


def test_a_file_that_does_not_parse_is_an_error_and_the_others_are_still_checked(tmp_path, capsys):
    broken = write(tmp_path / "a_broken.py", b"def f(:\n")
    hidden = write(tmp_path / "b_hidden.py", HIDDEN)
    code, out, err = run(["check", broken, hidden], capsys)
    assert code == 2
    assert "a_broken.py: cannot parse" in err
    assert "b_hidden.py:5:12: MSP001" in out


def test_json_output(tmp_path, capsys):
    hidden = write(tmp_path / "hidden.py", HIDDEN)
    code, out, _ = run(["check", "--output-format", "json", hidden], capsys)
    assert code == 1
    (item,) = json.loads(out)
    assert item["code"] == "MSP001" and item["name"] == "getattr-api" and item["filename"] == hidden
    assert item["location"] == {"row": 5, "column": 12}
    assert item["end_location"] == {"row": 5, "column": 32}
    assert run(["check", "--output-format", "json", write(tmp_path / "c.py", CLEAN)], capsys)[1] == "[]\n"


def test_statistics(tmp_path, capsys):
    hidden = write(tmp_path / "hidden.py", HIDDEN + b"from torch import *\n")
    code, out, _ = run(["check", "--statistics", hidden], capsys)
    assert code == 1
    assert out == "      1\tMSP001\tgetattr-api\n      1\tMSP002\tstar-import-api\n"


def test_columns_count_characters_not_bytes(tmp_path, capsys):
    source = "import torch\n\n\ndef f(x, name):\n    s = 'é'; return getattr(torch, name)(x)\n".encode()
    _, out, _ = run(["check", write(tmp_path / "u.py", source)], capsys)
    assert ":5:21: MSP001" in out  # 22 if it counted the bytes of é


def test_folders_are_walked(tmp_path, capsys):
    (tmp_path / "pkg").mkdir()
    write(tmp_path / "pkg" / "hidden.py", HIDDEN)
    write(tmp_path / "pkg" / "clean.py", CLEAN)
    code, out, _ = run(["check", str(tmp_path)], capsys)
    assert code == 1 and out.count("MSP001") == 1


# -- guard ---------------------------------------------------------------------------------------------
def test_guard_names_instrumented_files_and_fix_restores_exact_bytes(tmp_path, capsys):
    from msprobe_rewrite.api import rewrite_source

    original = CLEAN.replace(b"\n", b"\r\n")
    instrumented = write(tmp_path / "inst.py", rewrite_source(original))
    clean = write(tmp_path / "clean.py", CLEAN)
    code, out, err = run(["guard", instrumented, clean], capsys)
    assert code == 1
    assert (
        out == f"{instrumented}: instrumented by msprobe-rewrite; restore it with: "
        f"msprobe-rewrite --restore {instrumented}\n"
    )
    code, out, _ = run(["guard", "--fix", instrumented, clean], capsys)
    assert code == 0 and "restored" in out
    assert (tmp_path / "inst.py").read_bytes() == original
    assert run(["guard", instrumented, clean], capsys)[0] == 0
    (tmp_path / "inst.py").write_bytes(rewrite_source(original))
    assert run(["guard", "--fix", "--exit-non-zero-on-fix", instrumented], capsys)[0] == 1


def test_guard_ignores_the_import_text_in_a_string(tmp_path, capsys):
    # This project's own api.py holds the runtime import as a string constant.
    path = write(tmp_path / "s.py", b'RUNTIME_IMPORT = "import msprobe_runtime as __msprobe__"\n')
    assert run(["guard", path], capsys)[0] == 0


def test_guard_errors(tmp_path, capsys):
    broken = write(tmp_path / "b.py", b"import msprobe_runtime as __msprobe__; def f(:\n")
    assert run(["guard", broken], capsys)[0] == 2
    assert run(["guard", str(tmp_path / "missing.py")], capsys)[0] == 2


# -- no torch ------------------------------------------------------------------------------------------
@pytest.mark.slow  # spawns interpreters
def test_the_hooks_never_import_torch(tmp_path):
    """Run both hook entry points in a fresh interpreter and look at sys.modules afterwards."""
    from msprobe_rewrite.api import rewrite_source

    write(tmp_path / "hidden.py", HIDDEN)
    write(tmp_path / "inst.py", rewrite_source(CLEAN))
    script = (
        "import sys\n"
        "from msprobe_rewrite.cli import main\n"
        "codes = [main(['check', '--select', 'ALL', '-q', sys.argv[1]]), main(['guard', sys.argv[1]]),\n"
        "         main(['guard', '--fix', sys.argv[1]])]\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_npu', 'megatron', 'numpy'))\n"
        "print(codes, heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("[1, 1, 0] []"), result.stdout + result.stderr


@pytest.mark.slow  # spawns interpreters
def test_megatron_core_is_checked_in_seconds():
    import time

    megatron_core = pytest.importorskip("megatron.core", reason="megatron-core is test material").__path__[0]
    result = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "check", "--select", "ALL", "--statistics", megatron_core],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "check", "-q", megatron_core], capture_output=True, timeout=300
    )
    assert time.perf_counter() - started < 30


def test_the_hook_environment_needs_only_libcst_and_pyyaml():
    """pre-commit installs the hooks with `pip install .`: the project's own dependencies must stay light."""
    import re
    import tomllib

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "pyproject.toml"), "rb") as handle:
        project = tomllib.load(handle)["project"]
    names = {re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower() for spec in project["dependencies"]}
    assert names == {"libcst", "pyyaml"}
    with open(os.path.join(root, ".pre-commit-hooks.yaml"), "rb") as handle:
        import yaml

        hooks = {hook["id"]: hook for hook in yaml.safe_load(handle)}
    assert {"msprobe-no-instrumentation", "msprobe-restore", "msprobe-lint"} <= set(hooks)
    assert all(hook["language"] == "python" and not hook.get("additional_dependencies") for hook in hooks.values())
