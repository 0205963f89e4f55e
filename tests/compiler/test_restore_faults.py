"""Faults of restore and of parse errors: a deleted runtime import, a runtime import a formatter split off its
line, and syntax errors reported as Python reports them.
"""

from __future__ import annotations

import warnings
from textwrap import dedent

import pytest

from msprobe_rewrite import api, cli, guard
from msprobe_rewrite.api import RewriteError, is_instrumented, restore_source, rewrite_source

PREAMBLE = b"import msprobe_runtime as __msprobe__; "


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("MSPROBE_REWRITE_CACHE_DIR", str(path))
    return path


def restore_quietly(source: bytes) -> bytes:
    """``restore_source``, failing on any RestoreWarning (the case is one restore must get exactly)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", api.RestoreWarning)
        return restore_source(source)


# -- 1. the runtime import deleted by hand ---------------------------------------------------------------

ORIGINAL = b"import torch\ny = torch.relu(x)\nif y > 0:\n    z = y + 1\n"


def without_import(source: bytes) -> bytes:
    instrumented = rewrite_source(source)
    assert instrumented.startswith(PREAMBLE)
    return instrumented[len(PREAMBLE) :]


def test_forms_without_the_runtime_import_are_instrumented_and_restored_with_a_note():
    stripped = without_import(ORIGINAL)
    assert b"__msprobe__.call(" in stripped
    assert is_instrumented(stripped)
    with pytest.warns(api.RestoreWarning, match=r"m\.py: .*runtime import .* was missing"):
        assert restore_source(stripped, path="m.py") == ORIGINAL


def test_rewriting_a_file_whose_import_was_deleted_instruments_it_afresh():
    stripped = without_import(ORIGINAL)
    with pytest.warns(api.RestoreWarning):
        assert rewrite_source(stripped) == rewrite_source(ORIGINAL)


def test_forms_only_in_strings_or_of_a_module_that_binds_the_name_itself_are_left_alone():
    # Can fail: a detector that restores text in strings, or a name the user binds to something else.
    in_string = b'DOC = "__msprobe__.add(a, b) is a + b"\nx = f(y)\n'
    own_name = b"__msprobe__ = Probe()\ny = __msprobe__.add(a, b)\n"
    for source in (in_string, own_name):
        assert restore_quietly(source) == source
        assert guard.instrumented_original(source, "m.py") is None


def test_forms_whose_import_stands_where_restore_does_not_look_are_restored_with_a_note():
    source = b"if True:\n    import msprobe_runtime as __msprobe__\ny = __msprobe__.dyn(f, x)\n"
    with pytest.warns(api.RestoreWarning, match="left where it is"):
        assert restore_source(source) == b"if True:\n    import msprobe_runtime as __msprobe__\ny = f(x)\n"


def test_cli_restore_counts_a_file_whose_import_was_deleted_as_restored(tmp_path, capsys):
    path = tmp_path / "m.py"
    path.write_bytes(without_import(ORIGINAL))
    with pytest.warns(api.RestoreWarning, match="was missing"):
        code = cli.main([str(path), "--restore", "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "1 restored, 0 unchanged" in err
    assert path.read_bytes() == ORIGINAL


def test_guard_flags_a_file_whose_import_was_deleted_and_fix_restores_it(tmp_path, capsys):
    path = tmp_path / "m.py"
    path.write_bytes(without_import(ORIGINAL))
    assert guard.main([str(path)]) == guard.EXIT_FOUND
    out, err = capsys.readouterr()
    assert f"{path}: instrumented by msprobe-rewrite" in out
    assert "was missing" in out + err
    assert guard.main([str(path), "--fix"]) == guard.EXIT_CLEAN
    assert path.read_bytes() == ORIGINAL


# -- 2. a formatter split the runtime import off its line --------------------------------------------------


def split_like_black(instrumented: bytes) -> bytes:
    """What black does to the import's line: each statement of ``a; b`` on a line of its own."""
    lines = instrumented.split(b"\n")
    for number, line in enumerate(lines):
        if b"import msprobe_runtime as __msprobe__; " in line:
            indent = line[: len(line) - len(line.lstrip())]
            head, _, rest = line.partition(b"; ")
            parts = rest.split(b"; ")
            lines[number] = b"\n".join([head, *(indent + part for part in parts)])
            break
    return b"\n".join(lines)


SPLIT_CASES = {
    "first statement": """\
        import torch
        y = torch.relu(x)
        """,
    "after docstring and __future__": '''\
        """Module docstring."""
        from __future__ import annotations
        import torch
        y = torch.relu(x)
        ''',
    "after __future__ on the same line": """\
        from __future__ import annotations; import os
        y = f(x)
        """,
    "into a try body past a def": """\
        def helper(x):
            return f(x)
        try:
            import torch
        except ImportError:
            torch = None
        """,
    "with a trailing comment and leading comments": """\
        # header comment

        x = f(y)  # a comment
        if x:
            pass
        """,
}


@pytest.mark.parametrize("name", sorted(SPLIT_CASES))
def test_restore_after_a_formatter_split_the_import_line_gives_the_original(name):
    original = dedent(SPLIT_CASES[name]).encode()
    split = split_like_black(rewrite_source(original))
    assert split.count(b"\n") == original.count(b"\n") + 1 + (name == "after __future__ on the same line")
    want = original.replace(b"annotations; import os", b"annotations\nimport os")  # the formatter's own change
    assert restore_quietly(split) == want


def test_the_placements_on_a_blank_or_comment_line_still_restore_exactly_and_quietly():
    # Can fail: a rule for split lines that also takes these (the import on a line of its own) for one.
    for original in (
        b"#!/usr/bin/env python\n# -*- coding: utf-8 -*-\n\nif cond():\n    y = g(x)\n",
        b'"""Doc."""\n\n# note\nclass A:\n    y = f(x)\n',
        b"def a():\n    return f(x)\n\n# why\n@a\ndef b():\n    pass\n",
    ):
        instrumented = rewrite_source(original)
        assert b"\nimport msprobe_runtime as __msprobe__" in instrumented
        assert restore_quietly(instrumented) == original


def test_an_import_where_no_placement_puts_it_is_restored_with_a_warning_naming_the_file():
    # black's split of `"""Doc."""; import msprobe_runtime as __msprobe__`, with the blank lines it adds.
    formatted = b'"""Doc."""\n\nimport msprobe_runtime as __msprobe__\n\n\nclass A:\n    y = __msprobe__.dyn(f, x)\n'
    with pytest.warns(api.RestoreWarning, match=r"^m\.py: .*may differ"):
        restored = restore_source(formatted, path="m.py")
    assert b"msprobe" not in restored and b"y = f(x)" in restored


def test_an_import_left_as_the_last_statement_is_restored_with_a_warning():
    # It was a PlacementError that escaped restore_source (an internal error in the CLI).
    source = b"y = __msprobe__.dyn(f, x)\nimport msprobe_runtime as __msprobe__\n"
    with pytest.warns(api.RestoreWarning, match="may differ"):
        assert restore_source(source) == b"y = f(x)\n"


# -- 3. syntax errors as Python reports them ---------------------------------------------------------------


@pytest.mark.parametrize(
    "source, message",
    [
        (b"x = 1\nprint(\x00)\n", r"cannot parse: source code (string )?cannot contain null bytes \(line 2\)"),
        (b"import torch\ny = (torch.relu(x),\nz = 2\n", r"cannot parse: '\(' was never closed \(line 2, column 5\)"),
        (b"import torch\ndef f(:\n    pass\n", r"cannot parse: invalid syntax \(line 2, column 7\)"),
    ],
)
def test_a_syntax_error_is_reported_with_pythons_message_and_line(source, message):
    for function in (rewrite_source, lambda s, path: restore_source(PREAMBLE + s, path=path)):
        with pytest.raises(RewriteError, match=r"^bad\.py: " + message + "$"):
            function(source, path="bad.py")


def test_where_python_accepts_what_libcst_rejects_libcsts_reason_is_given(monkeypatch):
    # Can fail: a reason taken from nowhere, or Python's verdict (none) reported as an error.
    def reject(source):
        raise ValueError("libcst says no")

    monkeypatch.setattr(api.cst, "parse_module", reject)
    with pytest.raises(RewriteError, match=r"^ok\.py: cannot parse: ValueError: libcst says no$"):
        rewrite_source(b"import torch\ny = torch.relu(x)\n", path="ok.py")


def test_cli_reports_a_syntax_error_at_pythons_line(tmp_path, capsys):
    path = tmp_path / "n.py"
    path.write_bytes(b"x = 1\nprint(\x00)\n")
    assert cli.main([str(path), "--check", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "Syntax Error @" not in err
    assert f"{path}: cannot parse: source code" in err and "null bytes (line 2)" in err


@pytest.mark.slow
def test_the_command_says_a_restore_note_as_one_line_of_its_own(tmp_path):
    """As the user sees it: `msprobe-rewrite: warning: PATH: ...`, not a Python warning into the batch code."""
    import subprocess
    import sys

    path = tmp_path / "m.py"
    path.write_text('import torch\ny = __msprobe__.call("Torch.relu", torch.relu, x)\n')
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "--restore", str(tmp_path), "--no-cache"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"msprobe-rewrite: warning: {path}: its runtime import" in done.stderr
    assert "RestoreWarning" not in done.stderr and "batch.py" not in done.stderr
    assert path.read_text() == "import torch\ny = torch.relu(x)\n"
