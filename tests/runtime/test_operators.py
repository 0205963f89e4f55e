"""The operator table (runtime/operators.py) against what it describes: Python's and libcst's syntax trees, and
what torch reports to ``__torch_function__``; and the rule it exists for: a rewritten operator records at
least what the observing mode records for the same operation, under a catalogued name."""

import ast
import glob
import importlib.util
import json
import operator

import pytest

torch = pytest.importorskip("torch")
cst = pytest.importorskip("libcst")

from torch.overrides import TorchFunctionMode  # noqa: E402

from msprobe_runtime import PrecisionDebugger, operators, shims  # noqa: E402
from msprobe_runtime.identity import build_identity  # noqa: E402

BITWISE = {"lshift", "rshift", "and_", "or_", "xor", "invert"}


def _spell(row):
    if row.kind == operators.UNARY:
        return f"{row.spelling}a"
    if row.kind == operators.AUGMENTED:
        return f"a {row.spelling} b"
    return f"a {row.spelling} b"


@pytest.mark.parametrize("row", [r for r in operators.TABLE if r.kind != operators.STORE], ids=lambda r: r.entry)
def test_node_classes_and_spelling_are_those_of_the_parsers(row):
    source = _spell(row)
    statement = ast.parse(source).body[0]
    if row.kind == operators.AUGMENTED:
        assert type(statement.op).__name__ == row.ast_node
        assert type(cst.parse_statement(source).body[0].operator).__name__ == row.cst_node
        return
    node = statement.value
    op = node.ops[0] if row.kind == operators.COMPARISON else node.op
    assert type(op).__name__ == row.ast_node
    expression = cst.parse_expression(source)
    if row.kind == operators.COMPARISON:
        assert type(expression.comparisons[0].operator).__name__ == row.cst_node
    else:
        assert type(expression.operator).__name__ == row.cst_node
    assert hasattr(shims, row.entry) and hasattr(operator, row.entry)


class _Reported(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _operands(row):
    if row.entry in BITWISE or row.entry in ("ilshift", "irshift", "iand", "ior", "ixor"):
        return torch.tensor([3, 5]), torch.tensor([1, 2]), 2
    return torch.tensor([3.0, 5.0]), torch.tensor([1.0, 2.0]), 2.0


def _first_reported(run):
    mode = _Reported()
    with mode:
        try:
            run()
        except TypeError:
            pass  # `2 @ t`: torch reports the reflected method, then refuses the scalar
    return mode.names[0] if mode.names else None


@pytest.mark.parametrize("row", operators.TABLE, ids=lambda r: r.entry)
def test_reported_methods_are_what_torch_reports(row):
    a, b, scalar = _operands(row)
    python_op = getattr(operator, row.entry)
    if row.kind == operators.UNARY:
        assert _first_reported(lambda: python_op(a)) == row.reported
        return
    if row.kind == operators.STORE:
        value = b[0]
        assert _first_reported(lambda: python_op(a, 0, value)) == row.reported
        return
    assert _first_reported(lambda: python_op(a, b)) == row.reported
    assert _first_reported(lambda: python_op(scalar, b)) == row.reported_reflected


def test_the_rows_define_every_shim_and_nothing_else():
    entries = [row.entry for row in operators.TABLE]
    assert len(entries) == len(set(entries))
    import msprobe_runtime

    routed = [row.entry for row in operators.TABLE if row.kind != operators.STORE]
    # one Python shim per entry, the same object whether or not a debugger collects: torch.compile guards on
    # the identity of what it traces (tests/compile)
    for entry in routed:
        assert getattr(msprobe_runtime, entry) is getattr(shims, entry) is shims.OPERATOR_ENTRIES[entry]
    assert sorted(shims.OPERATOR_ENTRIES) == sorted(routed)
    assert msprobe_runtime.dyn is shims.dyn and msprobe_runtime.truth is shims.truth


def test_every_operator_has_a_catalogued_name_where_torch_reports_one():
    """``-x`` is Tensor.neg and ``x /= y`` Tensor.div_ (neither dunder is in msprobe's list); an operator is
    left unnamed only where neither its method nor torch's report is catalogued (as the mode leaves it)."""
    _, tensor_methods = build_identity()
    names = operators.dump_names(tensor_methods)
    assert names["neg"][0] == "Tensor.neg"
    assert names["itruediv"][0] == "Tensor.div_"
    assert names["truediv"] == ("Tensor.__truediv__", "Tensor.__rdiv__")
    assert names["and_"][1] == "Tensor.bitwise_and"
    for row in operators.TABLE:
        left, right = names[row.entry]
        assert (left is None) == (row.dunder not in tensor_methods and row.reported not in tensor_methods)
        candidates = (row.reflected, row.reported_reflected)
        assert (right is None) == all(c is None or c not in tensor_methods for c in candidates)


_PROGRAM = """
import torch


def operators(x, y, i, j):
    out = [-x, +x, ~i, x + y, x - y, x * y, x @ y, x / y, x // y, x % y, x ** y, i << j, i >> j, i & j, i | j,
           i ^ j, x < y, x <= y, x > y, x >= y, x == y, x != y, 2 / x, 2 - x, 2 & i]
    z = x.clone()
    z += y
    z -= y
    z *= y
    z /= y
    z //= y
    z %= y
    z **= y
    k = i.clone()
    k <<= j
    k >>= j
    k &= j
    k |= j
    k ^= j
    out += [z, k]
    return out
"""


def _names(tmp_path, tag, instrumented, program=_PROGRAM):
    from msprobe_rewrite.api import rewrite_source

    source = program.encode()
    path = tmp_path / f"program_{tag}.py"
    path.write_bytes(rewrite_source(source) if instrumented else source)
    spec = importlib.util.spec_from_file_location(f"program_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x, y = torch.tensor([1.5, 2.5]), torch.tensor([0.5, 1.5])
    i, j = torch.tensor([6, 3]), torch.tensor([1, 2])
    debugger = PrecisionDebugger(dump_path=str(tmp_path / f"dump_{tag}"), level="L1")
    debugger.start()  # from this uninstrumented test: the plain program is observed by the mode
    try:
        module.operators(x, y, i, j)
    finally:
        debugger.stop()
    debugger.wait()
    [dump] = glob.glob(str(tmp_path / f"dump_{tag}" / "step0" / "*" / "dump.json"))
    with open(dump) as handle:
        return [name.rsplit(".", 2)[0] for name in json.load(handle)["data"] if name.endswith(".forward")]


def test_rewritten_operators_record_no_less_than_the_mode(tmp_path):
    observed = _names(tmp_path, "plain", instrumented=False)
    rewritten = _names(tmp_path, "rewritten", instrumented=True)
    assert "Tensor.neg" in rewritten and "Tensor.div_" in rewritten and "Tensor.bitwise_and" in rewritten
    assert len(rewritten) >= len(observed)
    # `2 & i`: Python calls the tensor's __rand__, which msprobe does not list; the rewrite names it by what
    # torch reports (bitwise_and), the mode by the bytecode's operator (&). Every other name is the same, in
    # the same order, reflected ones included.
    assert [{"Tensor.bitwise_and": "Tensor.__and__"}.get(n, n) for n in rewritten] == observed


_TRUTH_PROGRAM = """
import torch


def operators(x, y, i, j):
    found = 0
    if x.sum() > 0:
        found += 1
    if not (x < 0).any() and i.all():
        found += 1
    while not x.isnan().any() and found < 3:
        found += 1
    assert x.numel(), "empty"
    ys = [v for v in y if v]
    w = not y.any()
    z = found if torch.all(i > 0) else 0
    return found, ys, w, z
"""


def test_rewritten_truth_tests_record_what_the_mode_records(tmp_path):
    """`if t:`, `not t`, `while`, `assert`, comprehension and conditional tests: Tensor.__bool__ once per test,
    as the observing mode records it in the same program left uninstrumented."""
    observed = _names(tmp_path, "plain", instrumented=False, program=_TRUTH_PROGRAM)
    rewritten = _names(tmp_path, "rewritten", instrumented=True, program=_TRUTH_PROGRAM)
    assert rewritten.count("Tensor.__bool__") >= 8
    # iterating a tensor (`for v in y`) is no call site: the session's mode records it in both programs
    assert rewritten == observed


def test_nb_names_are_those_of_the_bytecode():
    """The observing mode names `a + b` in uninstrumented code from the BINARY_OP instruction (CPython 3.11+):
    each binary row's nb_name and spelling are the interpreter's."""
    import dis

    nb_ops = dict(getattr(dis, "_nb_ops", ()))
    if not nb_ops:
        pytest.skip("no BINARY_OP before CPython 3.11")
    for row in operators.rows(operators.BINARY):
        assert nb_ops[f"NB_{row.nb_name}"] == row.spelling
        assert nb_ops[f"NB_INPLACE_{row.nb_name}"] == operators.INPLACE_OF[row.entry].spelling
    from msprobe_runtime.module_tracking import _OPERATOR_CODES

    binary = _OPERATOR_CODES[1]
    dunders = {row.dunder for row in operators.rows(operators.BINARY, operators.AUGMENTED)}
    assert set(binary.values()) == dunders


def test_the_coverage_oracles_pair_operator_names_by_the_table():
    """fixtures/oracle_sites.same_api, which the real-model coverage tests use, reads the operator table."""
    from fixtures.oracle_sites import same_api

    assert same_api("Tensor.div", "Tensor.__truediv__") and same_api("Tensor.sub_", "Tensor.__isub__")
    assert same_api("Tensor.remainder", "Tensor.__mod__") and same_api("Tensor.gt", "Tensor.__gt__")
    assert same_api("Tensor.add", "Tensor.__radd__") and same_api("Tensor.neg", "Tensor.neg")
    assert not same_api("Tensor.add", "Tensor.__mul__") and not same_api("Torch.div", "Tensor.__truediv__")
