"""Cold-cache prefetch: the static import order, and workers that write exactly what the loader would."""

import marshal
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from msprobe_rewrite import bytecode_cache
from msprobe_rewrite.prefetch import ModuleIndex, import_order, share, worker_count

TREE = {
    "app/__init__.py": """\
        from typing import TYPE_CHECKING
        from . import first
        import app.second
        if TYPE_CHECKING:
            from app import typing_only
        try:
            from .third import thing
        except ImportError:
            thing = None

        def later():
            from app import lazy
            return lazy
        """,
    "app/first.py": "from .pkg import leaf\n",
    "app/second.py": "import torch\nimport json\n\ndef g(x):\n    return torch.relu(x)\n",
    "app/third.py": "thing = 3\n",
    "app/pkg/__init__.py": "",
    "app/pkg/leaf.py": "import torch.nn.functional as F\n\ndef h(x):\n    return F.gelu(x)\n",
    "app/typing_only.py": "X = 1\n",
    "app/lazy.py": "import torch\n\ndef k(x):\n    return torch.tanh(x)\n",
    "app/unused.py": "import torch\n",
}


def write_tree(root: Path) -> Path:
    for name, text in TREE.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def tree(tmp_path):
    return write_tree(tmp_path / "src")


@pytest.mark.slow  # spawns interpreters
def test_static_order_is_the_order_python_imports_in(tree):
    found, eager = import_order("app", ModuleIndex(["app"], {"app": [str(tree / "app")]}))
    order = [name for name, _, _ in found]
    # parents before children, depth first in source order, typing-only imports left out, imports inside
    # functions after everything the module bodies import, and a module nothing imports never listed
    assert order == ["app", "app.first", "app.pkg", "app.pkg.leaf", "app.second", "app.third", "app.lazy"]
    assert eager == 6
    actual = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import sys
        seen = []
        class Log:  # sys.modules keeps completion order; the loader sees modules in find order
            def find_spec(self, name, path=None, target=None):
                seen.append(name)
        sys.meta_path.insert(0, Log())
        import app
        app.later()
        print(" ".join(n for n in seen if n.startswith("app")))
        """),
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert actual == order


def test_workers_take_turns_from_the_far_end_of_what_is_surely_imported():
    order = list(range(7))  # 0..4 imported by module bodies, 5 and 6 only inside functions
    assert share(order, 5, 0, 2) == [4, 2, 0, 6]
    assert share(order, 5, 1, 2) == [3, 1, 5]
    assert share(order, 5, 0, 1) == [4, 3, 2, 1, 0, 5, 6]


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"MSPROBE_REWRITE_PREFETCH": "0"}, 0),
        ({"MSPROBE_REWRITE_PREFETCH": "3"}, 3),
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, 0),
        ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "100000"}, 0),
    ],
)
def test_worker_count(environ, expected):
    assert worker_count(environ) == expected


def test_worker_count_leaves_a_core_for_the_importing_process():
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    assert worker_count({}) == max(0, min(4, cores - 1))


def run(code, cwd, prefetch):
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    environment["MSPROBE_REWRITE_PREFETCH"] = str(prefetch)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def cached_code(path: Path):
    data = path.read_bytes()
    return marshal.loads(data[len(bytecode_cache._HEADER) + bytecode_cache._KEY_SIZE :])


def cache_of(tree: Path, module: str) -> Path:
    return Path(bytecode_cache.cache_path(str(tree / module)))


@pytest.mark.slow  # spawns interpreters
def test_a_worker_caches_what_the_loader_would_and_the_loader_uses_it(tree, tmp_path):
    # the loader's own entries, every module imported in turn with no worker
    reference = shutil.copytree(tree, tmp_path / "reference")
    run(
        """
        from msprobe_rewrite import install_import_hook
        install_import_hook(["app"])
        import app, app.lazy
        """,
        reference,
        prefetch=0,
    )
    # now only `app` is imported: `app.lazy` (imported inside a function, never called) comes from a worker
    out = run(
        """
        import sys
        from msprobe_rewrite import install_import_hook, prefetch
        install_import_hook(["app"])
        import app
        prefetch.wait_workers(timeout=240)
        print(len(prefetch._workers), [w.returncode for w in prefetch._workers], "app.lazy" in sys.modules)
        """,
        tree,
        prefetch=2,
    )
    assert out.split() == ["2", "[0,", "0]", "False"]
    for module in ("app/lazy.py", "app/third.py", "app/pkg/leaf.py"):
        ours, theirs = cache_of(tree, module), cache_of(reference, module)
        assert ours.exists(), module
        code, want = cached_code(ours), cached_code(theirs)
        assert code == want
        names = {n for c in (code, *code.co_consts) if hasattr(c, "co_names") for n in c.co_names}
        assert ("__msprobe__" in names) == (module != "app/third.py")  # third.py calls nothing
        assert code.co_filename == str(tree / module)
    assert not cache_of(tree, "app/unused.py").exists()  # nothing imports it
    assert not cache_of(tree, "app/typing_only.py").exists()
    assert not list(tree.rglob("*.tmp.*"))
    # the next process reads the worker's entry: it rewrites nothing, and the module is instrumented
    stamp = cache_of(tree, "app/lazy.py").stat().st_mtime_ns
    out = run(
        """
        from msprobe_rewrite import install_import_hook
        install_import_hook(["app"])
        import app
        print(app.later().k.__code__.co_names[0])
        """,
        tree,
        prefetch=0,
    )
    assert out.split() == ["__msprobe__"]
    assert cache_of(tree, "app/lazy.py").stat().st_mtime_ns == stamp


@pytest.mark.slow  # spawns interpreters
def test_no_worker_without_a_bytecode_cache(tree):
    out = run(
        """
        import sys
        sys.dont_write_bytecode = True
        from msprobe_rewrite import install_import_hook, prefetch
        install_import_hook(["app"])
        import app
        print(len(prefetch._workers))
        """,
        tree,
        prefetch=2,
    )
    assert out.split() == ["0"]
    assert not list(tree.rglob("*.msprobe-rewrite.pyc"))


@pytest.mark.slow  # spawns interpreters
def test_a_worker_with_another_fingerprint_writes_nothing(tree):
    import json

    job = {
        "start": "app",
        "packages": ["app"],
        "roots": {"app": [str(tree / "app")]},
        "catalogue_files": [],
        "skip_decorators": [],
        "fingerprint": "not ours",
        "pycache_prefix": None,
        "parent": os.getpid(),
        "count": 1,
        "index": 0,
    }
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-m", "msprobe_rewrite.prefetch"],
        input=json.dumps(job),
        text=True,
        capture_output=True,
        env=environment,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert not list(tree.rglob("*.msprobe-rewrite.pyc"))
