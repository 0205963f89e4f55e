"""The ``msprobe-rewrite`` command line: flags, exit codes, file handling, the cache.

Two kinds of test. Those that use the ``fake`` fixture check the CLI's own mechanics (walking, atomic
writes, exit codes, cache bookkeeping) with a trivial reversible stand-in for the compiler, so a compiler
bug cannot hide a CLI bug or the reverse. Those named ``test_real_*`` (and the entry-point tests) run
the real compiler end to end: every claim about instrumented output, restoring bytes, and the installed
entry points is made there.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys

import pytest

import msprobe_rewrite.api as api
from msprobe_rewrite import atomic, cli
from msprobe_rewrite import cache as cache_module
from msprobe_rewrite.progress import Progress

TORCH_SOURCE = b"import torch\n\n\ndef f(x):\n    return torch.relu(x)\n"
PLAIN_SOURCE = b"def g(a):\n    return len(a)\n"


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    # Never touch the user's real cache, and never share entries between tests.
    path = tmp_path / "cache"
    monkeypatch.setenv("MSPROBE_REWRITE_CACHE_DIR", str(path))
    return path


class FakeCompiler:
    """Reversible stand-in: prefixes files that mention torch with the runtime import.

    A file containing ``SYNTAX ERROR`` raises RewriteError, as an unparsable file does.
    """

    PREFIX = api.RUNTIME_IMPORT.encode() + b"  # fake\n"

    def __init__(self):
        self.rewrites = []
        self.restores = []
        self.catalogues = []

    def rewrite_source(self, source, catalogue=None, path="<string>"):
        self.rewrites.append(path)
        self.catalogues.append(catalogue)
        if b"SYNTAX ERROR" in source:
            raise api.RewriteError("invalid syntax (line 1)")
        if source.startswith(self.PREFIX) or b"torch" not in source or b"msprobe: skip-file" in source:
            return source
        return self.PREFIX + source

    def restore_source(self, source, path="<string>"):
        self.restores.append(path)
        return source[len(self.PREFIX) :] if source.startswith(self.PREFIX) else source


@pytest.fixture
def fake(monkeypatch):
    compiler = FakeCompiler()
    monkeypatch.setattr(api, "rewrite_source", compiler.rewrite_source)
    monkeypatch.setattr(api, "restore_source", compiler.restore_source)
    return compiler


def make_tree(root, files):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def snapshot(root):
    """Every file under root, with its bytes, relative path as key."""
    return {
        str(p.relative_to(root)).replace(os.sep, "/"): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture
def tree(tmp_path):
    return make_tree(
        tmp_path / "src",
        {
            "a.py": TORCH_SOURCE,
            "plain.py": PLAIN_SOURCE,
            "pkg/__init__.py": b"",
            "pkg/b.py": b"import torch\ny = torch.ones(2)\n",
            "pkg/data.txt": b"not python\n",
        },
    )


def run(args, capsys=None):
    code = cli.main([str(a) for a in args])
    if capsys is None:
        return code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- rewriting in place --------------------------------------------------------------------------


def test_in_place_rewrites_changed_files_and_exits_0(fake, tree, capsys):
    code, out, err = run([tree, "--jobs", "1"], capsys)
    assert code == 0
    assert (tree / "a.py").read_bytes() == FakeCompiler.PREFIX + TORCH_SOURCE
    assert (tree / "pkg/b.py").read_bytes().startswith(FakeCompiler.PREFIX)
    assert (tree / "plain.py").read_bytes() == PLAIN_SOURCE
    assert (tree / "pkg/data.txt").read_bytes() == b"not python\n"
    assert "2 changed, 2 unchanged, 0 skipped, 0 failed" in err
    # A second run finds nothing left to do.
    code, out, err = run([tree, "--jobs", "1"], capsys)
    assert code == 0
    assert "0 changed, 4 unchanged" in err


def test_single_file_path(fake, tree, capsys):
    code, _, err = run([tree / "a.py"], capsys)
    assert code == 0
    assert (tree / "a.py").read_bytes().startswith(FakeCompiler.PREFIX)
    assert (tree / "pkg/b.py").read_bytes() == b"import torch\ny = torch.ones(2)\n"
    assert "1 changed, 0 unchanged" in err


def test_in_place_keeps_file_mode_and_leaves_no_temp_files(fake, tree):
    (tree / "a.py").chmod(0o751)
    assert run([tree, "--jobs", "2"]) == 0
    assert stat.S_IMODE((tree / "a.py").stat().st_mode) == 0o751
    leftovers = [p for p in tree.parent.rglob("*") if atomic.TEMP_SUFFIX in p.name]
    assert leftovers == []


def test_named_symlink_rewrites_its_target_and_keeps_the_link(fake, tmp_path):
    target = make_tree(tmp_path / "real", {"m.py": TORCH_SOURCE}) / "m.py"
    link = tmp_path / "link.py"
    link.symlink_to(target)
    assert run([link]) == 0
    assert link.is_symlink()
    assert target.read_bytes().startswith(FakeCompiler.PREFIX)


def test_symlinks_inside_a_tree_are_not_followed(fake, tmp_path):
    outside = make_tree(tmp_path / "outside", {"torch_like.py": TORCH_SOURCE})
    tree = make_tree(tmp_path / "src", {"a.py": PLAIN_SOURCE})
    (tree / "linked.py").symlink_to(outside / "torch_like.py")
    (tree / "linked_dir").symlink_to(outside, target_is_directory=True)
    assert run([tree]) == 0
    assert (outside / "torch_like.py").read_bytes() == TORCH_SOURCE


def test_tool_and_environment_folders_are_not_walked(fake, tree):
    make_tree(
        tree,
        {
            ".git/hooks/x.py": TORCH_SOURCE,
            "__pycache__/y.py": TORCH_SOURCE,
            "myenv/pyvenv.cfg": b"home = /usr\n",
            "myenv/lib/site.py": TORCH_SOURCE,
            ".tox/t.py": TORCH_SOURCE,
        },
    )
    before = snapshot(tree)
    run([tree, "--jobs", "1"])  # in-process, so the fake's call log sees every file
    after = snapshot(tree)
    for rel in (".git/hooks/x.py", "__pycache__/y.py", "myenv/lib/site.py", ".tox/t.py"):
        assert after[rel] == before[rel], rel
    assert set(fake.rewrites) == {str(tree / rel) for rel in ("a.py", "plain.py", "pkg/__init__.py", "pkg/b.py")}


def test_exclude_globs_by_name_and_by_relative_path(fake, tree, capsys):
    make_tree(tree, {"tests/test_x.py": TORCH_SOURCE, "gen/model_pb2.py": TORCH_SOURCE})
    code, _, err = run([tree, "--exclude", "tests", "--exclude", "*_pb2.py", "--exclude", "pkg/b.py", "-v"], capsys)
    assert code == 0
    assert (tree / "tests/test_x.py").read_bytes() == TORCH_SOURCE
    assert (tree / "gen/model_pb2.py").read_bytes() == TORCH_SOURCE
    assert (tree / "pkg/b.py").read_bytes() == b"import torch\ny = torch.ones(2)\n"
    assert (tree / "a.py").read_bytes().startswith(FakeCompiler.PREFIX)
    assert "1 changed, 2 unchanged, 3 skipped, 0 failed" in err
    assert f"skipped {tree / 'tests' / 'test_x.py'} (excluded)" in err


def test_opt_out_marker_counts_as_skipped(fake, tree, capsys):
    (tree / "opt.py").write_bytes(b"# msprobe: skip-file\nimport torch\n")
    code, _, err = run([tree], capsys)
    assert (tree / "opt.py").read_bytes() == b"# msprobe: skip-file\nimport torch\n"
    assert "2 changed, 2 unchanged, 1 skipped, 0 failed" in err


def test_a_docstring_that_mentions_the_marker_is_not_reported_as_skipped(tmp_path, capsys):
    """The summary reads the marker as the compiler does (a comment line), not as any substring."""
    (tmp_path / "doc.py").write_bytes(b'"""Files may opt out with msprobe: skip-file."""\nx = 1\n')
    (tmp_path / "opt.py").write_bytes(b"# msprobe: skip-file\nimport torch\ny = torch.relu(x)\n")
    code, _, err = run([tmp_path], capsys)
    assert "0 changed, 1 unchanged, 1 skipped, 0 failed" in err


# --- errors --------------------------------------------------------------------------------------


def test_unparsable_file_is_reported_left_as_is_and_others_processed(fake, tree, capsys):
    bad = b"def broken(:\r\n  SYNTAX ERROR\xff"
    (tree / "bad.py").write_bytes(bad)
    code, _, err = run([tree, "--jobs", "2"], capsys)
    assert code == 2
    assert f"{tree / 'bad.py'}: invalid syntax (line 1)" in err
    assert (tree / "bad.py").read_bytes() == bad
    assert (tree / "a.py").read_bytes().startswith(FakeCompiler.PREFIX)
    assert "2 changed, 2 unchanged, 0 skipped, 1 failed" in err


def test_compiler_crash_costs_one_file_and_is_not_cached(fake, tree, capsys, monkeypatch, cache_dir):
    original = fake.rewrite_source

    def crashing(source, catalogue=None, path="<string>"):
        if path.endswith("a.py"):
            raise RecursionError("too deep")
        return original(source, catalogue, path)

    monkeypatch.setattr(api, "rewrite_source", crashing)
    code, _, err = run([tree, "--jobs", "1"], capsys)
    assert code == 2
    assert "a.py: internal error: RecursionError: too deep" in err
    assert (tree / "a.py").read_bytes() == TORCH_SOURCE
    monkeypatch.setattr(api, "rewrite_source", original)
    assert run([tree, "--jobs", "1"]) == 0  # the crash was not remembered as this file's result
    assert (tree / "a.py").read_bytes().startswith(FakeCompiler.PREFIX)


def test_output_that_does_not_compile_is_refused(fake, tree, capsys, monkeypatch):
    def broken(source, catalogue=None, path="<string>"):
        return source.replace(b"torch.relu(x)", b"f(x for x in y, 1)")

    monkeypatch.setattr(api, "rewrite_source", broken)
    code, _, err = run([tree, "--jobs", "1"], capsys)
    assert code == 2
    assert "a.py: internal error: the rewritten file does not compile (line 5)" in err
    assert (tree / "a.py").read_bytes() == TORCH_SOURCE
    # --no-verify trusts the compiler, and what it caches is never served to a verifying run.
    assert run([tree, "--jobs", "1", "--no-verify"]) == 0
    assert b"f(x for x in y, 1)" in (tree / "a.py").read_bytes()
    (tree / "a.py").write_bytes(TORCH_SOURCE)
    assert run([tree, "--jobs", "1"], capsys)[0] == 2


def test_source_that_never_compiled_is_not_blamed_on_the_compiler(fake, tmp_path):
    # libcst parses some things this Python's compiler rejects (here: `return` outside a function).
    tree = make_tree(tmp_path / "src", {"odd.py": b"import torch\nreturn torch.relu(1)\n"})
    assert run([tree, "--jobs", "1"]) == 0


def test_reason_does_not_repeat_the_path(fake, tree, capsys, monkeypatch):
    def failing(source, catalogue=None, path="<string>"):
        raise api.RewriteError(f"{path}: cannot parse: Syntax Error @ 1:1.")

    monkeypatch.setattr(api, "rewrite_source", failing)
    _, _, err = run([tree / "a.py"], capsys)
    assert f"error: {tree / 'a.py'}: cannot parse: Syntax Error @ 1:1.\n" in err


def test_nonexistent_path_is_exit_2_and_touches_nothing(fake, tree, capsys):
    before = snapshot(tree)
    code, _, err = run([tree, tree / "missing.py"], capsys)
    assert code == 2
    assert "missing.py: no such file or folder" in err
    assert snapshot(tree) == before


def test_bad_catalogue_is_exit_2_with_a_message(fake, tree, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("nonsense_section:\n  - relu\n")
    code, _, err = run([tree, "--catalogue", bad], capsys)
    assert code == 2
    assert "bad catalogue" in err and "nonsense_section" in err
    code, _, err = run([tree, "--catalogue", tmp_path / "absent.yaml"], capsys)
    assert code == 2
    assert "absent.yaml" in err
    assert fake.rewrites == []


def test_bad_catalogue_touches_nothing_even_with_cache_hits(fake, tree, tmp_path, capsys):
    run([tree / "a.py"])  # a.py is now instrumented and its result cached
    before = snapshot(tree)
    bad = tmp_path / "bad.yaml"
    bad.write_text("functional: not-a-list\n")
    code, _, err = run([tree, "--catalogue", bad], capsys)
    assert code == 2 and "bad catalogue" in err
    assert snapshot(tree) == before


def test_warm_run_does_not_parse_the_catalogue(fake, tree, monkeypatch):
    import msprobe_runtime.catalogue as catalogue_module

    loads = []
    real_load = catalogue_module.load_catalogue
    monkeypatch.setattr(catalogue_module, "load_catalogue", lambda *a, **k: loads.append(1) or real_load(*a, **k))
    run([tree, "--jobs", "1"])
    assert loads == [1]
    run([tree, "--jobs", "1"])
    assert loads == [1]


def test_catalogue_entries_reach_the_compiler(fake, tree, tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("custom:\n  mypkg.ops.fused_thing: Custom.fused_thing\n")
    run([tree, "--catalogue", extra, "--jobs", "1", "--check"])
    assert fake.catalogues and all(
        c.dump_name("mypkg.ops.fused_thing") == "Custom.fused_thing" for c in fake.catalogues
    )


def test_usage_errors_are_exit_2(fake, tree, tmp_path, capsys):
    assert run([], capsys)[0] == 2
    assert run([tree, "--jobs", "0"], capsys)[0] == 2
    assert run([tree, "--out", tmp_path / "o", "--check"], capsys)[0] == 2
    assert run([tree, tree, "--out", tmp_path / "o"], capsys)[0] == 2
    code, _, err = run([tree, "--out", tree / "inside"], capsys)
    assert code == 2 and "inside" in err
    assert not (tree / "inside").exists()


# --- --check, --diff -----------------------------------------------------------------------------


def test_check_lists_files_and_writes_nothing(fake, tree, capsys):
    before = snapshot(tree)
    code, out, err = run([tree, "--check"], capsys)
    assert code == 1
    assert out.splitlines() == [str(tree / "a.py"), str(tree / "pkg" / "b.py")]
    assert "2 would change, 2 unchanged" in err
    assert snapshot(tree) == before


@pytest.mark.skipif(sys.platform != "linux", reason="arbitrary bytes in file names")
def test_check_lists_undecodable_file_names(fake, tmp_path, capfdbinary):
    tree = tmp_path / "src"
    tree.mkdir()
    name = os.fsdecode(b"caf\xe9.py")
    (tree / name).write_bytes(TORCH_SOURCE)
    assert cli.main([str(tree), "--check", "--jobs", "1"]) == 1
    assert capfdbinary.readouterr().out == os.fsencode(str(tree)) + b"/caf\xe9.py\n"


def test_check_on_clean_tree_is_exit_0(fake, tree, capsys):
    run([tree])
    code, out, _ = run([tree, "--check"], capsys)
    assert (code, out) == (0, "")


def test_diff_prints_unified_diff_and_writes_nothing(fake, tree, capfdbinary):
    before = snapshot(tree)
    (tree / "pkg/b.py").write_bytes(b"import torch")  # no final newline
    before = snapshot(tree)
    code = cli.main([str(tree), "--diff"])
    out = capfdbinary.readouterr().out
    assert code == 1
    assert snapshot(tree) == before
    name = str(tree / "a.py").replace(os.sep, "/").encode()
    assert b"--- a/" + name + b"\n+++ b/" + name + b"\n" in out
    assert b"\n+" + FakeCompiler.PREFIX in out
    assert b"\\ No newline at end of file\n" in out
    run([tree])
    code = cli.main([str(tree), "--diff"])
    assert (code, capfdbinary.readouterr().out) == (0, b"")


# --- --out ---------------------------------------------------------------------------------------


def test_out_writes_instrumented_copy_with_other_files(fake, tree, tmp_path, capsys):
    (tree / "run.sh").write_bytes(b"#!/bin/sh\n")
    (tree / "run.sh").chmod(0o755)
    (tree / "blob.bin").write_bytes(bytes(range(256)))
    make_tree(tree, {".git/config": b"x", "__pycache__/a.cpython-311.pyc": b"x", "tests/test_t.py": TORCH_SOURCE})
    before = snapshot(tree)
    out_dir = tmp_path / "out"
    code, _, err = run([tree, "--out", out_dir, "--exclude", "tests"], capsys)
    assert code == 0
    assert snapshot(tree) == before
    copied = snapshot(out_dir)
    assert copied["a.py"] == FakeCompiler.PREFIX + TORCH_SOURCE
    assert copied["plain.py"] == PLAIN_SOURCE
    assert copied["pkg/data.txt"] == b"not python\n"
    assert copied["blob.bin"] == bytes(range(256))
    assert copied["tests/test_t.py"] == TORCH_SOURCE  # excluded: copied, not instrumented
    assert stat.S_IMODE((out_dir / "run.sh").stat().st_mode) == 0o755
    assert ".git/config" not in copied and "__pycache__/a.cpython-311.pyc" not in copied
    # Running again into the same folder reproduces it.
    assert run([tree, "--out", out_dir, "--exclude", "tests"]) == 0
    assert snapshot(out_dir) == copied


def test_out_copies_unparsable_files_verbatim(fake, tree, tmp_path):
    (tree / "bad.py").write_bytes(b"SYNTAX ERROR\n")
    assert run([tree, "--out", tmp_path / "out"]) == 2
    assert (tmp_path / "out" / "bad.py").read_bytes() == b"SYNTAX ERROR\n"
    assert (tmp_path / "out" / "a.py").read_bytes().startswith(FakeCompiler.PREFIX)


def test_out_with_a_single_file(fake, tree, tmp_path):
    assert run([tree / "a.py", "--out", tmp_path / "o"]) == 0
    assert (tmp_path / "o" / "a.py").read_bytes().startswith(FakeCompiler.PREFIX)


# --- --restore -----------------------------------------------------------------------------------


def test_restore_mechanics(fake, tree, capsys):
    before = snapshot(tree)
    run([tree])
    code, _, err = run([tree, "--restore", "--check"], capsys)
    assert code == 1 and "2 would be restored" in err
    code, _, err = run([tree, "--restore"], capsys)
    assert code == 0
    assert snapshot(tree) == before
    assert run([tree, "--restore"]) == 0


def test_restore_summary_says_restored(fake, tree, capsys):
    """--restore's summary used to read "2 changed", as a rewrite's does: it says what it did."""
    run([tree], capsys)
    code, _, err = run([tree, "--restore"], capsys)
    assert code == 0
    assert "msprobe-rewrite: 2 restored, 2 unchanged, 0 skipped, 0 failed" in err
    assert "changed" not in err.replace("unchanged", "")


# --- --jobs --------------------------------------------------------------------------------------


def test_jobs_1_and_2_give_the_same_results(fake, tmp_path, capsys):
    files = {f"m{i:02d}.py": (TORCH_SOURCE if i % 3 else PLAIN_SOURCE) + b"# %d\n" % i for i in range(30)}
    files["zz_bad.py"] = b"SYNTAX ERROR"
    reports = []
    for jobs in ("1", "2"):
        tree = make_tree(tmp_path / f"t{jobs}", files)
        code, out, err = run([tree, "--jobs", jobs, "--no-cache", "--check"], capsys)
        reports.append((code, out.replace(str(tree), "T"), err.replace(str(tree), "T")))
        run([tree, "--jobs", jobs, "--no-cache"], capsys)
        reports.append(snapshot(tree))
    assert reports[0] == reports[2]
    assert reports[1] == reports[3]


# --- the cache -----------------------------------------------------------------------------------


def test_second_run_is_served_from_the_cache(fake, tree, cache_dir):
    assert run([tree, "--jobs", "1"]) == 0
    assert len(fake.rewrites) == 4
    # In place, the tree now holds instrumented files: still no compiler call.
    assert run([tree, "--jobs", "1"]) == 0
    assert len(fake.rewrites) == 4
    # A copy of the original tree hits too.
    assert run([tree, "--restore", "--jobs", "1"]) == 0
    assert run([tree, "--check", "--jobs", "1"]) == 1
    assert len(fake.rewrites) == 4
    assert cache_dir.is_dir()


def test_no_cache_neither_reads_nor_writes(fake, tree, tmp_path, cache_dir):
    run([tree, "--no-cache", "--check", "--jobs", "1"])
    run([tree, "--no-cache", "--check", "--jobs", "1"])
    assert len(fake.rewrites) == 8
    assert not cache_dir.exists()


def test_corrupt_cache_entries_are_ignored(fake, tree, cache_dir):
    run([tree, "--check", "--jobs", "1"])
    entries = [p for p in cache_dir.rglob("*") if p.is_file() and p.name != cache_module.TAG_NAME]
    assert entries
    for i, entry in enumerate(entries):
        data = entry.read_bytes()
        entry.write_bytes(data[: len(data) // 2] if i % 2 else b"garbage")
    calls = len(fake.rewrites)
    assert run([tree, "--jobs", "1"]) == 0
    assert len(fake.rewrites) == calls + 4
    assert (tree / "a.py").read_bytes() == FakeCompiler.PREFIX + TORCH_SOURCE


def test_cache_key_includes_the_catalogue(fake, tree, tmp_path):
    run([tree, "--check", "--jobs", "1"])
    calls = len(fake.rewrites)
    extra = tmp_path / "extra.yaml"
    extra.write_text("custom:\n  mypkg.f: Custom.f\n")
    run([tree, "--check", "--catalogue", extra, "--jobs", "1"])
    assert len(fake.rewrites) == calls + 4


def test_old_cache_generations_are_pruned_and_foreign_folders_kept(fake, tree, tmp_path, cache_dir):
    foreign = cache_dir / "0123456789abcdef"  # looks like a generation, but carries no tag of ours
    foreign.mkdir(parents=True)
    (foreign / "keep.txt").write_bytes(b"x")
    catalogues = []
    for i in range(cache_module.KEEP_GENERATIONS + 3):
        extra = tmp_path / f"extra{i}.yaml"
        extra.write_text(f"custom:\n  mypkg.f{i}: Custom.f{i}\n")
        catalogues.append(extra)
        run([tree, "--check", "--jobs", "1", "--catalogue", extra])
    generations = [p for p in cache_dir.iterdir() if (p / cache_module.TAG_NAME).exists()]
    assert len(generations) == cache_module.KEEP_GENERATIONS
    assert (foreign / "keep.txt").read_bytes() == b"x"
    # The most recent generation survived: its run is all hits.
    calls = len(fake.rewrites)
    run([tree, "--check", "--jobs", "1", "--catalogue", catalogues[-1]])
    assert len(fake.rewrites) == calls


def test_unwritable_cache_does_not_fail_the_run(fake, tree, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file-not-dir"
    blocker.write_bytes(b"")
    monkeypatch.setenv("MSPROBE_REWRITE_CACHE_DIR", str(blocker / "cache"))
    code, _, err = run([tree], capsys)
    assert code == 0
    assert "warning: cache" in err


# --- atomic writes -------------------------------------------------------------------------------


def test_write_atomic_failure_leaves_original_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "f.py"
    target.write_bytes(b"original")

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", failing_replace)
    with pytest.raises(OSError):
        atomic.write_atomic(str(target), b"new")
    assert target.read_bytes() == b"original"
    assert os.listdir(tmp_path) == ["f.py"]


def test_write_atomic_refuses_a_file_modified_meanwhile(tmp_path):
    target = tmp_path / "f.py"
    target.write_bytes(b"original")
    seen = os.stat(target)
    target.write_bytes(b"someone else's edit")
    with pytest.raises(atomic.ModifiedMeanwhile):
        atomic.write_atomic(str(target), b"new", unchanged_since=seen)
    assert target.read_bytes() == b"someone else's edit"
    assert os.listdir(tmp_path) == ["f.py"]


def test_write_atomic_new_file_gets_umask_default_mode(tmp_path):
    target = tmp_path / "new.py"
    atomic.write_atomic(str(target), b"x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


# --- progress and subcommands ----------------------------------------------------------------------


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_line_on_a_terminal_only(fake, tree, monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    run([tree])
    text = terminal.getvalue()
    assert "\r[" in text and "/4]" in text
    # Cleared before the summary is printed.
    assert "\r\x1b[Kmsprobe-rewrite: 2 changed" in text

    not_a_terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", not_a_terminal)
    run([tree])
    assert "\r" not in not_a_terminal.getvalue()


def test_progress_truncates_long_labels():
    stream = FakeTerminal()
    progress = Progress(2, stream=stream)
    progress.update(2, "x" * 1000)
    progress.clear()
    first = stream.getvalue().split("\x1b[K")[0]
    assert len(first) <= shutil.get_terminal_size((80, 24)).columns


def test_subcommands_dispatch_on_first_argument(fake, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setitem(cli.SUBCOMMANDS, "run", lambda rest: calls.append(list(rest)) or 0)
    assert cli.main(["run", "--packages", "x", "--", "s.py"]) == 0
    assert calls == [["--packages", "x", "--", "s.py"]]
    # A folder named like a subcommand stays reachable.
    folder = make_tree(tmp_path / "run", {"a.py": TORCH_SOURCE})
    monkeypatch.chdir(tmp_path)
    assert cli.main(["./run"]) == 0
    assert cli.main(["rewrite", "run", "--check"]) == 0
    assert (folder / "a.py").read_bytes().startswith(FakeCompiler.PREFIX)


@pytest.mark.slow  # spawns the CLI
def test_bare_command_lists_every_command(tmp_path):
    """Bare `msprobe-rewrite` used to print only "the following arguments are required: PATH", hiding run,
    compare, precheck and the rest. It lists every command with what it does, and exits 2 (nothing was done)."""
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 2
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ") and line[2] != " "}
    assert listed == set(cli.SUBCOMMANDS), done.stdout
    assert "msprobe-rewrite --help" in done.stdout and "required" not in done.stdout + done.stderr
    assert set(cli.COMMAND_SUMMARIES) == set(cli.SUBCOMMANDS)  # a new command says what it does


def _listed_commands():
    """The commands bare `msprobe-rewrite` lists (its overview, read as test_bare_command_lists_every_command
    reads it)."""
    return [line.split()[0] for line in cli._bare_overview().splitlines() if line.startswith("  ") and line[2] != " "]


@pytest.mark.parametrize("name", _listed_commands())
def test_every_command_answers_help(name, capsys):
    """The overview says `msprobe-rewrite COMMAND --help` for each; `hook-path --help` used to print the hook's
    folder instead. Each prints its usage and exits 0, as argparse does."""
    assert cli.main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: msprobe-rewrite"), out
    assert name == "rewrite" or out.startswith(f"usage: msprobe-rewrite {name}"), out


def test_hook_path_prints_its_folder_and_refuses_arguments(capsys):
    from msprobe_rewrite import startup

    assert cli.main(["hook-path"]) == 0
    assert capsys.readouterr().out == os.path.dirname(os.path.abspath(startup.__file__)) + "\n"
    assert cli.main(["hook-path", "extra"]) == 2


def test_version_flag(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip().endswith(cli.__version__)


# --- the real compiler, end to end -----------------------------------------------------------------

ROUND_TRIP_SOURCES = {
    "crlf.py": b"import torch\r\n\r\ndef f(x):\r\n    return torch.relu(x) + x\r\n",
    "bom.py": b"\xef\xbb\xbfimport torch\ny = torch.ones(2) * 2\n",
    "no_final_newline.py": b"import torch\ny = torch.relu(torch.ones(2))",
    "cookie.py": b"# -*- coding: latin-1 -*-\nimport torch\ns = '\xe9'\ny = torch.ones(1) - 1\n",
    "tabs_trailing.py": b"import torch\nif True:\n\ty = torch.zeros(3)   \n\tz = y @ y \t\n",
    "docstring_future.py": (
        b'"""Doc."""\nfrom __future__ import annotations\nimport torch\nx = torch.tanh(torch.ones(1))\n'
    ),
}


def test_real_rewrite_then_restore_round_trips_bytes(tmp_path, capsys):
    tree = make_tree(tmp_path / "src", ROUND_TRIP_SOURCES)
    before = snapshot(tree)
    code, out, err = run([tree, "--check"], capsys)
    assert code == 1, err
    assert len(out.splitlines()) == len(ROUND_TRIP_SOURCES)
    assert run([tree], capsys)[0] == 0
    after = snapshot(tree)
    for rel, data in after.items():
        assert api.is_instrumented(data), rel
        assert data.count(b"\n") == before[rel].count(b"\n"), rel  # no line moved
        compile(data, rel, "exec")
    assert run([tree, "--check"], capsys)[0] == 0  # idempotent
    assert run([tree, "--restore"], capsys)[0] == 0
    assert snapshot(tree) == before
    assert run([tree, "--restore", "--check"], capsys)[0] == 0


def test_real_unparsable_and_undecodable_files(tmp_path, capsys):
    tree = make_tree(
        tmp_path / "src",
        {
            "good.py": TORCH_SOURCE,
            "syntax.py": b"import torch\ndef f(:\n    pass\n",
            "undecodable.py": b"import torch\nx = '\xff\xfe'\n",
        },
    )
    code, _, err = run([tree, "--jobs", "2"], capsys)
    assert code == 2
    assert f"{tree / 'syntax.py'}: " in err
    assert f"{tree / 'undecodable.py'}: " in err
    assert (tree / "syntax.py").read_bytes() == b"import torch\ndef f(:\n    pass\n"
    assert (tree / "undecodable.py").read_bytes() == b"import torch\nx = '\xff\xfe'\n"
    assert api.is_instrumented((tree / "good.py").read_bytes())
    assert "1 changed, 0 unchanged, 0 skipped, 2 failed" in err


def test_real_cache_hit_means_no_compiler_call(tmp_path, monkeypatch):
    tree = make_tree(tmp_path / "src", ROUND_TRIP_SOURCES)
    calls = []
    real_rewrite = api.rewrite_source

    def counting(source, catalogue=None, path="<string>"):
        calls.append(path)
        return real_rewrite(source, catalogue, path=path)

    monkeypatch.setattr(api, "rewrite_source", counting)
    assert run([tree, "--jobs", "1"]) == 0
    assert len(calls) == len(ROUND_TRIP_SOURCES)
    assert run([tree, "--jobs", "1"]) == 0
    assert len(calls) == len(ROUND_TRIP_SOURCES)


def test_the_result_cache_is_keyed_by_the_files_package(tmp_path, capsys):
    """A byte-identical file in megatron's package and in another rewrites differently (its relative import
    resolves to megatron's catalogued fused op only in the first); the second ``--diff`` used to show the
    first file's rewrite, served from the cache."""
    files = {
        "megatron/__init__.py": b"",
        "megatron/core/__init__.py": b"",
        "megatron/core/fusions/__init__.py": b"",
        "other/__init__.py": b"",
    }
    for package in ("megatron/core/fusions", "other"):
        files[f"{package}/fused_bias_gelu.py"] = b"def bias_gelu_impl(x, b):\n    return x + b\n"
        files[f"{package}/user.py"] = (
            b"from .fused_bias_gelu import bias_gelu_impl\n\n\ndef f(x, b):\n    return bias_gelu_impl(x, b)\n"
        )
    tree = make_tree(tmp_path / "src", files)
    diffs = {}
    for package in ("megatron/core/fusions", "other", "megatron/core/fusions"):  # cold, cold, warm
        run([os.path.join(tree, package, "user.py"), "--diff"], capsys)
        _, out, _ = run([os.path.join(tree, package, "user.py"), "--diff"], capsys)  # served from the cache
        diffs.setdefault(package, []).append(out)
    assert all('__msprobe__.call("Megatron.bias_gelu_impl"' in out for out in diffs["megatron/core/fusions"])
    assert "__msprobe__.dyn(bias_gelu_impl, x, b)" in diffs["other"][0]
    assert "Megatron." not in diffs["other"][0]


def test_real_jobs_1_and_2_agree(tmp_path, capsys):
    files = dict(ROUND_TRIP_SOURCES)
    files.update({f"extra{i}.py": TORCH_SOURCE + b"z%d = torch.relu\n" % i for i in range(12)})
    trees = []
    for jobs in ("1", "2"):
        tree = make_tree(tmp_path / f"t{jobs}", files)
        run([tree, "--jobs", jobs, "--no-cache"], capsys)
        trees.append(snapshot(tree))
    assert trees[0] == trees[1]


def test_real_out_copy(tmp_path, capsys):
    tree = make_tree(tmp_path / "src", {"a.py": TORCH_SOURCE, "conf/x.yaml": b"k: v\n"})
    assert run([tree, "--out", tmp_path / "out"], capsys)[0] == 0
    assert api.is_instrumented((tmp_path / "out" / "a.py").read_bytes())
    assert (tmp_path / "out" / "conf" / "x.yaml").read_bytes() == b"k: v\n"
    assert (tree / "a.py").read_bytes() == TORCH_SOURCE


def _entry_point_commands():
    script = shutil.which("msprobe-rewrite")
    commands = [pytest.param([sys.executable, "-m", "msprobe_rewrite"], id="python -m")]
    commands.append(
        pytest.param(
            [script] if script else None,
            id="console script",
            marks=pytest.mark.skipif(script is None, reason="console script not on PATH"),
        )
    )
    return commands


@pytest.mark.slow  # spawns the CLI
@pytest.mark.parametrize("command", _entry_point_commands())
def test_entry_point_version(command, tmp_path):
    result = subprocess.run(command + ["--version"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0
    assert "msprobe-rewrite" in result.stdout


@pytest.mark.slow  # spawns the CLI
@pytest.mark.parametrize("command", _entry_point_commands())
def test_entry_point_end_to_end(command, tmp_path, cache_dir):
    tree = make_tree(tmp_path / "src", {"a.py": TORCH_SOURCE, "b.py": PLAIN_SOURCE})
    env = dict(os.environ, MSPROBE_REWRITE_CACHE_DIR=str(cache_dir))

    def invoke(*args):
        return subprocess.run(command + [str(a) for a in args], capture_output=True, text=True, cwd=tmp_path, env=env)

    result = invoke(tree, "--check")
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [str(tree / "a.py")]
    result = invoke(tree)
    assert result.returncode == 0, result.stderr
    assert "1 changed, 1 unchanged, 0 skipped, 0 failed" in result.stderr
    assert "\r" not in result.stderr  # not a terminal: no progress line
    assert invoke(tree, "--check").returncode == 0
    assert invoke(tree, "--restore").returncode == 0
    assert (tree / "a.py").read_bytes() == TORCH_SOURCE
    result = invoke(tmp_path / "nope")
    assert result.returncode == 2 and "no such file" in result.stderr


@pytest.mark.slow  # spawns the CLI and the instrumented script
def test_exit_status_as_black_uses_it(tmp_path, cache_dir):
    """A rewrite, --out and --restore that did their work exit 0, as black does when it reformats: before, they
    exited 1 whenever a file changed, so `msprobe-rewrite --out DIR . && python DIR/train.py` never trained.
    Exit 1 is only for --check and --diff, where the user asked to be told."""
    import shlex

    tree = make_tree(tmp_path / "src", {"train.py": b"import torch\nprint(torch.relu(-torch.ones(1)).item())\n"})
    cli_command = " ".join(shlex.quote(part) for part in (sys.executable, "-m", "msprobe_rewrite"))
    env = dict(os.environ, MSPROBE_REWRITE_CACHE_DIR=str(cache_dir))
    out = tmp_path / "copy"
    chained = subprocess.run(
        [
            "sh",
            "-c",
            f"{cli_command} --out {shlex.quote(str(out))} {shlex.quote(str(tree))} "
            f"&& {shlex.quote(sys.executable)} {shlex.quote(str(out / 'train.py'))}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert chained.returncode == 0, chained.stderr
    assert chained.stdout.strip() == "0.0" and "__msprobe__" in (out / "train.py").read_text()

    def status(*args):
        done = subprocess.run(
            [sys.executable, "-m", "msprobe_rewrite", *args, str(tree)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        return done.returncode, done.stdout

    assert status("--check") == (1, f"{tree / 'train.py'}\n")  # asked to be told: would change
    assert status("--diff")[0] == 1
    assert status() == (0, "")  # rewrote a file: done
    assert status("--check") == (0, "") and status("--diff") == (0, "")
    assert status("--restore", "--check")[0] == 1
    assert status("--restore") == (0, "")  # restored a file: done
    assert status("--restore") == (0, "")  # nothing left to restore


def test_help_says_which_exit_status_means_what(capsys):
    assert cli.main(["--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "0 done, whether or not a file changed" in help_text
    assert "1 only with --check or --diff" in help_text


def test_the_cache_fingerprint_covers_the_runtime_contract_the_rewrite_reads(tmp_path):
    """The operator table and the catalogue loader live in the runtime package but decide what the compiler
    writes; editing either in an editable install must miss every cached rewrite."""
    from msprobe_runtime import catalogue, operators

    files = cache_module.fingerprint_files()
    assert os.path.abspath(operators.__file__) in files and os.path.abspath(catalogue.__file__) in files
    copies = []
    for path in files:
        copy = tmp_path / f"{len(copies)}_{os.path.basename(path)}"
        shutil.copyfile(path, copy)
        copies.append(str(copy))
    before = cache_module.compiler_fingerprint(copies)
    operators_copy = copies[files.index(os.path.abspath(operators.__file__))]
    with open(operators_copy, "a") as handle:
        handle.write("\n# an edited operator table\n")
    assert cache_module.compiler_fingerprint(copies) != before
