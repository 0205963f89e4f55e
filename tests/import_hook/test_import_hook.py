"""The import hook, each case in a fresh interpreter (the hook changes interpreter-global state)."""

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every case spawns interpreters (about 50 s)

TAG_SUFFIX = ".msprobe-rewrite.pyc"

PACKAGE = {
    "mypkg/__init__.py": """\
        import torch
        from torch import relu

        def f(x):
            return relu(x) + 1

        def fails(x):
            raise ValueError("boom")
        """,
    "mypkg/sub/__init__.py": "",
    "mypkg/sub/deep.py": """\
        import torch.nn.functional as F

        def g(x):
            return F.gelu(x)
        """,
    "mypkg/data.txt": "payload",
    "otherpkg/__init__.py": """\
        import torch

        def h(x):
            return torch.relu(x)
        """,
}

PROBE = """\
import inspect, sys

def instrumented(function):
    return "__msprobe__" in function.__code__.co_names
"""


def write_tree(root: Path, files: dict) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def run(code: str, cwd: Path, *, write_bytecode=False, env=None, args=()):
    environment = {**os.environ, **(env or {})}
    environment.pop("PYTHONDONTWRITEBYTECODE", None) if write_bytecode else environment.setdefault(
        "PYTHONDONTWRITEBYTECODE", "1"
    )
    return subprocess.run(
        [sys.executable, *args, "-c", PROBE + textwrap.dedent(code)] if code is not None else [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )


def ok(result) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture
def tree(tmp_path):
    return write_tree(tmp_path, PACKAGE)


def test_packages_match_by_name_prefix_and_nothing_else(tree):
    out = ok(
        run(
            """
        from msprobe_rewrite import install_import_hook
        install_import_hook(["mypkg"])
        import mypkg, mypkg.sub.deep, otherpkg, json
        print(instrumented(mypkg.f), instrumented(mypkg.sub.deep.g), instrumented(otherpkg.h),
              instrumented(json.dumps))
    """,
            tree,
        )
    )
    assert out.split() == ["True", "True", "False", "False"]


def test_results_source_and_tracebacks_are_the_users(tree):
    out = ok(
        run(
            """
        import traceback, torch
        from msprobe_rewrite import install_import_hook
        install_import_hook(["mypkg"])
        import mypkg
        print(mypkg.f(torch.tensor([-1.0, 2.0])).tolist())
        print(inspect.getsource(mypkg.f).splitlines()[1].strip())
        try:
            mypkg.fails(1)
        except ValueError:
            frame = traceback.extract_tb(sys.exc_info()[2])[-1]
            print(frame.lineno, frame.line)
    """,
            tree,
        )
    )
    lines = out.splitlines()
    assert lines[0] == "[1.0, 3.0]"
    assert lines[1] == "return relu(x) + 1"
    assert lines[2] == '8 raise ValueError("boom")'


def test_context_manager_uninstalls(tree):
    out = ok(
        run(
            """
        from msprobe_rewrite import install_import_hook
        with install_import_hook(["mypkg", "otherpkg"]) as hook:
            import mypkg
        import otherpkg
        print(instrumented(mypkg.f), instrumented(otherpkg.h), hook.finder in sys.meta_path)
    """,
            tree,
        )
    )
    assert out.split() == ["True", "False", "False"]


def test_already_imported_package_is_named_in_a_warning(tree):
    result = run(
        """
        import warnings
        warnings.simplefilter("always")
        import mypkg
        from msprobe_rewrite import install_import_hook
        install_import_hook(["mypkg", "torch"])
    """,
        tree,
    )
    ok(result)
    assert "already imported before the import hook, so not instrumented: mypkg" in result.stderr
    assert "never instrumented: torch" in result.stderr


def test_editable_install_finder_namespace_packages_and_zip_imports(tree, tmp_path_factory):
    elsewhere = write_tree(tmp_path_factory.mktemp("editable"), {"edpkg/__init__.py": PACKAGE["otherpkg/__init__.py"]})
    write_tree(tree, {"nspkg/mod.py": PACKAGE["otherpkg/__init__.py"]})  # no __init__.py: a namespace package
    archive = tree / "zipped.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("zpkg/__init__.py", textwrap.dedent(PACKAGE["otherpkg/__init__.py"]))
    out = ok(
        run(
            f"""
        import importlib.abc, importlib.util
        class EditableFinder(importlib.abc.MetaPathFinder):  # what setuptools' editable installs add
            def find_spec(self, name, path=None, target=None):
                if name == "edpkg":
                    return importlib.util.spec_from_file_location(
                        name, {str(elsewhere / "edpkg" / "__init__.py")!r},
                        submodule_search_locations=[{str(elsewhere / "edpkg")!r}])
        sys.meta_path.append(EditableFinder())
        sys.path.insert(0, {str(archive)!r})
        from msprobe_rewrite import install_import_hook
        install_import_hook(["edpkg", "nspkg", "zpkg"])
        import edpkg, nspkg.mod, zpkg
        print(instrumented(edpkg.h), instrumented(nspkg.mod.h), instrumented(zpkg.h), nspkg.__path__ is not None)
    """,
            tree,
        )
    )
    assert out.split() == ["True", "True", "False", "True"]


def test_resources_get_data_and_reload(tree):
    out = ok(
        run(
            """
        import importlib, importlib.resources, pkgutil, pathlib
        from msprobe_rewrite import install_import_hook
        install_import_hook(["mypkg"])
        import mypkg
        print(importlib.resources.files("mypkg").joinpath("data.txt").read_text(),
              pkgutil.get_data("mypkg", "data.txt").decode())
        path = pathlib.Path(mypkg.__file__)
        path.write_text(path.read_text().replace("+ 1", "+ 2"))
        importlib.invalidate_caches()
        importlib.reload(mypkg)
        print(instrumented(mypkg.f), inspect.getsource(mypkg.f).splitlines()[1].strip())
    """,
            tree,
        )
    )
    assert out.splitlines() == ["payload payload", "True return relu(x) + 2"]


def cache_files(tree: Path):
    return sorted(p.name for p in tree.rglob("*" + TAG_SUFFIX))


IMPORT_AND_REPORT = """
    from msprobe_rewrite import install_import_hook
    install_import_hook(["mypkg"])
    import mypkg, mypkg.sub.deep
    print(instrumented(mypkg.f), instrumented(mypkg.sub.deep.g), inspect.getsource(mypkg.f).splitlines()[1].strip())
"""


def test_bytecode_cache_is_written_beside_the_normal_one_and_used(tree):
    first = ok(run(IMPORT_AND_REPORT, tree, write_bytecode=True))
    tag = f"{sys.implementation.cache_tag}{TAG_SUFFIX}"
    assert cache_files(tree) == sorted([f"__init__.{tag}", f"__init__.{tag}", f"deep.{tag}"])
    cached = tree / "mypkg" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}{TAG_SUFFIX}"
    stamp = cached.stat().st_mtime_ns
    second = ok(run(IMPORT_AND_REPORT, tree, write_bytecode=True))
    assert second == first and cached.stat().st_mtime_ns == stamp  # read, not rewritten


def test_dont_write_bytecode_and_read_only_pycache(tree):
    ok(run(IMPORT_AND_REPORT, tree))  # PYTHONDONTWRITEBYTECODE=1
    assert cache_files(tree) == []
    for package in (tree / "mypkg", tree / "mypkg" / "sub"):
        (package / "__pycache__").mkdir()
        (package / "__pycache__").chmod(0o555)
    try:
        out = ok(run(IMPORT_AND_REPORT, tree, write_bytecode=True))
    finally:
        for package in (tree / "mypkg", tree / "mypkg" / "sub"):
            (package / "__pycache__").chmod(0o755)
    assert out.split()[:2] == ["True", "True"]
    if os.geteuid() != 0:  # root writes through the mode bits
        assert cache_files(tree) == []


def test_pycache_prefix_is_honoured(tree, tmp_path_factory):
    prefix = tmp_path_factory.mktemp("prefix")
    ok(run(IMPORT_AND_REPORT, tree, write_bytecode=True, env={"PYTHONPYCACHEPREFIX": str(prefix)}))
    assert cache_files(tree) == []
    assert len(list(prefix.rglob("*" + TAG_SUFFIX))) == 3


def test_corrupt_or_truncated_cache_is_ignored_and_rewritten(tree):
    first = ok(run(IMPORT_AND_REPORT, tree, write_bytecode=True))
    cached = tree / "mypkg" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}{TAG_SUFFIX}"
    good = cached.read_bytes()
    for damaged in (good[: len(good) // 2], b"garbage", good[:-1] + b"\x00", b""):
        cached.write_bytes(damaged)
        assert ok(run(IMPORT_AND_REPORT, tree, write_bytecode=True)) == first
        assert cached.read_bytes() == good


def test_edit_within_the_same_second_is_picked_up(tree):
    source = tree / "mypkg" / "__init__.py"
    ok(run(IMPORT_AND_REPORT, tree, write_bytecode=True))
    stat = source.stat()
    source.write_text(source.read_text().replace("+ 1", "* 3"))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime and size as before
    assert "return relu(x) * 3" in ok(run(IMPORT_AND_REPORT, tree, write_bytecode=True))


def test_two_cold_processes_at_once_both_succeed_and_leave_a_valid_cache(tree):
    code = PROBE + textwrap.dedent(IMPORT_AND_REPORT)
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=tree,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert all(p.returncode == 0 for p in processes), outputs
    assert len({out for out, _ in outputs}) == 1
    assert not list(tree.rglob("*.tmp.*"))
    assert ok(run(IMPORT_AND_REPORT, tree, write_bytecode=True)) == outputs[0][0]


def test_a_module_that_fails_to_rewrite_is_imported_plain_with_one_warning(tree):
    result = run(
        """
        import warnings
        warnings.simplefilter("always")
        import msprobe_rewrite.api as api
        import msprobe_rewrite.ast_transformer as ast_transformer
        real, real_ast = api.rewrite_source, ast_transformer.rewrite_to_ast
        def failing(source, *args, path="", **kwargs):
            if path.endswith("deep.py"):
                raise api.RewriteError(path + ": injected failure")
            return real(source, *args, path=path, **kwargs)
        def deferring(source, *args, path="", **kwargs):  # leave deep.py to the libcst path, which fails
            return None if path.endswith("deep.py") else real_ast(source, *args, path=path, **kwargs)
        api.rewrite_source = failing
        ast_transformer.rewrite_to_ast = deferring
        from msprobe_rewrite import install_import_hook
        install_import_hook(["mypkg"])
        import mypkg.sub.deep
        print(instrumented(mypkg.f), instrumented(mypkg.sub.deep.g))
    """,
        tree,
    )
    assert ok(result).split() == ["True", "False"]
    assert result.stderr.count("mypkg.sub.deep is imported uninstrumented") == 1
    assert "injected failure" in result.stderr


def test_the_hook_rewrites_on_pythons_ast_to_the_program_the_cli_writes(tree):
    out = ok(
        run(
            """
        from msprobe_rewrite import install_import_hook
        install_import_hook(["mypkg"])
        import mypkg.sub.deep
        print("libcst" in sys.modules)  # the ast path needs no libcst

        from msprobe_rewrite.api import rewrite_source
        def cli_code(module, name):
            with open(module.__file__, "rb") as handle:
                source = rewrite_source(handle.read(), path=module.__file__, add_import=False)
            namespace = {"__msprobe__": None}
            exec(compile(source, module.__file__, "exec"), namespace)
            return namespace[name].__code__
        for module, name in ((mypkg, "f"), (mypkg.sub.deep, "g")):
            hooked, cli = getattr(module, name).__code__, cli_code(module, name)
            print(hooked.co_code == cli.co_code, hooked.co_names == cli.co_names, hooked.co_consts == cli.co_consts,
                  "__msprobe__" in hooked.co_names)
    """,
            tree,
        )
    )
    assert out.split() == ["False"] + ["True"] * 8


def test_a_failure_of_the_ast_path_is_reported_and_libcst_instruments_the_module(tree):
    result = run(
        """
        import warnings
        warnings.simplefilter("always")
        import msprobe_rewrite.ast_transformer as ast_transformer
        real = ast_transformer.rewrite_to_ast
        def broken(source, *args, path="", **kwargs):
            if path.endswith("deep.py"):
                raise IndexError("injected bug")
            return real(source, *args, path=path, **kwargs)
        ast_transformer.rewrite_to_ast = broken
        from msprobe_rewrite import install_import_hook
        install_import_hook(["mypkg"])
        import mypkg.sub.deep
        print(instrumented(mypkg.f), instrumented(mypkg.sub.deep.g), "libcst" in sys.modules)
    """,
        tree,
    )
    assert ok(result).split() == ["True", "True", "True"]
    assert result.stderr.count("please report: IndexError: injected bug") == 1
    assert "deep.py" in result.stderr and "uninstrumented" not in result.stderr


def test_a_module_with_a_syntax_error_raises_it_as_python_does(tree):
    write_tree(
        tree,
        {
            "mypkg/bad.py": "import torch\ndef f(:\n    pass\n",
            "mypkg/late.py": "import torch\nx = torch.relu(y)\nfrom __future__ import annotations\n",
        },
    )
    result = run(
        """
        from msprobe_rewrite import install_import_hook
        install_import_hook(["mypkg"])
        for name in ("mypkg.bad", "mypkg.late"):
            try:
                __import__(name)
            except SyntaxError as error:
                print(name, type(error).__name__, error.lineno, error.filename.endswith(name[6:] + ".py"))
    """,
        tree,
    )
    assert ok(result).splitlines() == ["mypkg.bad SyntaxError 2 True", "mypkg.late SyntaxError 3 True"]
    assert "please report" not in result.stderr


def test_environment_variable_installs_the_hook_through_pythonpath(tree):
    hook_path = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "hook-path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = ok(
        run(
            """
        import mypkg, otherpkg
        print(instrumented(mypkg.f), instrumented(otherpkg.h))
    """,
            tree,
            env={"PYTHONPATH": hook_path, "MSPROBE_REWRITE_PACKAGES": "mypkg"},
        )
    )
    assert out.split() == ["True", "False"]


SCRIPT = """\
import sys
import torch
import helper
from torch import relu

def main():
    print(sys.argv[1:], __name__, "__msprobe__" in main.__code__.co_names,
          "__msprobe__" in helper.double.__code__.co_names, relu(torch.tensor([-1.0])).tolist())
    if "--fail" in sys.argv:
        raise RuntimeError("script failed")
    return 7

if __name__ == "__main__":
    sys.exit(main())
"""


def test_run_script_behaves_like_python(tree):
    write_tree(tree, {"train.py": SCRIPT, "helper.py": "def double(x):\n    return x * 2\n"})
    for command in (
        ["-m", "msprobe_rewrite", "run", "--", "train.py", "a", "--b"],
        ["-m", "msprobe_rewrite", "run", "train.py", "a", "--b"],
    ):
        result = subprocess.run([sys.executable, *command], cwd=tree, capture_output=True, text=True, timeout=300)
        assert result.returncode == 7, result.stderr
        assert result.stdout.strip() == "['a', '--b'] __main__ True True [0.0]"
    failed = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "run", "train.py", "--fail"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert failed.returncode == 1
    assert 'raise RuntimeError("script failed")' in failed.stderr
    assert "run_command.py" not in failed.stderr  # the traceback starts at the user's code


def test_run_module_behaves_like_python_dash_m(tree):
    script = SCRIPT.replace("import helper\n", "from mypkg import f as helper_f\n").replace(
        '"__msprobe__" in helper.double.__code__.co_names', '"__msprobe__" in helper_f.__code__.co_names'
    )
    write_tree(tree, {"mypkg/__main__.py": script})
    result = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "run", "-m", "mypkg", "x"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 7, result.stderr
    assert result.stdout.strip() == "['x'] __main__ True True [0.0]"
    missing = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite", "run", "-m", "nosuchmodule"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode == 1 and "No module named" in missing.stderr


def test_torchrun_starts_it_as_its_program(tree):
    write_tree(
        tree,
        {
            "dist_train.py": """\
        import os
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(2) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        line = f"rank {dist.get_rank()} {t.tolist()} {'__msprobe__' in globals()}"
        with open(f"rank{dist.get_rank()}.txt", "w") as out:  # one file each: the ranks share stdout
            out.write(line)
        dist.destroy_process_group()
        """
        },
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "msprobe_rewrite",
            "run",
            "--",
            "dist_train.py",
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [(tree / f"rank{rank}.txt").read_text() for rank in (0, 1)] == [
        "rank 0 [3.0, 3.0] True",
        "rank 1 [3.0, 3.0] True",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "source",
    ["import torch\ndef f(:\n    pass\n", "import torch\nx = (torch.relu(y),\nz = 2\n", "import torch\nx = f(\0)\n"],
)
def test_a_syntax_error_under_the_hook_surfaces_as_pythons_own(tree, source):
    write_tree(tree, {"mypkg/broken.py": source})
    plain = run("import mypkg.broken", tree)
    hooked = run(
        """
        from msprobe_rewrite import install_import_hook
        install_import_hook(["mypkg"])
        import mypkg.broken
    """,
        tree,
    )
    assert plain.returncode == hooked.returncode == 1
    for noise in ("RuntimeWarning", "RewriteError", "During handling", "imported uninstrumented"):
        assert noise not in hooked.stderr, hooked.stderr

    def error(stderr):  # the exception as Python prints it: from the module's own frame (if any) to the end
        lines = stderr.splitlines()
        start = next((i for i, line in enumerate(lines) if "broken.py" in line), len(lines) - 1)
        return lines[start:]

    assert error(hooked.stderr) == error(plain.stderr)
    assert error(plain.stderr)[-1].startswith(("SyntaxError:", "ValueError:"))


def test_a_link_planted_beside_the_bytecode_cache_is_not_written_through(tmp_path, monkeypatch):
    """The cache file's temporary name was ``{path}.tmp.{pid}``, opened without O_EXCL: a link planted there
    (the pid is easy to guess) was written through. It is now a name no one can guess, opened exclusively."""
    from msprobe_rewrite import bytecode_cache

    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # the environment sets PYTHONDONTWRITEBYTECODE=1
    source = tmp_path / "mod.py"
    source.write_text("x = 1\n")
    path = bytecode_cache.cache_path(str(source))
    os.makedirs(os.path.dirname(path))
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not ours")
    for guess in (f"{path}.tmp.{os.getpid()}", f"{path}.tmp"):
        os.symlink(outside, guess)
    key = bytecode_cache.cache_key(source.read_bytes(), "fingerprint", "")
    code = compile(source.read_text(), str(source), "exec")
    assert bytecode_cache.write(path, key, code)
    assert outside.read_bytes() == b"not ours"
    assert bytecode_cache.read(path, key) is not None and not os.path.islink(path)


def _consts(code):
    for const in code.co_consts:
        if isinstance(const, type(code)):
            yield from _consts(const)
        else:
            yield const


def test_the_bytecode_cache_is_keyed_by_the_package_the_module_is_imported_in(tmp_path, monkeypatch):
    """One file imported as ``megatron.core.fusions.user`` and as ``core.fusions.user`` (two sys.path
    entries): its relative import resolves to megatron's catalogued fused op only under the first name. The
    second import used to read the first one's code from the cache."""
    from msprobe_rewrite import bytecode_cache
    from msprobe_rewrite.import_hook import InstrumentingLoader
    from msprobe_rewrite.module_code import RewriteOptions

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    fusions = tmp_path / "megatron" / "core" / "fusions"
    fusions.mkdir(parents=True)
    for folder in (tmp_path / "megatron", tmp_path / "megatron" / "core", fusions):
        (folder / "__init__.py").write_text("")
    (fusions / "fused_bias_gelu.py").write_text("def bias_gelu_impl(x, b):\n    return x + b\n")
    user = fusions / "user.py"
    user.write_text("from .fused_bias_gelu import bias_gelu_impl\n\n\ndef f(x, b):\n    return bias_gelu_impl(x, b)\n")
    options = RewriteOptions()
    names = {}
    for fullname in ("megatron.core.fusions.user", "core.fusions.user"):
        code = InstrumentingLoader(fullname, str(user), options, is_package=False).get_code(fullname)
        names[fullname] = "Megatron.bias_gelu_impl" in set(_consts(code))
    assert names == {"megatron.core.fusions.user": True, "core.fusions.user": False}
    assert os.path.exists(bytecode_cache.cache_path(str(user)))  # the cache was written, and read as keyed
