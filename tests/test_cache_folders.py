"""One cache folder for the tool (``msprobe_runtime.cache_folders``): the rewrite command's result cache in its
``rewrite/``, the native statistics op's build in its ``native/``. Before, the two had separate roots whose
default names differed by one character (``$XDG_CACHE_HOME/msprobe-rewrite`` for the rewrite,
``$XDG_CACHE_HOME/msprobe_rewrite`` for the op), each with its own variable (issue 33).

Each test uses both caches for real, as a user does: a rewrite of a small tree through the CLI (the real
compiler) writes result entries, and the runtime's ``native_stats.load()`` with a build that fails at once (no
minute-long compile) leaves its failure note in the op's build folder. Then it looks where the files went."""

import os

import pytest

from msprobe_rewrite import cli
import msprobe_runtime.native_stats as native_stats

SOURCE = b"import torch\n\n\ndef f(x):\n    return torch.relu(x)\n"


@pytest.fixture
def environment(tmp_path, monkeypatch):
    """No cache variable set, and a home of the test's own, so that nothing reaches the user's caches."""
    for name in ("MSPROBE_CACHE_DIR", "MSPROBE_REWRITE_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("MSPROBE_NATIVE_STATS", raising=False)  # (with the op turned off no build is tried)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    os.makedirs(tmp_path / "home")
    return monkeypatch


def _files(folder):
    return sorted(
        os.path.relpath(os.path.join(here, name), folder) for here, _, names in os.walk(folder) for name in names
    )


def _use_both_caches(tmp_path, monkeypatch):
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "a.py").write_bytes(SOURCE)
    assert cli.main([str(tree)]) == 0  # a changed file: its result is cached

    def failing_build(directory):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(native_stats, "_build", failing_build)
    native_stats.reset()
    try:
        assert native_stats.load() is None  # the failure is noted in the op's build folder
    finally:
        native_stats.reset()


def _assert_rewrite_entries(folder):
    files = _files(folder)
    # one generation folder (tagged as a cache) holding the entry of a.py
    assert any(name.endswith("CACHEDIR.TAG") for name in files), files
    assert len([name for name in files if not name.endswith("CACHEDIR.TAG")]) >= 1, files


def _assert_native_build(folder):
    files = _files(folder)
    assert any(name.startswith("stats-torch") and name.endswith(os.sep + native_stats.FAILED) for name in files), files


@pytest.mark.parametrize("xdg", [True, False], ids=["XDG_CACHE_HOME", "home"])
def test_both_caches_land_in_one_folder_by_default(xdg, tmp_path, environment):
    if xdg:
        environment.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    base = tmp_path / "xdg" if xdg else tmp_path / "home" / ".cache"
    _use_both_caches(tmp_path, environment)
    assert os.listdir(base) == ["msprobe-rewrite"]  # one folder; no "msprobe_rewrite" beside it
    assert sorted(os.listdir(base / "msprobe-rewrite")) == ["native", "rewrite"]
    _assert_rewrite_entries(base / "msprobe-rewrite" / "rewrite")
    _assert_native_build(base / "msprobe-rewrite" / "native")
    if xdg:
        assert os.listdir(tmp_path / "home") == []


def test_msprobe_cache_dir_moves_both(tmp_path, environment):
    environment.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    environment.setenv("MSPROBE_CACHE_DIR", str(tmp_path / "mine"))
    _use_both_caches(tmp_path, environment)
    assert sorted(os.listdir(tmp_path / "mine")) == ["native", "rewrite"]
    _assert_rewrite_entries(tmp_path / "mine" / "rewrite")
    _assert_native_build(tmp_path / "mine" / "native")
    assert not os.path.exists(tmp_path / "xdg") and os.listdir(tmp_path / "home") == []


def test_the_older_variable_still_moves_the_rewrite_cache(tmp_path, environment):
    """``MSPROBE_REWRITE_CACHE_DIR`` is kept for compatibility: set, it is the rewrite cache's folder itself
    (as before, so an existing cache there is still used), whatever ``MSPROBE_CACHE_DIR`` says."""
    environment.setenv("MSPROBE_CACHE_DIR", str(tmp_path / "mine"))
    environment.setenv("MSPROBE_REWRITE_CACHE_DIR", str(tmp_path / "old"))
    _use_both_caches(tmp_path, environment)
    _assert_rewrite_entries(tmp_path / "old")
    assert os.listdir(tmp_path / "mine") == ["native"]
    _assert_native_build(tmp_path / "mine" / "native")
    assert os.listdir(tmp_path / "home") == []
