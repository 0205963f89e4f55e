"""The native op's build cache under faults (runtime/native_cache.py, runtime/native_stats.py): a cached library
is loaded only while it is what its build made, and a build folder appears at its name only whole.

Every load runs in a fresh interpreter (fixtures/native_cache/load_op.py), so that a library that kills its
loader (SIGBUS) fails the test instead of pytest. Its build is torch's ``cpp_extension.load`` stood in for by a copy
of this session's real build, which the corrupted copies are told apart from, except where two processes build
at once.
"""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import cache_folders, native_cache, native_stats  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOAD_OP = os.path.join(ROOT, "fixtures", "native_cache", "load_op.py")
LIBRARY = f"{native_stats.NAME}.so"


@pytest.fixture(scope="module")
def built(native, tmp_path_factory):
    """A copy of this session's whole build folder: the library a stood-in build makes, and a cache to corrupt."""
    copy = tmp_path_factory.mktemp("built") / os.path.basename(native_stats.build_directory())
    shutil.copytree(native_stats.build_directory(), copy, ignore=shutil.ignore_patterns("lock"))
    return copy


def builds_folder(tmp_path):
    """The folder of the op's builds: ``native/`` in the tool's cache folder (``cache_folders``)."""
    return tmp_path / "cache" / cache_folders.NATIVE


def load_op(cache, mode, library, **popen):
    """Run load_op.py with ``cache`` as the folder of the op's builds (its parent as the tool's cache folder) and
    the op switched on, whatever this session's environment says; a CompletedProcess, or the Popen where
    ``popen`` asks for one."""
    assert os.path.basename(cache) == cache_folders.NATIVE, cache
    env = dict(os.environ, MSPROBE_CACHE_DIR=os.path.dirname(cache))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("MSPROBE_NATIVE_STATS", None)
    command = [sys.executable, LOAD_OP, mode, str(library)]
    if popen:
        return subprocess.Popen(command, env=env, text=True, **popen)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def loaded(done):
    """load_op.py's answer, after checking that its process ended normally with the op loaded and serving."""
    assert done.returncode == 0, f"load_op.py ended with {done.returncode}:\n{done.stderr}"
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["loaded"], done.stderr
    numbers = answer["stats"]
    assert numbers[:3] == [4.0, -2.0, 1.0] and numbers[4:] == [0.0, 0.0], numbers
    assert math.isclose(numbers[3], math.sqrt(21.0), rel_tol=1e-6), numbers
    return answer


def cached_copy(built, tmp_path):
    """``(cache, its build folder)``: a cache holding a copy of this session's build."""
    cache = builds_folder(tmp_path)
    folder = cache / built.name
    shutil.copytree(built, folder)
    return cache, folder


def test_a_truncated_cached_library_is_built_again_not_loaded(built, tmp_path):
    """A library cut short after its build, its ready marker still there, killed the process that loaded it
    with SIGBUS. It is not loaded: a warning says why, the op is built again in its place and serves."""
    cache, folder = cached_copy(built, tmp_path)
    good = (built / LIBRARY).read_bytes()
    with open(folder / LIBRARY, "r+b") as handle:
        handle.truncate(len(good) // 2)
    done = load_op(cache, "copy", built / LIBRARY)
    loaded(done)
    assert "is not loaded" in done.stderr and f"holds {len(good) // 2} bytes" in done.stderr, done.stderr
    assert (folder / LIBRARY).read_bytes() == good
    assert native_cache.checked_library(str(folder)) == (str(folder / LIBRARY), None)


def test_a_cached_library_whose_bytes_changed_is_built_again_not_loaded(built, tmp_path):
    """Bytes changed but not the size: only the sha256 tells. The changed library is not loaded."""
    cache, folder = cached_copy(built, tmp_path)
    good = (built / LIBRARY).read_bytes()
    middle = len(good) // 2
    changed = good[:middle] + bytes(b ^ 0xFF for b in good[middle : middle + 64]) + good[middle + 64 :]
    (folder / LIBRARY).write_bytes(changed)
    done = load_op(cache, "copy", built / LIBRARY)
    loaded(done)
    assert "is not loaded" in done.stderr and "sha256 is not its build's" in done.stderr, done.stderr
    assert (folder / LIBRARY).read_bytes() == good


@pytest.mark.slow  # over 2 s: `make check` leaves it to `make test`
def test_a_build_killed_midway_leaves_nothing_at_the_final_name(built, tmp_path):
    """The build ran in the final folder: one killed midway (a rank that torchrun kills) left half a library
    there. It runs in a private folder beside it, and nothing is at the final name until the build is whole;
    the next process builds it and loads it."""
    cache = builds_folder(tmp_path)
    final = cache / built.name
    process = load_op(
        cache, "hang", built / LIBRARY, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        line = process.stdout.readline()
        assert line, process.communicate()[1]
        building = json.loads(line)["building"]  # half of the library is written there now
        assert os.path.dirname(building) == str(cache) and building != str(final)
        assert not final.exists()
    finally:
        process.kill()
        process.communicate()
    assert not final.exists()
    loaded(load_op(cache, "copy", built / LIBRARY))
    assert native_cache.checked_library(str(final)) == (str(final / LIBRARY), None)


def test_a_build_that_finds_another_whole_build_in_place_keeps_that_one(built, tmp_path):
    """Machines that share a cache do not see each other's lock: another's whole build can take the final name
    while this one compiles. It stays as it is (a process may have loaded it: rewriting it in place is a
    SIGBUS there), this build's folder is removed, and the op this process built serves it."""
    cache = builds_folder(tmp_path)
    final = cache / built.name
    loaded(load_op(cache, f"other:{built}", built / LIBRARY))
    assert (final / LIBRARY).read_bytes() == (built / LIBRARY).read_bytes()
    assert native_cache.checked_library(str(final)) == (str(final / LIBRARY), None)
    assert sorted(os.listdir(cache)) == [built.name, f"{built.name}.lock"]  # no build folder left behind


@pytest.mark.slow  # a real build: about a minute
def test_two_processes_that_load_at_once_with_an_empty_cache_both_get_the_op(native, tmp_path):
    """Two ranks starting together with nothing cached: one builds, the other waits for its lock and loads
    its build after checking it; both end with the op."""
    cache = builds_folder(tmp_path)
    processes = [load_op(cache, "build", "-", stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [process.communicate(timeout=900) for process in processes]
    ended = [subprocess.CompletedProcess(p.args, p.returncode, *output) for p, output in zip(processes, outputs)]
    for done in ended:
        loaded(done)
    builders = [done for done in ended if "building the native statistics op" in done.stderr]
    assert len(builders) == 1, [done.stderr for done in ended]
    final = cache / os.path.basename(native_stats.build_directory())
    assert native_cache.checked_library(str(final)) == (str(final / LIBRARY), None)
    assert sorted(os.listdir(cache)) == [final.name, f"{final.name}.lock"]


def test_an_edit_of_any_file_of_the_op_is_a_build_of_its_own(tmp_path, monkeypatch):
    """The build folder is keyed by the bytes of every file in runtime/native/: an edited .cpp, or a file
    added there (a header that a .cpp includes), names another folder, never the build of the old bytes.
    Where the files lie is not part of the key: an installed copy shares a checkout's build."""
    real = native_stats.build_directory()
    copy = tmp_path / "native"
    shutil.copytree(native_stats.NATIVE_DIR, copy)
    monkeypatch.setattr(native_stats, "NATIVE_DIR", str(copy))
    assert native_stats.build_directory() == real
    seen = {real}
    for name in native_stats.SOURCES:
        source = copy / name
        original = source.read_bytes()
        middle = len(original) // 2  # one byte changed, the size kept
        source.write_bytes(original[:middle] + bytes([original[middle] ^ 1]) + original[middle + 1 :])
        seen.add(native_stats.build_directory())
        source.write_bytes(original + b"\n")
        seen.add(native_stats.build_directory())
        source.write_bytes(original)
    assert native_stats.build_directory() == real
    (copy / "lanes.h").write_bytes(b"#pragma once\n")
    seen.add(native_stats.build_directory())
    assert len(seen) == 2 * len(native_stats.SOURCES) + 2
