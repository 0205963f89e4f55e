"""The restore that works on text (``msprobe_rewrite.text_restore``) against the libcst restore, its reference.

Spellings the rewrite produces must come back exactly, on text, without falling back; forms edited by hand
in ways the reference treats in its own manner (parentheses it drops, a keyword argument) must fall back
and give the reference's result. Every golden case and every corpus file is compared too (``test_golden``,
``corpus_check``), and ``conftest`` compares every restore of the compiler's tests.
"""

from __future__ import annotations

import os
import sys
from textwrap import dedent

import pytest

from msprobe_rewrite import api, text_forms, text_restore

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from restore_agreement import restore_disagreement  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from generated_module import generate  # noqa: E402

# Originals whose rewrite puts forms in awkward places: comments and line breaks inside calls, nesting,
# truth tests across lines, f-strings, semicolons, and the runtime import's placements.
ORIGINALS = {
    "comments and line breaks in calls": """\
        import torch
        y = torch.relu(  # why
            x,  # this one
        )
        z = f(
        )
        w = g(
            a)(b)
        v = torch.cat(\\
            [a, b])
        """,
    "nested operators and stores": """\
        import torch
        y = -(a + b) * c[i] @ d.t() ** 2 // 3 % e
        x[i] += f(y) - g(z)
        self.a.b += 1; o[k][j] = v
        a = b = c
        n -= (1 + m)
        q[1:2, ...] **= w < v
        t = ~u ^ (v | w) & x << 1 >> 2
        """,
    "truth tests": """\
        import torch
        if (
            a > 0
            and not b
        ):
            pass
        elif (c): pass
        while x != y or (z):
            assert w == v, f"{w} != {v}"
        r = [i for i in s if i >= t]
        u = p if q <= 0 else -p
        match m:
            case [k] if k > 1:
                pass
        flag = not (a and b)
        """,
    "f-strings": """\
        import torch
        s = f"{x + 1!r:>{w - 2}} {torch.relu(y)} {'a' if z > 0 else 'b'}"
        t = f'{f(g(h))}' f"{-k}"
        """,
    "f-strings across lines and after non-ASCII text": '''\
        import torch
        s = f"é{torch.relu(x)} ü {-y}"; t = f"{'é'}{-c}{f(x)}"
        u = f"""
          {torch.relu(x)}
          é{a + b:>{w}}{ c(d)
        }"""
        v = (f"{a+b}" f"{-c}"
             f"{d*e}")
        ''',
    "decorators and lambdas": """\
        import torch

        @decorate(arg)
        def f(x=-1):
            return (lambda y: torch.relu(y) + 1)(x)
        """,
    "import after docstring and future": '''\
        """Doc."""
        from __future__ import annotations
        import torch
        y = torch.relu(x)
        ''',
    "import on a comment line": """\
        #!/usr/bin/env python
        # -*- coding: utf-8 -*-

        # note
        if cond():
            y = g(x)
        """,
    "import into a try body": """\
        def helper(x):
            return f(x)
        try:
            import torch
        except ImportError:
            torch = None
        """,
    "import between definitions": """\
        class D:
            def f(self):
                return -self.x


        if __name__ == '__main__':
            main()
        """,
    "import after a docstring line": '''\
        """Doc."""
        def f():
            return -x
        ''',
}

# Byte-level variants the text restore must keep: they change offsets, line breaks and encodings.
VARIANTS = {
    "as written": lambda source: source,
    "crlf": lambda source: source.replace(b"\n", b"\r\n"),
    "bom": lambda source: b"\xef\xbb\xbf" + source,
    "latin-1": lambda source: b"# -*- coding: latin-1 -*-\n" + source + b"s = '\xe9' + f(x)\n",
    "utf-8 names": lambda source: source + "é = f(ü) + 1\nz = 'ß' < g(y)\n".encode(),
    "no final newline": lambda source: source.rstrip(b"\n"),
}


def restore_without_fallback(instrumented: bytes):
    before = sum(text_restore.FALLBACKS.values())
    result = api.restore_report(instrumented)
    assert sum(text_restore.FALLBACKS.values()) == before, dict(text_restore.FALLBACKS)
    return result


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ORIGINALS)
def test_rewritten_source_restores_on_text_as_libcst_does(name, variant):
    original = VARIANTS[variant](dedent(ORIGINALS[name]).encode())
    instrumented = api.rewrite_source(original)
    assert instrumented != original
    assert restore_without_fallback(instrumented) == (original, [])
    assert restore_disagreement(instrumented, name) == []


# Instrumented text as a user might have edited it: (source, whether the text path must leave it to libcst).
EDITED = {
    "spaced callee": (b"y = __msprobe__ . add (a , b)\n", False),
    "keyword after the callee": (b"y = __msprobe__.dyn(f, x, k=1, *a, **kw)\n", False),
    "parentheses kept around a form": (b"y = (__msprobe__.neg(x)) * 2\n", False),
    "a multiple assignment keeps its augmented form": (b"a = b = __msprobe__.iadd(x, 1)\n", False),
    "an item call that is no store stays": (b"v = __msprobe__.item(o)[k]\n", False),
    "an unknown entry stays": (b"v = __msprobe__.nothing(o)\n", False),
    "a truth test in a call's parentheses": (b"v = f(__msprobe__.truth(t))\n", False),
    "a parenthesized truth test": (b"if (__msprobe__.truth(t)):\n    pass\n", True),
    "a parenthesized truth test across lines": (b"if (\n    __msprobe__.truth(t)\n):\n    pass\n", True),
    "a keyword argument in an operator form": (b"y = __msprobe__.add(a, b=1)\n", True),
    "a trailing comma after the callee": (b"y = __msprobe__.dyn(f, )\n", True),
    "a parenthesized augmented form": (b"x = (__msprobe__.iadd(x, 1))\n", True),
    "a form in the text another form drops": (b"x = __msprobe__.iadd(__msprobe__.neg(x), 1)\n", True),
    "a parenthesized aug form": (b'(__msprobe__.aug(__msprobe__.attr(o, "a"), "iadd", v))\n', True),
    "an aug form of an unknown operator (libcst raises)": (
        b'__msprobe__.aug(__msprobe__.attr(o, "a"), "inothing", v)\n',
        True,
    ),
    "a starred operand": (b"y = __msprobe__.neg(*x)\n", True),
    "a truth test that restores to an aug form": (b'__msprobe__.truth(__msprobe__.aug(o, "iadd", v))\n', True),
    "a dyn form that restores to an iadd form": (b"x = __msprobe__.dyn(__msprobe__.iadd, x, 1)\n", True),
    "a dyn form that restores to an item store": (b"__msprobe__.dyn(__msprobe__.item, o)[k] = v\n", True),
    # the runtime import where a placement puts it, where a formatter moves it, and where neither would
    "import on a comment line": (
        b"import msprobe_runtime as __msprobe__  # note\nif x:\n    y = __msprobe__.neg(x)\n",
        False,
    ),
    "import on a blank line before comments": (
        b"import msprobe_runtime as __msprobe__ \n# a\n\n@d\ndef f():\n    return __msprobe__.neg(x)\n",
        False,
    ),
    "import split off its line, crlf": (b"import msprobe_runtime as __msprobe__\r\ny = __msprobe__.neg(x)\r\n", False),
    "import as the last statement": (b"y = __msprobe__.dyn(f, x)\nimport msprobe_runtime as __msprobe__\n", False),
    "import after a docstring": (
        b'"""Doc.""" ; import msprobe_runtime as __msprobe__\ny = __msprobe__.neg(x)\n',
        False,
    ),
    "import after __future__": (
        b"from __future__ import annotations; import msprobe_runtime as __msprobe__; import os\ny = -x\n",
        False,
    ),
    "import between other statements": (
        b"a = 1; import msprobe_runtime as __msprobe__; b = __msprobe__.neg(x)\n",
        False,
    ),
    "import in a try body on its line": (
        b"try: import msprobe_runtime as __msprobe__; import torch\nexcept ImportError: pass\n",
        False,
    ),
    "import split off its line in a try body": (
        b"def f():\n    return __msprobe__.neg(x)\ntry:\n    import msprobe_runtime as __msprobe__\n"
        b"    import torch\nexcept ImportError:\n    pass\n",
        False,
    ),
    "import ending a try body": (
        b"try:\n    x = __msprobe__.neg(y)\n    import msprobe_runtime as __msprobe__\nexcept E:\n    pass\n",
        True,
    ),
    "import alone in a try body (libcst raises)": (
        b"try:\n    import msprobe_runtime as __msprobe__\nexcept E:\n    pass\nx = __msprobe__.neg(y)\n",
        True,
    ),
    "a semicolon after the runtime import": (b"import msprobe_runtime as __msprobe__;\ny = __msprobe__.neg(x)\n", True),
}


@pytest.mark.parametrize("name", EDITED)
@pytest.mark.parametrize("with_import", [True, False])
def test_edited_forms_give_the_libcst_result_on_text_or_by_falling_back(name, with_import):
    source, falls_back = EDITED[name]
    if with_import and b"import msprobe_runtime" not in source:
        source = b"import msprobe_runtime as __msprobe__; import os\n" + source
    before = sum(text_restore.FALLBACKS.values())
    result = outcome(api.restore_report, source)
    assert sum(text_restore.FALLBACKS.values()) - before == falls_back
    assert result == outcome(api.restore_report_cst, source)


def outcome(restore, source):
    """What ``restore`` gives: its result, or the type and message of what it raised (the reference raises
    on some hand-made forms, and the fallback must raise the same)."""
    try:
        return restore(source)
    except Exception as error:
        return type(error), str(error)


def test_a_restore_that_breaks_a_form_is_caught():
    # Can fail the other way: the comparison itself must see a wrongly restored operator.
    instrumented = api.rewrite_source(b"import torch\ny = torch.relu(x) + 1\n")
    assert restore_disagreement(instrumented, "m.py") == []
    spellings = dict(text_forms.BINARY, add=b"-")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(text_forms, "BINARY", spellings)
        assert restore_disagreement(instrumented, "m.py") != []


def test_restore_builds_no_libcst_tree(monkeypatch):
    original = generate(20_000)
    instrumented = api.rewrite_source(original)

    def no_libcst(source):
        raise AssertionError("restore parsed with libcst")

    monkeypatch.setattr(api, "restore_report", api.restore_report.__wrapped__)  # conftest's check uses libcst
    monkeypatch.setattr(api.cst, "parse_module", no_libcst)
    assert api.restore_source(instrumented) == original
    with pytest.raises(api.RewriteError, match="parsed with libcst"):  # the patch is in effect
        api.restore_report_cst(instrumented)


def test_a_file_python_cannot_parse_falls_back_to_libcst_and_its_error():
    source = b"import msprobe_runtime as __msprobe__; import torch\ndef f(:\n    pass\n"
    before = text_restore.FALLBACKS["ast: SyntaxError"]
    with pytest.raises(api.RewriteError, match="cannot parse"):
        api.restore_source(source)
    assert text_restore.FALLBACKS["ast: SyntaxError"] == before + 1
