"""What a non-editable install carries besides Python: every other file under runtime/ matches one of
pyproject.toml's package-data globs for msprobe_runtime, the native op's C++ (runtime/native/, compiled on the
user's machine at the first start()) above all. A file no glob covers is left out of the wheel, and the op
then cannot be built there; the globs are matched as setuptools matches them (``glob``, relative to the
package's folder)."""

import glob
import os

import pytest

from msprobe_runtime import native_stats

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNTIME = os.path.join(ROOT, "runtime")


def _package_data():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        config = tomllib.load(handle)["tool"]["setuptools"]
    assert config["package-dir"]["msprobe_runtime"] == "runtime"
    return config.get("package-data", {}).get("msprobe_runtime", [])


def _covered():
    return {
        os.path.relpath(path, RUNTIME)
        for pattern in _package_data()
        for path in glob.glob(os.path.join(RUNTIME, pattern))
        if os.path.isfile(path)
    }


def _data_files():
    found = set()
    for folder, folders, files in os.walk(RUNTIME):
        folders[:] = [name for name in folders if name != "__pycache__"]
        for name in files:
            if not name.endswith((".py", ".pyc")):
                found.add(os.path.relpath(os.path.join(folder, name), RUNTIME))
    return found


def test_every_file_of_the_runtime_that_is_not_python_is_package_data():
    assert _data_files() - _covered() == set()


def test_the_native_ops_sources_are_package_data():
    """The files native_stats compiles, and the rest of runtime/native/ (its cache key reads them all)."""
    native = {name for name in _data_files() if name.startswith("native" + os.sep)}
    assert {os.path.join("native", name) for name in native_stats.SOURCES} <= native
    assert native <= _covered()
