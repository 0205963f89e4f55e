"""The compiler's invariants over real code: every .py file of CPython's standard library and of megatron-core.

Per file, in one pass (``corpus_check.check_source``): the import hook's ast path gives the same tree as the
libcst output without its runtime import (or leaves the file to libcst); the output compiles; ``rewrite(rewrite(s)) ==
rewrite(s)``; ``restore(rewrite(s)) == s`` byte for byte, and the restore on text gives what the libcst
restore gives, without falling back to it (``restore_agreement``); the output has the same lines, every
statement starts and ends on the same lines (and columns, but for the line that carries the runtime import),
every def/class keeps its name and line, and every name of the original is still on its line.

A file Python itself rejects (the standard library's intentionally broken test data) must be refused with
``RewriteError``, never crash; only errors that Python's parser lets through and its compiler finds (a
misplaced ``from __future__`` import) may be rewritten instead, and then must still restore exactly. A valid file the
compiler refuses must be refused for one of the reasons listed
in ``KNOWN_REFUSALS``; anything else fails, so a new kind of refusal is looked at rather than hidden.

The corpora are large (about 2,200 files), so files are checked in a process pool inside the test, and
failures are collected into one message. ``MSPROBE_CORPUS_LIMIT=N`` checks only every k-th file so that about
N are checked (for a quick local run); CI checks them all.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus_check  # noqa: E402  (a plain module, so that spawned workers can import it by name)
from corpus_check import (
    BEYOND,
    FAILED,
    FALLBACK,
    INVALID,
    OK,
    REFUSED,
    SAME,
    UNCHANGED,  # noqa: E402
    check_source,
)

from msprobe_rewrite.api import RewriteError, restore_source, rewrite_source  # noqa: E402

SHOW = 25  # failing files listed in one assertion message

# Valid Python that the compiler leaves uninstrumented, each with why. Keyed by a pattern of the RewriteError
# message; a refusal matching none of them fails the test.
KNOWN_REFUSALS = {
    "libcst's parser rejects valid Python": re.compile(r"cannot parse: "),
    "libcst recurses too deeply on a very long expression": re.compile(r"too deeply nested"),
    "libcst cannot reproduce the file byte for byte": re.compile(r"libcst does not reproduce"),
    "no existing line can carry the runtime import": re.compile(r"can carry the runtime import"),
}


def _category(reason: str) -> str:
    for name, pattern in KNOWN_REFUSALS.items():
        if pattern.search(reason):
            return name
    return ""


def _sample(files):
    limit = int(os.environ.get("MSPROBE_CORPUS_LIMIT", "0"))
    if limit and len(files) > limit:
        step = len(files) // limit
        return files[::step]
    return files


def _run(files):
    workers = max(1, min(os.cpu_count() or 1, 8))
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold torch's threads
    results = []
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        results.extend(pool.map(corpus_check.check_file, files, chunksize=8))
    return results


def _report(corpus: str, results, elapsed: float) -> None:
    counts = Counter(result.status for result in results)
    failed = [r for r in results if r.status == FAILED]
    refused = [r for r in results if r.status == REFUSED]
    invalid = [r for r in results if r.status == INVALID]
    unexplained = [r for r in refused if not _category(r.reason)]
    invalid_rewritten = [r for r in invalid if r.reason.startswith("rewritten although")]

    by_category = defaultdict(list)
    for result in refused:
        by_category[_category(result.reason) or "unexplained"].append(result)
    lines = [
        f"{corpus}: {len(results)} files in {elapsed:.0f} s: {counts[OK]} instrumented, "
        f"{counts[UNCHANGED]} unchanged, {counts[REFUSED]} refused, {counts[INVALID]} invalid Python, "
        f"{counts[FAILED]} failed"
    ]
    for category, members in sorted(by_category.items()):
        lines.append(f"  refused, {category}: {len(members)}")
        lines.extend(f"    {r.path}: {r.reason}" for r in members[:SHOW])
    if invalid_rewritten:
        lines.append(
            f"  invalid Python rewritten (restorable; Python's compiler still rejects it): {len(invalid_rewritten)}"
        )
        lines.extend(f"    {r.path}: {r.reason}" for r in invalid_rewritten[:SHOW])
    paths = Counter(result.ast_path for result in results)
    lines.append(
        f"  the import hook's ast path: {paths[SAME]} the same tree as libcst's output, {paths[FALLBACK]} "
        f"left to libcst, {paths[BEYOND]} instrumented where libcst cannot parse"
    )
    summary = "\n".join(lines)
    print("\n" + summary)

    problems = [f"{r.path}: {r.reason}" for r in failed]
    problems += [f"{r.path}: refused for an unlisted reason: {r.reason}" for r in unexplained]
    if problems:
        shown = "\n".join(problems[:SHOW])
        more = f"\n... and {len(problems) - SHOW} more" if len(problems) > SHOW else ""
        pytest.fail(
            f"{len(problems)} of {len(results)} {corpus} files break an invariant:\n{shown}{more}\n\n{summary}",
            pytrace=False,
        )


@pytest.mark.slow  # every file of the standard library (about 300 s)
def test_stdlib():
    files = _sample(corpus_check.stdlib_files())
    assert len(files) > 100
    start = time.perf_counter()
    results = _run(files)
    _report("stdlib", results, time.perf_counter() - start)
    assert sum(r.ast_path == FALLBACK for r in results) <= len(results) // 20


@pytest.mark.slow  # every file of megatron-core (about 40 s)
def test_megatron_core():
    files = _sample(corpus_check.extra_files("megatron-core"))
    assert len(files) > 100
    start = time.perf_counter()
    results = _run(files)
    _report("megatron-core", results, time.perf_counter() - start)
    assert sum(r.status == OK for r in results) > len(results) // 2  # it is torch code: most files change
    # The import hook's speed comes from its ast path; a file it leaves to libcst is correct but slow.
    assert sum(r.ast_path == FALLBACK for r in results) <= len(results) // 50


# -- synthetic byte variants of real files ---------------------------------------------------------------


def _megatron_file(relative: str) -> str:
    for path in corpus_check.extra_files("megatron-core"):
        if path.replace(os.sep, "/").endswith(relative):
            return path
    pytest.fail(f"megatron-core has no {relative}", pytrace=False)


SOURCES = {
    # torch calls, operators, augmented assignments, decorators and docstrings
    "megatron/core/transformer/mlp.py": lambda: _megatron_file("megatron/core/transformer/mlp.py"),
    "megatron/core/fusions/fused_bias_gelu.py": lambda: _megatron_file("megatron/core/fusions/fused_bias_gelu.py"),
    # a module whose first statement is not a simple one, plenty of operators
    "stdlib colorsys.py": lambda: os.path.join(os.path.dirname(os.__file__), "colorsys.py"),
}


def _crlf(source: bytes) -> bytes:
    return source.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")


def _cr(source: bytes) -> bytes:
    return source.replace(b"\r\n", b"\n").replace(b"\n", b"\r")


def _mixed_endings(source: bytes) -> bytes:
    """Lines ending in \n, \r\n and a lone \r in turn, counted from the end: the last ends in \r, the ending libcst
    dropped (test_line_endings.py)."""
    lines = source.replace(b"\r\n", b"\n").split(b"\n")
    endings = (b"\r", b"\r\n", b"\n")
    last = len(lines) - 2  # the last line with an ending
    return b"".join(
        line + (endings[(last - number) % 3] if number < len(lines) - 1 else b"") for number, line in enumerate(lines)
    )


def _bom(source: bytes) -> bytes:
    return b"\xef\xbb\xbf" + source


def _latin1(source: bytes) -> bytes:
    text = source.decode("utf-8")
    body = text.encode("latin-1", errors="replace")
    return b"# -*- coding: latin-1 -*-\n# caf\xe9 na\xefve \xb5s\n" + body + b"x_\xe9 = '\xe9\xe8'\n"


def _tabs(source: bytes) -> bytes:
    lines = []
    for line in source.split(b"\n"):
        stripped = line.lstrip(b" ")
        indent = len(line) - len(stripped)
        lines.append(b"\t" * (indent // 4) + b" " * (indent % 4) + stripped)
    return b"\n".join(lines)


def _trailing_whitespace(source: bytes) -> bytes:
    lines = []
    for number, line in enumerate(source.split(b"\n")):
        if line.endswith(b"\\"):
            lines.append(line)
        else:
            lines.append(line + (b" \t", b"   ", b"\t", b"")[number % 4])
    return b"\n".join(lines)


def _no_final_newline(source: bytes) -> bytes:
    return source.rstrip(b"\r\n \t")


def _form_feeds(source: bytes) -> bytes:
    return source.replace(b"\n\n\n", b"\n\x0c\n\n")


VARIANTS = {
    "crlf": _crlf,
    "cr": _cr,
    "mixed line endings": _mixed_endings,
    "bom": _bom,
    "latin-1 cookie": _latin1,
    "tabs": _tabs,
    "trailing whitespace": _trailing_whitespace,
    "no final newline": _no_final_newline,
    "form feeds": _form_feeds,
    "bom + crlf + no final newline": lambda s: _no_final_newline(_crlf(_bom(s))),
    "latin-1 + crlf + tabs": lambda s: _crlf(_tabs(_latin1(s))),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("source_name", SOURCES)
def test_byte_variants(source_name, variant):
    with open(SOURCES[source_name](), "rb") as handle:
        original = handle.read()
    source = VARIANTS[variant](original)
    assert source != original
    tree, invalid = corpus_check._python_accepts(source, source_name)
    assert tree is not None, f"the {variant} variant is not valid Python: {invalid}"
    result = check_source(source, source_name)
    assert result.status == OK, result.reason


@pytest.mark.parametrize(
    "source",
    [
        b"\xef\xbb\xbfimport torch\r\ny = torch.relu(x)",  # BOM, CRLF, no final newline
        b"# -*- coding: latin-1 -*-\nimport torch\ns = '\xe9'\ny = torch.relu(x) + 1\n",
        b"import torch\n\ndef f(x):\n\treturn torch.relu(x)\t \n",
        b"import torch\ny = torch.relu(x)  \n   \n\n",
        b"#!/usr/bin/env python\n# coding: latin-1\n\n'''Doc \xe9.'''\r\nimport torch\r\ny = -x\r\n",
    ],
)
def test_small_byte_variants(source):
    result = check_source(source, "<variant>")
    assert result.status == OK, result.reason


@pytest.mark.parametrize(
    "source",
    [
        b"def f(:\n",
        b"x = 1\x00\n",
        b"# coding: no-such-codec\nx = 1\n",
        b"\xff\xfe\x00",
        b"x = '\xe9'\n",  # not UTF-8 and no cookie
        b"\xef\xbb\xbf# coding: latin-1\nx = 1\n",  # a BOM contradicting the cookie
    ],
)
def test_invalid_input_raises_rewrite_error(source):
    with pytest.raises(RewriteError):
        rewrite_source(source)
    assert restore_source(source) == source


# -- constructs the corpora found ------------------------------------------------------------------------

FOUND = {
    # f(x for x in y): a bare generator is only valid as the sole argument, so the call stays as it is
    # (its insides are still instrumented); 103 stdlib and 5 megatron-core files have one.
    "bare generator argument": (
        b"import torch\ny = torch.cat(t + 1 for t in ts)\nz = f((t for t in ts))\n",
        b"import msprobe_runtime as __msprobe__; import torch\n"
        b"y = torch.cat(__msprobe__.add(t, 1) for t in __msprobe__.iterate(ts))\n"
        b"z = __msprobe__.dyn(f, (t for t in __msprobe__.iterate(ts)))\n",
    ),
    # match patterns are not expressions: `case -1:` and `case 0+0j:` must stay literal (test_patma.py)
    "match patterns": (
        b"x = f()\nmatch x:\n    case {-0-0j: int(real=0+0j)} if -x > 0:\n        y = -x\n",
        b"import msprobe_runtime as __msprobe__; x = __msprobe__.dyn(f)\nmatch x:\n"
        b"    case {-0-0j: int(real=0+0j)} if __msprobe__.truth(__msprobe__.gt(__msprobe__.neg(x), 0)):\n"
        b"        y = __msprobe__.neg(x)\n",
    ),
    # a call whose arguments start on the next line keeps its callee on the call's line
    "callee stays on its line": (
        b"import torch\ny = torch.relu(\n    x)\nz = f(\n)\n",
        b'import msprobe_runtime as __msprobe__; import torch\ny = __msprobe__.call("Torch.relu", torch.relu,\n'
        b"    x)\nz = __msprobe__.dyn(f\n)\n",
    ),
    # the same with a backslash continuation (unittest/loader.py, idlelib/pyparse.py); a line break between
    # the callee and its `(` (idle_test/test_macosx.py) has no such form, so that call is left as it is
    "callee stays on its line across a backslash": (
        b"import torch\ny = torch.relu(\\\n    x)\nz = f \\\n (x)\n",
        b'import msprobe_runtime as __msprobe__; import torch\ny = __msprobe__.call("Torch.relu", torch.relu,\\\n'
        b"    x)\nz = f \\\n (x)\n",
    ),
    # `from __future__ import x; import site` (test_future_stmt/future_test2.py): the runtime import went in
    # front of the __future__ import, a SyntaxError; it now follows it on the same line
    "__future__ import opening a line": (
        b'"""Doc."""\n\nfrom __future__ import nested_scopes; import site\nx = -y\n',
        b'"""Doc."""\n\nfrom __future__ import nested_scopes; import msprobe_runtime as __msprobe__; import site\n'
        b"x = __msprobe__.neg(y)\n",
    ),
    # a module that opens with a def or class on line 1 (idlelib/delegator.py, test/dtracedata/line.py):
    # the import takes a blank line between definitions, before any other statement runs
    "module opening with definitions": (
        b"class D:\n    def f(self):\n        return -self.x\n\n\nif __name__ == '__main__':\n    main()\n",
        b"class D:\n    def f(self):\n        return __msprobe__.neg(self.x)\n\n"
        b"import msprobe_runtime as __msprobe__\nif __name__ == '__main__':\n    __msprobe__.dyn(main)\n",
    ),
    # but not after a decorator that calls an instrumented function defined above it
    "definition running an instrumented body": (
        b"def deco(f):\n    return -f\n\n@deco\ndef g(): pass\n",
        b"def deco(f):\n    return __msprobe__.neg(f)\nimport msprobe_runtime as __msprobe__\n@deco\ndef g(): pass\n",
    ),
}


@pytest.mark.parametrize("name", FOUND)
def test_found_in_corpora(name):
    before, after = FOUND[name]
    assert rewrite_source(before) == after
    result = check_source(before, name)
    assert result.status == OK, result.reason


@pytest.mark.parametrize(
    "source",
    [
        b"import torch\ny = torch.relu(x)\n\n\n   ",  # lines of spaces after blank lines at the end
        b"import torch\ny = torch.relu(x)\n\n    # y = torch.gelu(x)\n",  # or an indented comment
        b"import torch\ntry:\n    y = torch.relu(x)\nexcept E :\n    pass\n",  # libcst drops the space before ':'
        b"import torch\ndef f(x):\n    y = 1\n\x0c    return torch.relu(x)\n",  # and a form feed before an indent
    ],
)
def test_what_libcst_cannot_reproduce_is_left_alone(source):
    with pytest.raises(RewriteError, match="libcst does not reproduce"):
        rewrite_source(source)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="whitespace after a conversion is Python 3.12 syntax")
def test_a_spaced_fstring_conversion_is_left_alone():
    # found on Python 3.12's test_fstring.py: libcst writes f"{3!s  }" back as f"{3!s}"
    with pytest.raises(RewriteError, match="libcst does not reproduce"):
        rewrite_source(b'import torch\ny = torch.relu(x)\nz = f"{3!s  }"\n')


def test_too_deep_for_libcst_is_refused():
    source = b"import torch\nx = {'k': " + b"'a'\n    " * 1000 + b"}\ny = torch.relu(x)\n"
    with pytest.raises(RewriteError, match="too deeply nested"):
        rewrite_source(source)


def test_no_line_before_a_decorator_that_runs_instrumented_code():
    # `@deco` calls deco's instrumented body as `g` is defined: no line before it can carry the import
    with pytest.raises(RewriteError, match="can carry the runtime import"):
        rewrite_source(b"def deco(f):\n    return -f\n@deco\ndef g(): pass\n\nx = 1\n")
