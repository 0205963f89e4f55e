"""The terminal's headline: one first suspect, the threshold view below it, and why the two differ.

Before, compare printed "first suspect: X" and then "first divergence: Y" as two headlines naming two
operators, with nothing on which to believe. Hand-written dumps (``test_propagation._chain``), the CLI in a
fresh interpreter.
"""

from .conftest import run_compare
from .test_propagation import OPS, _chain


def _headlines(out):
    return [
        line
        for line in out.splitlines()
        if not line.startswith(" ") and line.startswith(("first suspect", "first divergence"))
    ]


def test_a_suspect_below_the_threshold_heads_and_the_crossing_is_explained(tmp_path):
    # gelu.0 puts in 2e-4 (below float32's 1e-3); the error grows through the next linear past the threshold
    errors = [0.0] * len(OPS)
    errors[1] = errors[2] = 2e-4
    for later in range(3, len(OPS)):
        errors[later] = 2e-3
    a, b = _chain(tmp_path, errors, OPS)
    code, out, err = run_compare(a, b)
    assert code == 1, out + err
    assert _headlines(out) == ["first suspect: Functional.gelu.0.forward in a"], out
    lines = out.splitlines()
    view = next(line for line in lines if "threshold view, first divergence:" in line)
    assert "Functional.linear.1.forward" in view and lines.index(view) > lines.index(_headlines(out)[0])
    why = next(line for line in lines if line.startswith("  why they differ:"))
    assert "Functional.gelu.0.forward runs first" in why and "below the threshold" in why


def test_the_same_entry_in_both_views_needs_no_reason(tmp_path):
    errors = [0.0] * len(OPS)
    for later in range(7, len(OPS)):
        errors[later] = 4e-3
    a, b = _chain(tmp_path, errors, OPS)
    code, out, err = run_compare(a, b)
    assert code == 1, out + err
    assert _headlines(out) == ["first suspect: Functional.gelu.2.forward in a"], out
    assert "threshold view, first divergence: Functional.gelu.2.forward in a" in out and "the same entry" in out
    assert "why they differ" not in out


def test_agreeing_runs_have_one_headline(tmp_path):
    a, b = _chain(tmp_path, [0.0] * len(OPS), OPS)
    code, out, err = run_compare(a, b)
    assert code == 0, out + err
    assert _headlines(out) == [
        "first suspect: none (every output error is explained by its inputs' error and the noise)"
    ]
    assert "first divergence: none" in out and "why they differ" not in out
