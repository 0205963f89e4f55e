"""The versions we test are stated once, in pyproject.toml's ``[tool.msprobe-rewrite.tested]``; the
classifiers, the README's "Versions" section and docs/versions.md say the same."""

import os
import re

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as handle:
        return handle.read()


@pytest.fixture(scope="module")
def project():
    return tomllib.loads(_read("pyproject.toml"))


@pytest.fixture(scope="module")
def tested(project):
    table = project["tool"]["msprobe-rewrite"]["tested"]
    assert table["python"] and table["torch"]
    return table


def test_the_classifiers_name_exactly_the_pythons_tested(project, tested):
    named = sorted(
        c.rsplit(" :: ", 1)[1]
        for c in project["project"]["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert named == sorted(tested["python"])
    minimum = re.fullmatch(r">=(3\.\d+)", project["project"]["requires-python"]).group(1)
    assert all(tuple(map(int, v.split("."))) >= tuple(map(int, minimum.split("."))) for v in tested["python"])


def test_the_readme_states_the_versions_tested(tested):
    readme = _read("README.md")
    section = readme.split("### Versions\n", 1)[1].split("\n#", 1)[0]
    stated_pythons = set(re.findall(r"CPython (3\.\d+)", section))
    stated_torches = set(re.findall(r"torch (2\.\d+)", section))
    assert stated_pythons == set(tested["python"]) and stated_torches == set(tested["torch"])


def test_docs_versions_has_a_row_for_each_release_tested(tested):
    rows = [line for line in _read("docs", "versions.md").splitlines() if line.startswith("| ")]
    for version in tested["python"]:
        assert any(f"| {version}" in row for row in rows), version
    for version in tested["torch"]:
        assert any(f" {version}" in row for row in rows), version
