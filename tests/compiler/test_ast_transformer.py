"""The import hook's ast path: for each spelling that decides a rewrite, the tree equals the parsed libcst output.

``test_golden.py`` checks every golden case on this path too and ``test_corpus_invariants.py`` checks every file
of the standard library and megatron-core; the cases here are the spellings that ``ast`` does not keep and the
path reads back from the source text (operator whitespace, parentheses, line breaks, f-string fields).
"""

import ast

import libcst as cst
import pytest

from msprobe_rewrite import ast_transformer, forms
from msprobe_rewrite.api import default_catalogue, rewrite_source
from msprobe_rewrite.ast_transformer import AstCallSiteTransformer, Unsure, _Text, rewrite_to_ast
from msprobe_rewrite.resolver import Resolver
from msprobe_rewrite.scopes import collect_scopes


def libcst_tree(source: bytes) -> str:
    return ast.dump(ast.parse(rewrite_source(source, add_import=False)))


SPELLINGS = [
    # operators: `a+ b` is the one spelling left alone, however the operands are parenthesized or spaced
    "a + b\n",
    "a+ b\n",
    "a +b\n",
    "a+b\n",
    "(a)+ b\n",
    "(a )+ b\n",
    "a+  b\n",
    "a+\\\n b\n",
    "(a +\n b)\n",
    "(a # note + c\n + b)\n",
    "a ** -b\n",
    "x = a @ b\n",
    "a // b\n",
    "a<<b\n",
    "1 + 2\n",
    "'%s' % x\n",
    "'%s' 'b' % x\n",
    "('%s') % x\n",
    "f'{a}' % x\n",
    # unary operators: not with whitespace after them, not on literals
    "-x\n",
    "- x\n",
    "-1\n",
    "~(x)\n",
    "+\\\nx\n",
    "not x\n",
    # comparisons: one comparator, no text literal
    "a < b\n",
    "a<= b\n",
    "a < b < c\n",
    "a < 'x'\n",
    "a == None\n",
    "a != b\n",
    "a in b\n",
    "1 < 2\n",
    # calls: a bare generator, a callee and its parenthesis on two lines, builtins and constants as receivers
    "import torch\ny = torch.relu(x)\n",
    "f(x for x in y)\n",
    "f((x for x in y))\n",
    "f(x for x in y )\n",
    "f\\\n(x)\n",
    "(f\n)(x)\n",
    "(f)(x)\n",
    "print(x)\n",
    "super().f(x)\n",
    "True.__index__()\n",
    "(None\n.method())\n",
    "a.b.c(x)(y)\n",
    "f(*a, k=1, **kw)\n",
    "f(k=1, *a)\n",
    "f[0](x)\n",
    # subscript stores and augmented assignments
    "a[0] = 1\n",
    "(a[0]) = 1\n",
    "x = a[0] = 1\n",
    "x = (a[0]) = 1\n",
    "x = 1; a[0] = 2\n",
    "(a)[0] = 1\n",
    "x += 1\n",
    "x+= 1\n",
    "(x) += 1\n",
    "a.b += 1\n",
    "a . b += 1\n",
    "a.b+= 1\n",
    "(a.b) += 1\n",
    "(a).b += 1\n",
    "a[0] += 1\n",
    "a[0]+= 1\n",
    "a[f(x)] += g(y)\n",
    "x += (1, 2)\n",
    "x += 1, 2\n",
    "x += (1), (2)\n",
    "x += ()\n",
    "x += (y := 2)\n",
    "x[0] += 1, 2\n",
    "x += (\n 1, # )\n 2)\n",
    "x += ('(', 2)\n",
    # zones left as written, scopes
    "def g(a=f(x)) -> h(y):\n    return f(x)\n",
    "@torch.jit.script\ndef g(x):\n    return x + 1\n",
    "class A(f(x), metaclass=m(y)):\n    y = g(x)\n",
    "lambda a=f(x): g(a)\n",
    "[f(x) for x in g(y)]\n",
    "a: int = f(x)\n",
    "a[f(x)]: h(x)\n",
    "match x:\n    case 1 if f(x):\n        g(x)\n",
    "with f(a) as b[g(x)]:\n    pass\n",
    "import torch\ndef f(torch):\n    return torch.relu(x)\n",
    # f-strings: fields, format specs, self-documenting fields, several lines
    "import torch\nf'{torch.relu(x)}'\n",
    "f'{a + b}'\n",
    "f'{ a+ b }'\n",
    "f'x={x+1}'\n",
    "f'{a+b!r}'\n",
    "f'{3*x+15=}'\n",
    "f'{3*x+15 = }'\n",
    "f'{(a+b)=!r:>10}'\n",
    "f'{a+b:{c+d}}'\n",
    "f'{x:{a+b}}'\n",
    'f"""abc\n  {a +b}"""\n',
    "(f'{a}'\n\n  f'''{b}\n {a+b}''')\n",
    'f"{a}" "\\n" f"{a+b}"\n',
    # encodings: positions are UTF-8 columns of the decoded text
    "s = 'é'; y = a+ b + c\n",
    "# -*- coding: latin-1 -*-\ns = '\xe9'; y = a+ b\n",
]


@pytest.mark.parametrize("source", SPELLINGS)
def test_the_ast_path_takes_the_transformers_decision(source):
    data = source.encode("latin-1" if "latin-1" in source else "utf-8")
    tree = rewrite_to_ast(data, default_catalogue())
    assert tree is not None
    assert ast.dump(tree) == libcst_tree(data)


@pytest.mark.parametrize(
    "source",
    [
        b"\xef\xbb\xbfy = a+ b * c\r\n",
        b"y = f(a)\r\n\tz = 1\r\n".replace(b"\tz", b"z"),
        b"y = (a\r\n  + b)\r\nz = -x\r\n",
        b"y = (a\r  + b)\rz = c+ d\r",
    ],
)
def test_byte_order_marks_and_line_endings(source):
    tree = rewrite_to_ast(source, default_catalogue())
    assert tree is not None
    assert ast.dump(tree) == libcst_tree(source)


@pytest.mark.parametrize(
    "source",
    [
        "def f(x):  # msprobe: skip\n    return g(x)\n",  # skip markers are comments, which ast does not keep
        "# msprobe: skip-file\nf(x)\n",
        "import msprobe_runtime as __msprobe__; f(x)\n",  # already instrumented: restored first, by libcst
        "def f(x):\n    return g(x)\n\x0c\ndef h(x):\n    return g(x)\n",  # spellings libcst may not reproduce
        "def f():\n    x += yield\n",
        "import torch\nf\"{f'{torch.relu(x)}'}\"\n",  # which quote is left decides call or dyn
        "def f(:\n",  # invalid: libcst gives the error
    ],
)
def test_what_the_ast_path_leaves_to_libcst(source):
    assert rewrite_to_ast(source.encode(), default_catalogue()) is None


def test_a_field_whose_positions_are_wrong_is_left_to_libcst():
    # Python 3.11 places an f-string field's nodes by searching for its text; where that lands elsewhere,
    # reading the source at those positions would decide on the wrong text.
    text = "y = f'{a+ b}'\n"
    tree = ast.parse(text)
    field = tree.body[0].value.values[0]
    for node in ast.walk(field.value):
        if not hasattr(node, "col_offset"):
            continue
        node.col_offset -= 2
        node.end_col_offset -= 2
    transformer = AstCallSiteTransformer(_Text(text.encode()), collect_scopes(tree), Resolver(default_catalogue()))
    with pytest.raises(Unsure, match="positions are wrong"):
        transformer.visit(tree.body[0])
    # and in place, the same field is decided from the text
    tree = ast.parse(text)
    transformer = AstCallSiteTransformer(_Text(text.encode()), collect_scopes(tree), Resolver(default_catalogue()))
    assert ast.dump(ast.Module(body=[transformer.visit(tree.body[0])], type_ignores=[])) == libcst_tree(text.encode())


def test_operator_tables_spell_and_name_as_the_libcst_tables_do():
    for operator, (entry, spelling) in ast_transformer.BINARY.items():
        parsed = cst.parse_expression(f"a {spelling.decode()} b")
        assert forms.BINARY[type(parsed.operator)] == entry, operator
    for operator, (entry, spelling) in ast_transformer.COMPARISON.items():
        parsed = cst.parse_expression(f"a {spelling.decode()} b")
        assert forms.COMPARISON[type(parsed.comparisons[0].operator)] == entry, operator
    for operator, (entry, spelling) in ast_transformer.AUGMENTED.items():
        parsed = cst.parse_statement(f"a {spelling.decode()} b").body[0]
        assert forms.AUGMENTED[type(parsed.operator)] == entry, operator
    for operator, (entry, spelling) in ast_transformer.UNARY.items():
        parsed = cst.parse_expression(f"{spelling.decode()}a")
        assert forms.UNARY[type(parsed.operator)] == entry, operator
    assert len(ast_transformer.BINARY) == len(forms.BINARY) and len(ast_transformer.UNARY) == len(forms.UNARY)
    assert len(ast_transformer.COMPARISON) == len(forms.COMPARISON)


def test_a_kernel_decorator_and_configured_skips_leave_the_body_alone():
    source = b"import triton\n@triton.jit\ndef k(x):\n    return x + 1\n@my.fuser\ndef m(x):\n    return x * 2\n"
    tree = rewrite_to_ast(source, default_catalogue(), skip_decorators=["my.fuser"])
    assert "__msprobe__" not in ast.dump(tree)
    want = ast.parse(rewrite_source(source, add_import=False, skip_decorators=["my.fuser"]))
    assert ast.dump(tree) == ast.dump(want)


def _call_lines(code):
    """(instruction, line) of every call in ``code`` and the functions it defines, in order."""
    import dis
    import types

    out = []
    for instruction in dis.get_instructions(code):
        if instruction.opname.startswith("CALL"):
            out.append((instruction.opname, instruction.positions.lineno))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out.extend(_call_lines(const))
    return out


_WHERE = """\
import sys


def where(*args):
    frame = sys._getframe(1)
    if frame.f_code.co_name in ("dyn", "call", "neg", "add", "truth"):  # the runtime's shim, when rewritten
        frame = frame.f_back
    return frame.f_lineno


class Box:
    where = staticmethod(where)


def run(box):
    return [
        where(
            1),
        box.where(
            2),
        (
            box
        ).where(3),
    ]
"""


def test_a_call_runs_on_the_line_python_runs_it_on():
    """CPython runs `f(\\n x)` on its first line and `(\\n box\\n).m(x)` on the line of `.m`; under the hook
    the rewritten call runs there too, so its frame's f_lineno (tracebacks, the dump's call site) is the
    user's line."""
    namespace = {}
    exec(compile(_WHERE, "<plain>", "exec"), namespace)
    expected = namespace["run"](namespace["Box"]())
    import msprobe_runtime

    namespace = {"__msprobe__": msprobe_runtime}
    exec(compile(rewrite_to_ast(_WHERE.encode(), default_catalogue()), "<hook>", "exec"), namespace)
    assert b"__msprobe__.dyn(" in rewrite_source(_WHERE.encode())
    assert namespace["run"](namespace["Box"]()) == expected == [17, 19, 23]


@pytest.mark.parametrize(
    "source",
    [
        "import torch\n\ndef f(x):\n    return torch.relu(\n        x +\n        1)\n",
        "def f(m, x):\n    y = m.forward(\n        x,\n    )\n    return -(\n        y)\n",
        "def f(t):\n    if (t.any() and\n            t.all()):\n        return t\n",
    ],
)
def test_a_call_over_several_lines_runs_on_its_first_line_as_in_the_libcst_output(source):
    """`__msprobe__.call` stands on the expression's first line, or a frame's f_lineno (and the dump's call
    site) would name its last line."""
    fast = compile(rewrite_to_ast(source.encode(), default_catalogue()), "<hook>", "exec")
    slow = compile(rewrite_source(source.encode(), add_import=False), "<cli>", "exec")
    assert _call_lines(fast) == _call_lines(slow)
