"""``torch._dynamo.explain`` on the 4-block model of fixtures/compiled/cases.py (Linear + GELU + residual, in an
``nn.Sequential``), as written and as rewritten, in this process: the same graphs, breaks and operations, with
collection off and while a debugger collects. Until 2026-12-04 the rewritten model gave 2 graphs and 1 break
where the original gave 1 and 0 (``dyn`` was ``operator.call`` while nothing collected)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("libcst")

import torch._dynamo  # noqa: E402, F811  (binds torch again, as importorskip did)

from msprobe_runtime import PrecisionDebugger  # noqa: E402

from .conftest import CASES_DIR, as_module  # noqa: E402


@pytest.fixture(scope="module")
def models():
    from msprobe_rewrite.api import rewrite_source

    source = (CASES_DIR / "cases.py").read_bytes()
    rewritten = rewrite_source(source, path=str(CASES_DIR / "cases.py"))
    assert rewritten != source
    return as_module(source.decode(), "cases_original"), as_module(rewritten.decode(), "cases_rewritten")


def _explain(namespace):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[namespace["Block"]() for _ in range(4)])
    explained = torch._dynamo.explain(model)(torch.randn(4, namespace["HIDDEN"]))
    return model, (explained.graph_count, explained.graph_break_count, explained.op_count)


@pytest.mark.parametrize("level", [None, "L0", "L1", "mix"])
def test_explain_sees_the_original_program(models, tmp_path, level):
    original, rewritten = models
    torch._dynamo.reset()
    _, expected = _explain(original)
    assert expected[:2] == (1, 0)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level) if level else None
    torch._dynamo.reset()
    if debugger is not None:
        model = torch.nn.Sequential(*[rewritten["Block"]() for _ in range(4)])
        debugger.start(model)
    try:
        _, got = _explain(rewritten)
    finally:
        if debugger is not None:
            debugger.stop()
            debugger.wait()
    assert got == expected
