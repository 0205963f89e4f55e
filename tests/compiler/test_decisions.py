"""The rewrite's rules (msprobe_rewrite/decisions.py) against the trees they name: every zone names real node
classes and fields of libcst and of Python's ast, and each walker reads a literal's kind as the other does."""

import ast
import dataclasses
import sys

import libcst as cst
import pytest

from msprobe_rewrite import decisions
from msprobe_rewrite.ast_transformer import _literal_kind
from msprobe_rewrite.forms import literal_kind


@pytest.mark.parametrize("zone", decisions.ZONES, ids=lambda zone: zone.what)
def test_every_zone_names_real_nodes_and_fields(zone):
    for node, field in zone.cst:
        cls = getattr(cst, node)
        if field is not None:
            assert field in {f.name for f in dataclasses.fields(cls)}
    for node, field in zone.ast:
        cls = getattr(ast, node, None)
        if cls is None:
            assert sys.version_info < (3, 12) and node == "TypeAlias"
            continue
        if field == "type_params" and sys.version_info < (3, 12):
            continue
        assert field in cls._fields, (node, field)


@pytest.mark.parametrize(
    "text, kind",
    [
        ("x", decisions.NOT_LITERAL),
        ("1", decisions.NUMBER),
        ("1.5", decisions.NUMBER),
        ("2j", decisions.NUMBER),
        ("'s'", decisions.TEXT),
        ("b's'", decisions.TEXT),
        ("'a' 'b'", decisions.TEXT),
        ("f'{x}'", decisions.TEXT),
        ("None", decisions.CONSTANT),
        ("True", decisions.CONSTANT),
        ("False", decisions.CONSTANT),
        ("...", decisions.ELLIPSIS),
        ("-1", decisions.NOT_LITERAL),
        ("(1)", decisions.NUMBER),
        ("x.y", decisions.NOT_LITERAL),
    ],
)
def test_both_walkers_read_the_same_literal_kind(text, kind):
    assert literal_kind(cst.parse_expression(text)) == kind
    assert _literal_kind(ast.parse(text, mode="eval").body) == kind


def test_the_rules():
    never = lambda: pytest.fail("asked although the operands decide")  # noqa: E731
    assert not decisions.rewrite_binary("add", decisions.NUMBER, decisions.TEXT, never)
    assert decisions.rewrite_binary("add", decisions.NOT_LITERAL, decisions.NUMBER, never)
    assert not decisions.rewrite_binary("mod", decisions.TEXT, decisions.NOT_LITERAL, lambda: True)
    assert decisions.rewrite_binary("mod", decisions.TEXT, decisions.NOT_LITERAL, lambda: False)
    assert not decisions.rewrite_comparison(2, decisions.NOT_LITERAL, decisions.NOT_LITERAL)
    assert not decisions.rewrite_comparison(1, decisions.NOT_LITERAL, decisions.CONSTANT)
    assert decisions.rewrite_comparison(1, decisions.NOT_LITERAL, decisions.NUMBER)
    assert not decisions.rewrite_unary(decisions.NUMBER)
    assert not decisions.routes_truth_test(decisions.NOT_LITERAL, False, (["Is"], [0, 3]), None)
    assert decisions.routes_truth_test(decisions.NOT_LITERAL, False, (["Lt", "Lt"], [0, 0, 0]), None)
    assert not decisions.routes_truth_test(decisions.NOT_LITERAL, False, None, "TYPE_CHECKING")
    assert decisions.routes_truth_test(decisions.NOT_LITERAL, False, None, "mask")


def test_frozen_parts_are_what_the_rewrite_leaves_alone():
    tree = ast.parse("@deco(a)\ndef f(x: T = d, *args: A, k=kd, **kw: K) -> R:\n    return body\n")
    parts = {ast.unparse(node) for node in decisions.frozen_ast_parts(tree.body[0])}
    assert parts == {"deco(a)", "T", "d", "A", "kd", "K", "R"}
    assert "body" in decisions.ast_fields(tree.body[0]) and "decorator_list" not in decisions.ast_fields(tree.body[0])
