"""Golden tests of the lint: each file in cases/ is checked with the arguments on its `# lint-args:` line,
and the text output must equal cases/<name>.expected (an empty file: the rule must stay silent there).

Regenerate after a deliberate change with MSPROBE_UPDATE_GOLDEN=1, then read the diff.
"""

import os
import re
import shlex

import pytest

from msprobe_rewrite.lint.runner import main

CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases")
NAMES = sorted(name for name in os.listdir(CASES) if name.endswith(".py"))
ARGS = re.compile(r"^# lint-args:(.*)$", re.MULTILINE)


@pytest.mark.parametrize("name", NAMES)
def test_golden(name, monkeypatch, capsys):
    monkeypatch.chdir(CASES)
    with open(name, encoding="utf-8") as handle:
        match = ARGS.search(handle.read())
    args = shlex.split(match.group(1)) if match else []
    code = main([*args, "--quiet", name])
    output = capsys.readouterr().out
    expected_path = name[:-3] + ".expected"
    if os.environ.get("MSPROBE_UPDATE_GOLDEN"):
        with open(expected_path, "w", encoding="utf-8") as handle:
            handle.write(output)
    with open(expected_path, encoding="utf-8") as handle:
        expected = handle.read()
    assert output == expected
    assert code == (1 if expected else 0)


def test_every_rule_has_a_firing_and_a_silent_case():
    from msprobe_rewrite.lint.rules import RULES

    for code in RULES:
        prefix = code.lower()
        assert any(n.startswith(prefix) and not n.endswith("_silent.py") for n in NAMES), code
        assert f"{prefix}_silent.py" in NAMES, code
