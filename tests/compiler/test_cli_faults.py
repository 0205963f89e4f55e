"""Faults of the rewrite command's file handling: a non-empty --out folder, ownership and hard links under
an in-place rewrite, non-regular files in the tree, and workers whose parent was killed.

The compiler is the reversible stand-in of ``test_cli`` (``fake``) wherever the compiler itself is not the
point, so each test is about the CLI's mechanics only.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from msprobe_rewrite import atomic, batch, cli
from msprobe_rewrite.files import PYTHON, Entry, discover


def _test_cli():
    # The stand-in compiler, the fixtures and the helpers of test_cli, loaded by path: the tests run under
    # --import-mode=importlib, which puts no test folder on sys.path.
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_cli.py")
    spec = importlib.util.spec_from_file_location("_msprobe_rewrite_test_cli_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_helpers = _test_cli()
PLAIN_SOURCE, TORCH_SOURCE, FakeCompiler = _helpers.PLAIN_SOURCE, _helpers.TORCH_SOURCE, _helpers.FakeCompiler
make_tree, run, snapshot = _helpers.make_tree, _helpers.run, _helpers.snapshot
cache_dir, fake, tree = _helpers.cache_dir, _helpers.fake, _helpers.tree  # fixtures (cache_dir is autouse)

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file to another owner needs root"
)
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")


# --- 1. --out into a folder that holds the user's files ----------------------------------------------


def test_out_refuses_a_non_empty_folder_it_did_not_write(fake, tree, tmp_path, capsys):
    dest = make_tree(tmp_path / "dest", {"a.py": b"precious user file", "notes/todo.txt": b"mine\n"})
    before = snapshot(dest)
    code, _, err = run([tree, "--out", dest], capsys)
    assert code == 2
    assert "not empty" in err and "--force" in err
    assert snapshot(dest) == before  # nothing written, not even the marker
    assert sorted(os.listdir(dest)) == ["a.py", "notes"]


def test_out_force_writes_into_a_non_empty_folder(fake, tree, tmp_path):
    dest = make_tree(tmp_path / "dest", {"a.py": b"precious user file", "keep.txt": b"mine\n"})
    assert run([tree, "--out", dest, "--force"]) == 0
    assert (dest / "a.py").read_bytes() == FakeCompiler.PREFIX + TORCH_SOURCE
    assert (dest / "keep.txt").read_bytes() == b"mine\n"
    assert (dest / cli.OUT_MARKER).is_file()


def test_out_marks_its_folder_and_accepts_it_again(fake, tree, tmp_path):
    dest = tmp_path / "dest"
    assert run([tree, "--out", dest]) == 0
    assert (dest / cli.OUT_MARKER).is_file()
    (tree / "plain.py").write_bytes(PLAIN_SOURCE + b"# edited\n")
    assert run([tree, "--out", dest]) == 0  # its own output: refreshed without --force
    assert (dest / "plain.py").read_bytes() == PLAIN_SOURCE + b"# edited\n"
    # An existing empty folder is fine too, and gets the marker.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run([tree, "--out", empty]) == 0
    assert (empty / cli.OUT_MARKER).is_file()


# --- 2. owner, group, mode and hard links under an in-place rewrite ---------------------------------


@needs_root
@pytest.mark.parametrize("restore", [False, True], ids=["rewrite", "restore"])
def test_in_place_keeps_owner_group_and_mode(fake, tree, restore):
    target = tree / "a.py"
    if restore:
        assert run([tree, "--jobs", "1"]) == 0
    os.chown(target, 1234, 1234)
    target.chmod(0o640)
    args = [tree, "--jobs", "1"] + (["--restore"] if restore else [])
    assert run(args) == 0
    assert target.read_bytes() == (TORCH_SOURCE if restore else FakeCompiler.PREFIX + TORCH_SOURCE)
    st = target.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 1234, 0o640)


@needs_root
def test_write_atomic_keeps_setgid_after_chown(tmp_path):
    # chown clears set-id bits: the mode has to be set after the owner.
    path = tmp_path / "f.py"
    path.write_bytes(b"x\n")
    os.chown(path, 1234, 1234)
    path.chmod(0o2755)
    atomic.write_atomic(str(path), b"y\n")
    st = path.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 1234, 0o2755)


def test_in_place_refuses_a_hard_linked_file(fake, tree, tmp_path, capsys):
    other = tmp_path / "elsewhere.py"
    os.link(tree / "a.py", other)
    inode = other.stat().st_ino
    code, _, err = run([tree, "--jobs", "1"], capsys)
    assert code == 2
    assert f"{tree / 'a.py'}: " in err and "hard link" in err
    assert (tree / "a.py").read_bytes() == TORCH_SOURCE
    assert (tree / "a.py").stat().st_ino == inode and other.stat().st_nlink == 2  # the link is intact
    assert (tree / "pkg/b.py").read_bytes().startswith(FakeCompiler.PREFIX)  # the others are still done
    assert "1 changed, 2 unchanged, 0 skipped, 1 failed" in err


def test_restore_refuses_a_hard_linked_file(fake, tree, tmp_path, capsys):
    assert run([tree, "--jobs", "1"]) == 0
    os.link(tree / "a.py", tmp_path / "elsewhere.py")
    code, _, err = run([tree, "--restore", "--jobs", "1"], capsys)
    assert code == 2 and "hard link" in err
    assert (tree / "a.py").read_bytes() == FakeCompiler.PREFIX + TORCH_SOURCE
    assert (tmp_path / "elsewhere.py").stat().st_nlink == 2


# --- 3. a named pipe (or any non-regular file) in the tree ------------------------------------------


def _in_thread_or_unblock(fifo, call, timeout=10.0):
    """Run ``call`` in a thread; if it is still blocked after ``timeout`` (in open() or read() of the
    pipe), open the pipe's writing end and close it, so the reader sees end of file and the test fails
    instead of hanging."""
    result = {}

    def target():
        result["value"] = call()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    blocked = thread.is_alive()
    if blocked:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass
        thread.join(10)
    assert not blocked, f"blocked on the named pipe {fifo}"
    return result.get("value")


@needs_fifo
def test_check_skips_a_named_pipe_instead_of_blocking(fake, tree, capsys):
    fifo = tree / "pipe.py"
    os.mkfifo(fifo)
    code = _in_thread_or_unblock(fifo, lambda: cli.main([str(tree), "--check", "-v", "--jobs", "1"]))
    out, err = capsys.readouterr()
    assert code == 1
    assert f"skipped {fifo} (not a regular file)" in err
    assert "1 skipped, 0 failed" in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@needs_fifo
def test_a_named_pipe_given_as_path_is_skipped(fake, tmp_path, capsys):
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    code = _in_thread_or_unblock(fifo, lambda: cli.main([str(fifo), "-v"]))
    err = capsys.readouterr().err
    assert code == 0
    assert f"skipped {fifo} (not a regular file)" in err


@needs_fifo
def test_batch_never_opens_a_non_regular_file_even_if_it_appeared_after_the_walk(fake, tmp_path):
    # The walk saw a .py file; by the time it is read, it is a named pipe.
    fifo = tmp_path / "late.py"
    os.mkfifo(fifo)
    entries = [Entry(str(fifo), "late.py", PYTHON)]
    outcomes = _in_thread_or_unblock(fifo, lambda: batch.run(entries, batch.Options(jobs=1, catalogue=None)))
    assert [(o.status, o.reason) for o in outcomes] == [(batch.SKIPPED, "not a regular file")]


@needs_fifo
def test_out_skips_non_regular_files_it_cannot_copy(fake, tree, tmp_path, capsys):
    os.mkfifo(tree / "events.fifo")
    dest = tmp_path / "out"
    code, _, err = run([tree, "--out", dest, "-v"], capsys)
    assert code == 0, err
    assert "not a regular file" in err and "0 failed" in err
    assert not os.path.lexists(dest / "events.fifo")
    assert (dest / "a.py").read_bytes() == FakeCompiler.PREFIX + TORCH_SOURCE


@needs_fifo
def test_discover_classifies_a_named_pipe(tmp_path):
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "ok.py").write_bytes(b"")
    kinds = {e.rel: e.kind for e in discover([str(tmp_path)])}
    assert kinds["ok.py"] == PYTHON and kinds["pipe.py"] != PYTHON


# --- 4. workers whose parent was killed -----------------------------------------------------------


def _megatron_tree():
    """The installed megatron package's folder (some 400 files: a few seconds of work), or None."""
    try:
        spec = importlib.util.find_spec("megatron.core")  # found, not imported: its files are all we need
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(list(spec.submodule_search_locations)[0])


def _processes_in_group(pgid):
    """Pids of live (not zombie) processes whose process group is ``pgid``, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(name))
    return found


@pytest.mark.slow  # spawns the CLI and its workers, and kills them
@pytest.mark.skipif(not os.path.isdir("/proc") or sys.platform != "linux", reason="reads /proc")
def test_workers_exit_quietly_when_the_parent_is_killed(tmp_path):
    tree = _megatron_tree()
    if tree is None:
        pytest.skip("megatron-core is not installed")
    stderr_path = tmp_path / "stderr"
    with open(stderr_path, "wb") as stderr:
        # Its own session: the CLI and its workers form one process group, which this test watches.
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "msprobe_rewrite",
                "--no-cache",
                "--jobs",
                "2",
                "--out",
                str(tmp_path / "out"),
                tree,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            env=dict(os.environ, MSPROBE_REWRITE_CACHE_DIR=str(tmp_path / "cache")),
        )
    pgid = process.pid
    try:
        deadline = time.monotonic() + 60
        while len(_processes_in_group(pgid)) < 3:  # the CLI and its two workers
            assert process.poll() is None, "the CLI finished before it could be killed"
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.02)
        time.sleep(0.7)  # let them get well into their files
        assert process.poll() is None, "the CLI finished before it could be killed"
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 60
        while _processes_in_group(pgid):
            assert time.monotonic() < deadline, "the workers outlived their parent"
            time.sleep(0.05)
    finally:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    printed = stderr_path.read_text(errors="replace")
    assert "Traceback" not in printed, printed[-4000:]
    assert "Error" not in printed, printed[-4000:]


def _ignores_sigint(pid):
    """Whether process ``pid`` ignores SIGINT (its SigIgn mask in /proc); False once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    except OSError:
        pass
    return False


@pytest.mark.slow  # rewrites a copy of megatron with two workers, and interrupts it
@pytest.mark.skipif(not os.path.isdir("/proc") or sys.platform != "linux", reason="reads /proc")
def test_ctrl_c_during_a_parallel_rewrite_exits_130_quietly(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) during ``-j 2``: exit status 130 and
    one line, no worker traceback, no worker left, and every file wholly rewritten or wholly as it was.

    Each process of the group gets the signal at once and the scheduler decides which acts first. Workers that
    act before the CLI printed a KeyboardInterrupt traceback each (and one that died holding a pool lock could
    hang the CLI's shutdown); the CLI, acting first, terminated them mid-print. The test holds the CLI stopped
    until each worker has either ended or is seen to ignore SIGINT, so the workers always act first.

    On a heavily loaded machine the signal has landed after the CLI had its last result (it then finishes the
    run, as it should: a Ctrl-C while the workers are being ended is dropped), in three attempts in a row, in
    two whole-suite runs beside other test runs; alone it lands every time. Such an attempt proves nothing and
    is made again, up to three times, then the test is skipped saying so. Any attempt that prints a traceback,
    leaves a file half-written, hangs, or ends with any other status fails the test.
    """
    tree = _megatron_tree()
    if tree is None:
        pytest.skip("megatron-core is not installed")
    for attempt in range(3):
        code, printed = _interrupt_a_parallel_rewrite(tree, tmp_path / f"attempt{attempt}")
        assert "Traceback" not in printed, printed[-4000:]
        if not (code == 0 and printed.strip().endswith("0 failed")):
            break
    else:
        pytest.skip("in three attempts the Ctrl-C landed only after the run was over (a loaded machine)")
    assert (code, printed.strip()) == (130, "msprobe-rewrite: interrupted"), printed[-4000:]


def _as_a_shell_starts_it():
    # a program started from a terminal takes Ctrl-C: SIGINT handled by default and not blocked, whatever this
    # test process's own state (a child inherits both a blocked mask and an ignored SIGINT across exec)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_a_parallel_rewrite(tree, folder):
    """Ctrl-C a ``-j 2`` rewrite of a copy of ``tree`` in ``folder``; checks that every file is left wholly
    rewritten or wholly as it was, and returns the CLI's exit status and what it printed."""
    import shutil

    from msprobe_rewrite import api

    root = folder / "megatron"
    shutil.copytree(tree, root, ignore=shutil.ignore_patterns("__pycache__"))
    before = snapshot(root)
    stderr_path = folder / "stderr"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "msprobe_rewrite", "--no-cache", "--jobs", "2", str(root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=_as_a_shell_starts_it,
            env=dict(os.environ, MSPROBE_REWRITE_CACHE_DIR=str(folder / "cache")),
        )
    pgid = process.pid
    try:
        deadline = time.monotonic() + 60
        while len(_processes_in_group(pgid)) < 3:  # the CLI and its two workers
            assert process.poll() is None, "the CLI finished before it could be interrupted"
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.02)
        time.sleep(0.5)  # let them get into their files, and the CLI write some
        assert process.poll() is None, "the CLI finished before it could be interrupted"
        workers = [pid for pid in _processes_in_group(pgid) if pid != process.pid]
        os.kill(process.pid, signal.SIGSTOP)
        os.killpg(pgid, signal.SIGINT)
        deadline = time.monotonic() + 60
        while any(pid in _processes_in_group(pgid) and not _ignores_sigint(pid) for pid in workers):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGCONT)
        try:
            code = process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("the CLI hung after Ctrl-C")
        deadline = time.monotonic() + 60
        while _processes_in_group(pgid):
            assert time.monotonic() < deadline, "workers outlived the interrupted CLI"
            time.sleep(0.05)
    finally:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    after = snapshot(root)
    assert sorted(after) == sorted(before)  # no file added (no temporary file left), none lost
    for name, data in after.items():
        if data != before[name]:  # rewritten: all of it, so it restores to the original
            assert api.RUNTIME_IMPORT.encode() in data, name
            assert api.restore_source(data, path=name) == before[name], name
    return code, stderr_path.read_text(errors="replace")


def test_a_file_past_the_size_limit_is_skipped_and_named_never_parsed(tmp_path, capsys, monkeypatch):
    """libcst holds about 1 GB per MB of source: a file past --max-file-size is named on stderr (without -v),
    counted as skipped and left as it is; the other files are rewritten."""
    import msprobe_rewrite.api as api
    from msprobe_rewrite import cli

    parsed = []
    real = api.rewrite_source
    monkeypatch.setattr(
        api, "rewrite_source", lambda source, *a, **k: parsed.append(len(source)) or real(source, *a, **k)
    )
    big = b"import torch\n" + b"y = torch.relu(x)\n" * 70000  # 1.2 MiB
    (tmp_path / "big.py").write_bytes(big)
    (tmp_path / "small.py").write_bytes(b"import torch\ny = torch.relu(x)\n")
    code = cli.main([str(tmp_path), "--max-file-size", "1", "--no-cache", "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 0  # small.py changed: done, exit 0
    assert (tmp_path / "big.py").read_bytes() == big
    assert f"skipped {tmp_path / 'big.py'} (1.2 MiB, past the 1 MiB limit" in err
    assert "1 changed, 0 unchanged, 1 skipped, 0 failed" in err
    assert parsed and max(parsed) < len(big)


# --- 5. restoring every file a rewrite wrote, whatever its size ---------------------------------------------


@pytest.mark.slow  # over 2 s: `make check` leaves it to `make test`
def test_restore_reads_every_file_the_rewrite_wrote(tmp_path, capsys):
    """A module just under --max-file-size grows past it when rewritten (here 4x); the restore, held to the
    same limit, used to skip it and exit 0 with the file still instrumented. It reads up to 8x the limit."""
    limit_mib = 0.05
    line = b"y = torch.relu(x) + -x * 2\n"
    source = b"import torch\n" + line * ((int(limit_mib * (1 << 20)) - 13) // len(line))
    assert len(source) <= limit_mib * (1 << 20)
    target = tmp_path / "big.py"
    target.write_bytes(source)
    flags = ["--max-file-size", str(limit_mib), "--no-cache", "--jobs", "1"]
    assert run([target, *flags]) == 0
    assert len(target.read_bytes()) > limit_mib * (1 << 20)  # the rewrite wrote a file past the limit
    code, _, err = run([target, "--restore", *flags], capsys)
    assert (code, target.read_bytes()) == (0, source), err  # restored: done, exit 0
    assert "1 restored, 0 unchanged, 0 skipped, 0 failed" in err


def test_restore_leaves_a_file_instrumented_only_as_an_error(fake, tmp_path, capsys):
    """An instrumented file past what --restore reads (here rewritten with no limit, restored with a small one) is
    left instrumented: a failure, named, exit 2. A file as large that is not instrumented is only skipped."""
    body = b"x = 1\n" * 2000  # 12 kB, past 8 x 1 kB
    instrumented = FakeCompiler.PREFIX + body
    make_tree(tmp_path / "src", {"instrumented.py": instrumented, "plain.py": body})
    code, _, err = run([tmp_path / "src", "--restore", "--max-file-size", "0.001", "--jobs", "1"], capsys)
    assert code == 2
    assert f"error: {tmp_path / 'src' / 'instrumented.py'}: " in err and "left instrumented" in err
    assert f"skipped {tmp_path / 'src' / 'plain.py'} (" in err  # named without -v, and no error
    assert "error" not in err.split("plain.py", 1)[1].split("\n", 1)[0]
    assert "0 restored, 0 unchanged, 1 skipped, 1 failed" in err
    assert (tmp_path / "src" / "instrumented.py").read_bytes() == instrumented
    assert (tmp_path / "src" / "plain.py").read_bytes() == body


def test_a_rewrite_that_would_outgrow_the_restore_limit_is_not_written(tmp_path, capsys):
    """Each `~` becomes `__msprobe__.invert(...)`: a file within --max-file-size rewrites to 13x its size, past the
    8x a restore with the same limit reads. Written, it could not be restored; so it is left as it is, named."""
    source = b"y = ~~~~~~~~~~x\n" * 600  # 9.6 kB, within 0.01 MiB
    target = tmp_path / "unary.py"
    target.write_bytes(source)
    code, _, err = run([target, "--max-file-size", "0.01", "--no-cache", "--jobs", "1"], capsys)
    assert target.read_bytes() == source
    assert f"skipped {target} (rewritten it would be " in err and "could not be restored" in err
    assert code == 0 and "0 changed, 0 unchanged, 1 skipped, 0 failed" in err
