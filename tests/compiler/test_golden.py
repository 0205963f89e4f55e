"""Golden tests of the transformer: each case is the source before and the exact source after.

Every case also checks the invariants: the output compiles, rewriting it again changes nothing, and
restoring it gives back the input byte for byte, on text exactly as through libcst (``restore_agreement``);
and the import hook's ast path gives the tree of the output without its runtime import, or leaves the case
to libcst where ``AST_PATH_DEFERS`` says it may.
"""

import ast
import os
import re
import sys
from textwrap import dedent

import pytest

from msprobe_rewrite.api import RewriteError, default_catalogue, restore_source, rewrite_source
from msprobe_rewrite.ast_transformer import rewrite_to_ast
from msprobe_runtime.catalogue import load_catalogue

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from restore_agreement import restore_disagreement  # noqa: E402

PREAMBLE = "import msprobe_runtime as __msprobe__; "


def check(before: str, after: str, **options) -> None:
    before, after = dedent(before), dedent(after)
    rewritten = rewrite_source(before.encode(), **options).decode()
    assert rewritten == after
    compile(rewritten, "<golden>", "exec")
    assert rewrite_source(rewritten.encode(), **options).decode() == rewritten
    assert restore_source(rewritten.encode()).decode() == before
    assert restore_disagreement(rewritten.encode(), "<golden>") == []  # the text restore is libcst's, exactly
    check_ast_path(before, **options)


def check_ast_path(before: str, catalogue=None, **options) -> None:
    tree = rewrite_to_ast(before.encode(), catalogue or default_catalogue(), **options)
    if tree is None:
        assert AST_PATH_DEFERS.search(before), "the ast path left a case to libcst for no listed reason"
        return
    want = ast.parse(rewrite_source(before.encode(), catalogue, add_import=False, **options))
    assert ast.dump(tree) == ast.dump(want)


# What the import hook's ast path leaves to libcst: skip markers, `x += yield`, API calls in nested f-strings,
# a parenthesis right after a keyword before an operand of and/or.
AST_PATH_DEFERS = re.compile(r"msprobe:\s*skip|\+= *yield|\{f[\"']|\b(if|not|and|or)\(")


# -- statically resolved APIs, however they were bound --------------------------------------------------


def test_module_attribute_call():
    check(
        """\
        import torch
        y = torch.relu(x)
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch
        y = __msprobe__.call("Torch.relu", torch.relu, x)
        """,
    )


def test_aliases_and_from_imports():
    check(
        """\
        import torch.nn.functional as F
        from torch import relu as r
        from torch.nn import functional
        import torch.distributed as dist
        import torch_npu

        def f(x):
            a = F.gelu(x)
            b = r(a)
            c = functional.silu(b)
            dist.all_reduce(c)
            return torch_npu.npu_rms_norm(c, w)
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch.nn.functional as F
        from torch import relu as r
        from torch.nn import functional
        import torch.distributed as dist
        import torch_npu

        def f(x):
            a = __msprobe__.call("Functional.gelu", F.gelu, x)
            b = __msprobe__.call("Torch.relu", r, a)
            c = __msprobe__.call("Functional.silu", functional.silu, b)
            __msprobe__.call("Distributed.all_reduce", dist.all_reduce, c)
            return __msprobe__.call("NPU.npu_rms_norm", torch_npu.npu_rms_norm, c, w)
        """,
    )


def test_tensor_class_method_and_dotted_import():
    check(
        """\
        import torch.nn.functional
        import torch
        z = torch.Tensor.add(x, y)
        w = torch.nn.functional.gelu(z, approximate="tanh")
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch.nn.functional
        import torch
        z = __msprobe__.call("Tensor.add", torch.Tensor.add, x, y)
        w = __msprobe__.call("Functional.gelu", torch.nn.functional.gelu, z, approximate="tanh")
        """,
    )


def test_custom_catalogue_entry_by_qualified_name():
    check(
        """\
        from megatron.core.fusions.fused_bias_gelu import bias_gelu_impl
        out = bias_gelu_impl(x, bias)
        """,
        """\
        import msprobe_runtime as __msprobe__; from megatron.core.fusions.fused_bias_gelu import bias_gelu_impl
        out = __msprobe__.call("Megatron.bias_gelu_impl", bias_gelu_impl, x, bias)
        """,
    )


def test_user_catalogue_adds_entries(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("custom:\n  mylib.ops.fused_thing: Mine.fused_thing\n")
    check(
        """\
        from mylib.ops import fused_thing
        y = fused_thing(x)
        """,
        """\
        import msprobe_runtime as __msprobe__; from mylib.ops import fused_thing
        y = __msprobe__.call("Mine.fused_thing", fused_thing, x)
        """,
        catalogue=load_catalogue([extra]),
    )


def test_relative_import_resolves_through_the_package():
    check(
        """\
        from .fused_bias_gelu import bias_gelu_impl
        from . import fused_bias_gelu as fbg
        y = bias_gelu_impl(x, b) + fbg.bias_gelu_impl(x, b)
        """,
        """\
        import msprobe_runtime as __msprobe__; from .fused_bias_gelu import bias_gelu_impl
        from . import fused_bias_gelu as fbg
        y = __msprobe__.add(__msprobe__.call("Megatron.bias_gelu_impl", bias_gelu_impl, x, b), __msprobe__.call("Megatron.bias_gelu_impl", fbg.bias_gelu_impl, x, b))
        """,
        package="megatron.core.fusions",
    )


def test_fused_library_entry_points_resolve_however_imported():
    """flash-attn's functions through its package's re-export, TE's GEMM through cpp_extensions' re-export and
    its submodule, apex's autograd Function by ``.apply``; fp8_autocast is no API (a context manager)."""
    check(
        """\
        import flash_attn
        import transformer_engine.pytorch as te
        from flash_attn import flash_attn_func
        from transformer_engine.pytorch.cpp_extensions.gemm import general_gemm
        from apex.normalization.fused_layer_norm import FusedLayerNormAffineFunction
        with te.fp8_autocast(enabled=False):
            o = flash_attn_func(q, k, v, causal=True) + flash_attn.flash_attn_varlen_func(q, k, v, cu, cu, s, s)
            y = te.cpp_extensions.general_gemm(w, x, ws)[0] + general_gemm(w, x, ws)[0]
            z = FusedLayerNormAffineFunction.apply(y, g, b, shape, 1e-5, False)
        """,
        """\
        import msprobe_runtime as __msprobe__; import flash_attn
        import transformer_engine.pytorch as te
        from flash_attn import flash_attn_func
        from transformer_engine.pytorch.cpp_extensions.gemm import general_gemm
        from apex.normalization.fused_layer_norm import FusedLayerNormAffineFunction
        with __msprobe__.dyn(te.fp8_autocast, enabled=False):
            o = __msprobe__.add(__msprobe__.call("FlashAttn.flash_attn_func", flash_attn_func, q, k, v, causal=True), __msprobe__.call("FlashAttn.flash_attn_varlen_func", flash_attn.flash_attn_varlen_func, q, k, v, cu, cu, s, s))
            y = __msprobe__.add(__msprobe__.call("TE.general_gemm", te.cpp_extensions.general_gemm, w, x, ws)[0], __msprobe__.call("TE.general_gemm", general_gemm, w, x, ws)[0])
            z = __msprobe__.call("Apex.FusedLayerNormAffineFunction", FusedLayerNormAffineFunction.apply, y, g, b, shape, 1e-5, False)
        """,
    )


FUSED_LAYER_NORM = """\
    from torch.autograd import Function
    from torch.nn import Module

    class FusedRMSNormAffineFunction(Function):
        pass

    def fused_rms_norm_affine(x, w, shape, eps=1e-6):
        return FusedRMSNormAffineFunction.apply(x, w, shape, eps)

    class FusedRMSNorm(Module):
        def forward(self, x):
            return fused_rms_norm_affine(x, self.weight, self.shape)

        def local(self, x):
            def fused_rms_norm_affine(x):
                return x
            return fused_rms_norm_affine(x)
    """


def test_a_catalogued_function_is_an_api_in_the_module_that_defines_it_too():
    """apex's FusedRMSNorm.forward calls fused_rms_norm_affine of its own file: by the module's name (from the
    file's package and name) it is the catalogued ``apex.normalization.fused_layer_norm.fused_rms_norm_affine``;
    a local function of the same name is not."""
    check(
        FUSED_LAYER_NORM,
        """\
        import msprobe_runtime as __msprobe__; from torch.autograd import Function
        from torch.nn import Module

        class FusedRMSNormAffineFunction(Function):
            pass

        def fused_rms_norm_affine(x, w, shape, eps=1e-6):
            return __msprobe__.dyn(FusedRMSNormAffineFunction.apply, x, w, shape, eps)

        class FusedRMSNorm(Module):
            def forward(self, x):
                return __msprobe__.call("Apex.fused_rms_norm_affine", fused_rms_norm_affine, x, self.weight, self.shape)

            def local(self, x):
                def fused_rms_norm_affine(x):
                    return x
                return fused_rms_norm_affine(x)
        """,
        path="/site/apex/normalization/fused_layer_norm.py",
        package="apex.normalization",
    )


@pytest.mark.parametrize(
    "path, package",
    [
        ("/site/apex/normalization/other.py", "apex.normalization"),  # another module of the package
        ("/site/normalization/fused_layer_norm.py", "normalization"),  # the file imported under another package
        ("<string>", None),  # no file: no module name
    ],
)
def test_a_function_defined_in_another_module_stays_a_plain_call(path, package):
    rewritten = rewrite_source(dedent(FUSED_LAYER_NORM).encode(), path=path, package=package).decode()
    assert "__msprobe__.call(" not in rewritten
    assert "return fused_rms_norm_affine(x, self.weight, self.shape)" in rewritten


def test_star_import_makes_every_free_name_unknown():
    check(
        """\
        from torch import *
        y = relu(x)
        n = len(y)
        class A(B):
            def f(self):
                return super().f(locals())
        """,
        """\
        import msprobe_runtime as __msprobe__; from torch import *
        y = __msprobe__.dyn(relu, x)
        n = __msprobe__.dyn(len, y)
        class A(B):
            def f(self):
                return __msprobe__.dyn(super().f, locals())
        """,
    )


# -- unknown callees go through identity dispatch; known non-APIs are left alone ------------------------


def test_unknown_callees_are_dispatched_at_run_time():
    check(
        """\
        import torch
        class MLP(torch.nn.Module):
            def forward(self, x):
                h = self.linear_fc1(x)
                h = self.activation_func(h)
                return h.transpose(0, 1)
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch
        class MLP(torch.nn.Module):
            def forward(self, x):
                h = __msprobe__.dyn(self.linear_fc1, x)
                h = __msprobe__.dyn(self.activation_func, h)
                return __msprobe__.dyn(h.transpose, 0, 1)
        """,
    )


def test_builtins_stdlib_and_local_definitions_are_left_alone():
    check(
        """\
        import os
        import logging
        logger = logging.getLogger(__name__)

        def helper(x):
            return x

        class Box:
            pass

        def f(x):
            print(len(x), os.path.join("a", "b"))
            logger.info("step")
            return helper(Box())
        """,
        """\
        import os
        import logging
        logger = logging.getLogger(__name__)

        def helper(x):
            return x

        class Box:
            pass

        def f(x):
            print(len(x), os.path.join("a", "b"))
            logger.info("step")
            return helper(Box())
        """,
    )


def test_shadowing_local_is_not_torchs():
    check(
        """\
        from torch import relu

        def f(x, relu=None):
            return relu(x)

        def g(x):
            relu = make()
            return relu(x)

        def h(x):
            return relu(x)
        """,
        """\
        import msprobe_runtime as __msprobe__; from torch import relu

        def f(x, relu=None):
            return __msprobe__.dyn(relu, x)

        def g(x):
            relu = __msprobe__.dyn(make)
            return __msprobe__.dyn(relu, x)

        def h(x):
            return __msprobe__.call("Torch.relu", relu, x)
        """,
    )


def test_global_and_nonlocal():
    check(
        """\
        from torch import relu

        def outer():
            relu = lambda x: x
            def inner(x):
                nonlocal relu
                return relu(x)
            return inner

        def uses_global(x):
            global relu
            return relu(x)
        """,
        """\
        import msprobe_runtime as __msprobe__; from torch import relu

        def outer():
            relu = lambda x: x
            def inner(x):
                nonlocal relu
                return __msprobe__.dyn(relu, x)
            return inner

        def uses_global(x):
            global relu
            return __msprobe__.call("Torch.relu", relu, x)
        """,
    )


def test_class_scope_is_not_visible_from_methods():
    check(
        """\
        import torch

        class A:
            torch = None
            y = torch.relu(x)

            def m(self, x):
                return torch.relu(x)
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch

        class A:
            torch = None
            y = __msprobe__.dyn(torch.relu, x)

            def m(self, x):
                return __msprobe__.call("Torch.relu", torch.relu, x)
        """,
    )


def test_nested_functions_classes_lambdas_and_comprehensions():
    check(
        """\
        import torch

        def outer(xs):
            class Inner:
                def go(self, x):
                    return torch.relu(x)
            act = lambda t: torch.sigmoid(t)
            ys = [torch.tanh(x) for x in xs if torch.any(x)]
            table = {k: torch.abs(v) for k, v in pairs}
            total = sum(torch.sum(x) for x in xs)
            return Inner, act, ys, table, total
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch

        def outer(xs):
            class Inner:
                def go(self, x):
                    return __msprobe__.call("Torch.relu", torch.relu, x)
            act = lambda t: __msprobe__.call("Torch.sigmoid", torch.sigmoid, t)
            ys = [__msprobe__.call("Torch.tanh", torch.tanh, x) for x in __msprobe__.iterate(xs) if __msprobe__.truth(__msprobe__.call("Torch.any", torch.any, x))]
            table = {k: __msprobe__.call("Torch.abs", torch.abs, v) for k, v in __msprobe__.iterate_unpacked(pairs)}
            total = __msprobe__.builtin(sum)(__msprobe__.call("Torch.sum", torch.sum, x) for x in __msprobe__.iterate(xs))
            return Inner, act, ys, table, total
        """,
    )


def test_decorators_defaults_and_annotations_are_untouched():
    check(
        """\
        import torch

        @register(torch.relu(zero))
        def f(x: torch.Tensor = torch.zeros(1), *, scale=2 * k) -> torch.Size:
            y: torch.Tensor = torch.relu(x)
            return y

        class Net(make_base(torch.nn.Module), metaclass=pick(torch)):
            pass
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch

        @register(torch.relu(zero))
        def f(x: torch.Tensor = torch.zeros(1), *, scale=2 * k) -> torch.Size:
            y: torch.Tensor = __msprobe__.call("Torch.relu", torch.relu, x)
            return y

        class Net(make_base(torch.nn.Module), metaclass=pick(torch)):
            pass
        """,
    )


def test_custom_operators_are_dispatched_for_the_runtime_to_name_by_namespace():
    # config.json's custom_op_namespaces is read at run time: torch.ops calls are dyn as any unknown callee, and
    # a @custom_op function (a CustomOpDef, not a plain def) is too, where a plain def's call is left alone
    check(
        """\
        import torch
        from torch.library import custom_op

        @custom_op("mylib::scaled", mutates_args=())
        def scaled(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @torch.library.triton_op("mylib::fused", mutates_args=())
        def fused(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @functools.cache
        def helper(x):
            return x

        def f(x):
            y = torch.ops.mylib.scaled(x)
            y = torch.ops.mylib.scaled.default(y)
            return helper(fused(scaled(y)))
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch
        from torch.library import custom_op

        @custom_op("mylib::scaled", mutates_args=())
        def scaled(x: torch.Tensor) -> torch.Tensor:
            return __msprobe__.dyn(x.clone)

        @torch.library.triton_op("mylib::fused", mutates_args=())
        def fused(x: torch.Tensor) -> torch.Tensor:
            return __msprobe__.dyn(x.clone)

        @functools.cache
        def helper(x):
            return x

        def f(x):
            y = __msprobe__.dyn(torch.ops.mylib.scaled, x)
            y = __msprobe__.dyn(torch.ops.mylib.scaled.default, y)
            return helper(__msprobe__.dyn(fused, __msprobe__.dyn(scaled, y)))
        """,
    )


def test_async_await_and_async_comprehensions():
    check(
        """\
        import torch

        async def f(stream, x):
            y = await fetch(x)
            async with guard():
                async for item in stream:
                    y = torch.add(y, item)
            return [torch.relu(t) async for t in stream]
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch

        async def f(stream, x):
            y = await __msprobe__.dyn(fetch, x)
            async with __msprobe__.dyn(guard):
                async for item in stream:
                    y = __msprobe__.call("Torch.add", torch.add, y, item)
            return [__msprobe__.call("Torch.relu", torch.relu, t) async for t in stream]
        """,
    )


def test_walrus_and_match():
    check(
        """\
        import torch

        def f(x, cmd):
            if (n := torch.numel(x)) > 4:
                pass
            match cmd:
                case Point(x=0) if torch.is_tensor(x):
                    return n
                case [first, *rest]:
                    return first
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch

        def f(x, cmd):
            if __msprobe__.truth(__msprobe__.gt((n := __msprobe__.dyn(torch.numel, x)), 4)):
                pass
            match cmd:
                case Point(x=0) if __msprobe__.truth(__msprobe__.dyn(torch.is_tensor, x)):
                    return n
                case [first, *rest]:
                    return first
        """,
    )


def test_fstrings_pick_a_quote_that_does_not_close_them():
    check(
        """\
        import torch
        a = f"{torch.relu(x)}"
        b = f'{torch.relu(x)!r:>10}'
        c = f"{f'{torch.relu(x)}'}"
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch
        a = f"{__msprobe__.call('Torch.relu', torch.relu, x)}"
        b = f'{__msprobe__.call("Torch.relu", torch.relu, x)!r:>10}'
        c = f"{f'{__msprobe__.dyn(torch.relu, x)}'}"
        """,
    )


def test_self_documenting_fstring_fields_print_their_text_so_stay_as_written():
    # f"{x*2=}" prints "x*2=" and the value: a rewritten field would print the rewrite instead.
    check(
        """\
        import torch
        a = f"{torch.relu(x)=} {x * 2 = !r} {x * 2}"
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch
        a = f"{torch.relu(x)=} {x * 2 = !r} {__msprobe__.mul(x, 2)}"
        """,
    )


PYTHON_312_TYPES = """\
type Pair = tuple[int, int] | None
def f[T: int | str, *Ts](x: T) -> T:
    return x + 1
class C[T: (A | B)](Base):
    y = g(x)
"""


@pytest.mark.skipif(sys.version_info < (3, 12), reason="type parameters are Python 3.12 syntax")
def test_type_parameters_and_aliases_are_left_as_written_as_annotations_are():
    check(
        PYTHON_312_TYPES,
        PREAMBLE + PYTHON_312_TYPES.replace("x + 1", "__msprobe__.add(x, 1)").replace("g(x)", "__msprobe__.dyn(g, x)"),
    )


# -- operators ------------------------------------------------------------------------------------------


def test_binary_and_unary_operators_keep_their_spelling_in_the_commas():
    check(
        """\
        import torch
        def f(a, b):
            c = a + b
            d = a*b
            e = (a @ b) ** 2
            g = -a + ~b
            h = a +b
            i = (a
                 - b)
            return 1 + 2, "x" + "y", "%s" % a, -1, a+ b, - a, not a
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch
        def f(a, b):
            c = __msprobe__.add(a, b)
            d = __msprobe__.mul(a,b)
            e = __msprobe__.pow((__msprobe__.matmul(a, b)), 2)
            g = __msprobe__.add(__msprobe__.neg(a), __msprobe__.invert(b))
            h = __msprobe__.add(a ,b)
            i = (__msprobe__.sub(a
                 , b))
            return 1 + 2, "x" + "y", "%s" % a, -1, a+ b, - a, not __msprobe__.truth(a)
        """,
    )


def test_comparisons_single_chained_and_identity():
    check(
        """\
        import torch
        def f(a, b, c):
            x = a == b
            y = a < b < c
            z = a is b, a in b, a != None, name == "main"
            return x if a >= 0 else y
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch
        def f(a, b, c):
            x = __msprobe__.eq(a, b)
            y = a < b < c
            z = a is b, a in b, a != None, name == "main"
            return x if __msprobe__.truth(__msprobe__.ge(a, 0)) else y
        """,
    )


def test_truth_tests_call_bool_through_the_runtime_once_each():
    """`if t:`, `while`, `assert`, conditional expressions, comprehension and match guards, and `not` each call
    bool() once: `truth(t)` is that call. In a test position CPython tests each operand of `and`/`or`/`not`
    on its own (short-circuiting), so each operand is routed; elsewhere `not` tests its whole operand."""
    check(
        """\
        import torch

        def f(t, mask, xs, a, b, cmd):
            if mask.all():
                pass
            elif not t:
                pass
            while a and b or not (a and t):
                break
            assert t, "message"
            y = 1 if t else 2
            z = [x for x in xs if x]
            w = not (a and b)
            u = a and b
            match cmd:
                case 1 if not t:
                    pass
            if (a and
                    b):
                pass
            return a < b < t if a < b < t else None
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch

        def f(t, mask, xs, a, b, cmd):
            if __msprobe__.truth(__msprobe__.dyn(mask.all)):
                pass
            elif not __msprobe__.truth(t):
                pass
            while __msprobe__.truth(a) and __msprobe__.truth(b) or not (__msprobe__.truth(a) and __msprobe__.truth(t)):
                break
            assert __msprobe__.truth(t), "message"
            y = 1 if __msprobe__.truth(t) else 2
            z = [x for x in __msprobe__.iterate(xs) if __msprobe__.truth(x)]
            w = not __msprobe__.truth((a and b))
            u = a and b
            match cmd:
                case 1 if not __msprobe__.truth(t):
                    pass
            if (__msprobe__.truth(a) and
                    __msprobe__.truth(b)):
                pass
            return a < b < t if __msprobe__.truth(a < b < t) else None
        """,
    )


def test_truth_tests_that_no_tensor_takes_part_in_or_that_no_form_restores_are_left_alone():
    source = """\
        import typing
        from typing import TYPE_CHECKING

        def f(t, x, a):
            if TYPE_CHECKING or typing.TYPE_CHECKING or __debug__:
                pass
            if x is None or x in (1, 2) or t == "name" or not x is None:
                pass
            while True:
                break
            if(t):
                pass
            assert(t)
            y = 1 if(t) else 2
            return not(t)
        """
    assert rewrite_source(dedent(source).encode()) == dedent(source).encode()
    check_ast_path(source)


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nif(a and b):\n    pass\n",
        "import torch\nif not(a and b):\n    pass\n",
        "import torch\nif a and(b or c):\n    pass\n",
    ],
)
def test_a_parenthesis_right_after_a_keyword_before_and_or_is_left_to_libcst(source):
    """Whose parenthesis it is (the operation's or its first operand's) decides whether libcst routes the
    operand; ast does not keep it, so the ast path defers."""
    assert rewrite_to_ast(source.encode(), default_catalogue()) is None
    rewritten = rewrite_source(source.encode())
    assert b"__msprobe__.truth(" in rewritten and restore_source(rewritten) == source.encode()
    compile(rewritten, "<golden>", "exec")


def test_augmented_assignments_evaluate_target_once():
    check(
        """\
        import torch
        def f(obj, k, v, t):
            t += v
            t @= v
            obj.total -= v
            obj[k] *= v
            obj[k][1:2, ...] //= v
            obj.a.b |= v; t **= 2
            t += 1, 2
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch
        def f(obj, k, v, t):
            t = __msprobe__.iadd(t, v)
            t = __msprobe__.imatmul(t, v)
            __msprobe__.aug(__msprobe__.attr(obj, "total"), "isub", v)
            __msprobe__.aug(__msprobe__.item(obj)[k], "imul", v)
            __msprobe__.aug(__msprobe__.item(obj[k])[1:2, ...], "ifloordiv", v)
            __msprobe__.aug(__msprobe__.attr(obj.a, "b"), "ior", v); t = __msprobe__.ipow(t, 2)
            t += 1, 2
        """,
    )


def test_subscript_stores_go_through_the_runtime_in_pythons_order():
    check(
        """\
        import torch
        def f(x, k, v, d):
            x[k] = v
            a = x[1:2, ...] = d["a"] = v
            x.attr = v
            (y, x[0]) = v
            del x[k]
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch
        def f(x, k, v, d):
            __msprobe__.item(x)[k] = v
            a = __msprobe__.item(x)[1:2, ...] = __msprobe__.item(d)["a"] = v
            x.attr = v
            (y, x[0]) = __msprobe__.iterate(v)
            del x[k]
        """,
    )


def test_subscript_store_evaluates_value_container_and_key_once_in_order():
    source = dedent(
        """\
        log = []
        def note(tag, value):
            log.append(tag)
            return value
        store = {}
        note("container", store)[note("key", "k")] = note("value", 1)
        """
    )
    namespace = {}
    exec(compile(rewrite_source(source.encode()), "<order>", "exec"), namespace)
    assert namespace["log"] == ["value", "container", "key"] and namespace["store"] == {"k": 1}


# -- what is never touched ------------------------------------------------------------------------------


def test_kernel_and_compiled_bodies_stay_plain_however_imported():
    check(
        """\
        import torch
        import triton
        import tilelang.language as T
        from megatron.core.jit import jit_fuser
        from megatron.core.utils import jit as reexported_jit

        @torch.jit.script
        def a(x):
            return torch.relu(x) + 1

        @torch.compile(mode="max-autotune")
        def b(x):
            return torch.relu(x)

        @triton.jit
        def c(x_ptr):
            return x_ptr + 1

        @jit_fuser
        def d(x):
            return torch.relu(x)

        @T.prim_func
        def e(A):
            return A + 1

        @reexported_jit
        def g(x):
            return x * 2

        def plain(x):
            return torch.relu(x)
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch
        import triton
        import tilelang.language as T
        from megatron.core.jit import jit_fuser
        from megatron.core.utils import jit as reexported_jit

        @torch.jit.script
        def a(x):
            return torch.relu(x) + 1

        @torch.compile(mode="max-autotune")
        def b(x):
            return torch.relu(x)

        @triton.jit
        def c(x_ptr):
            return x_ptr + 1

        @jit_fuser
        def d(x):
            return torch.relu(x)

        @T.prim_func
        def e(A):
            return A + 1

        @reexported_jit
        def g(x):
            return x * 2

        def plain(x):
            return __msprobe__.call("Torch.relu", torch.relu, x)
        """,
    )


def test_configured_decorators_are_skipped_too():
    check(
        """\
        import torch
        from mylib import my_kernel

        @my_kernel
        def k(x):
            return torch.relu(x)
        """,
        """\
        import torch
        from mylib import my_kernel

        @my_kernel
        def k(x):
            return torch.relu(x)
        """,
        skip_decorators=["mylib.my_kernel"],
    )


def test_zero_argument_super_stays_zero_argument():
    check(
        """\
        from base import Base
        class A(Base):
            def __init__(self):
                super().__init__()
                super(A, self).reset()
        """,
        """\
        import msprobe_runtime as __msprobe__; from base import Base
        class A(Base):
            def __init__(self):
                __msprobe__.dyn(super().__init__)
                __msprobe__.dyn(super(A, self).reset)
        """,
    )


def test_opt_out_markers():
    check(
        """\
        import torch

        # msprobe: skip
        def a(x):
            return torch.relu(x)

        def b(x):  # msprobe: skip
            return torch.relu(x)

        def c(x):
            return torch.relu(x)
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch

        # msprobe: skip
        def a(x):
            return torch.relu(x)

        def b(x):  # msprobe: skip
            return torch.relu(x)

        def c(x):
            return __msprobe__.call("Torch.relu", torch.relu, x)
        """,
    )
    source = "# msprobe: skip-file\nimport torch\ny = torch.relu(x)\n"
    assert rewrite_source(source.encode()).decode() == source


def test_patched_callee_is_still_evaluated_at_call_time():
    """`dist.all_reduce = spy` later still reaches the spy: the callee expression stays in the call."""
    source = dedent(
        """\
        import torch.distributed as dist
        def reduce(t):
            return dist.all_reduce(t)
        """
    )
    namespace = {}
    exec(compile(rewrite_source(source.encode()), "<patched>", "exec"), namespace)
    import torch.distributed as dist

    original = dist.all_reduce
    seen = []
    try:
        dist.all_reduce = lambda t: seen.append(t) or "spy"
        assert namespace["reduce"](7) == "spy"
    finally:
        dist.all_reduce = original
    assert seen == [7]


# -- where the runtime import goes ----------------------------------------------------------------------


def test_import_follows_docstring_and_future_imports():
    check(
        '''\
        """Module docstring."""
        from __future__ import annotations
        import torch
        y = torch.relu(x)
        ''',
        '''\
        """Module docstring."""
        from __future__ import annotations
        import msprobe_runtime as __msprobe__; import torch
        y = __msprobe__.call("Torch.relu", torch.relu, x)
        ''',
    )


def test_import_uses_a_blank_line_before_a_compound_statement():
    check(
        """\
        #!/usr/bin/env python
        # -*- coding: utf-8 -*-

        if cond():
            y = torch_fn(x)
        """,
        """\
        #!/usr/bin/env python
        # -*- coding: utf-8 -*-
        import msprobe_runtime as __msprobe__
        if __msprobe__.truth(__msprobe__.dyn(cond)):
            y = __msprobe__.dyn(torch_fn, x)
        """,
    )


def test_import_joins_the_docstring_line_when_nothing_else_is_free():
    check(
        '''\
        """Doc."""
        class A:
            y = f(x)
        ''',
        '''\
        """Doc."""; import msprobe_runtime as __msprobe__
        class A:
            y = __msprobe__.dyn(f, x)
        ''',
    )


def test_import_goes_past_defs_and_into_try_bodies():
    check(
        """\
        def helper(x):
            return f(x)
        try:
            import torch
        except ImportError:
            torch = None
        """,
        """\
        def helper(x):
            return __msprobe__.dyn(f, x)
        try:
            import msprobe_runtime as __msprobe__; import torch
        except ImportError:
            torch = None
        """,
    )


def test_no_line_for_the_import_is_a_clear_error():
    with pytest.raises(RewriteError, match="no existing line"):
        rewrite_source(b"class A:\n    y = f(x)\n")


def test_untouched_file_is_returned_as_is():
    source = b"import os\nprint(os.getcwd())\n"
    assert rewrite_source(source) == source


def test_unparsable_source_is_a_rewrite_error():
    with pytest.raises(RewriteError, match="cannot parse|not valid Python"):
        rewrite_source(b"def f(:\n")


def test_restore_after_a_formatter_split_the_import_off_the_first_line_is_exact():
    # black puts each statement of `import msprobe_runtime as __msprobe__; import torch` on a line of its own;
    # restore takes that whole line away (no placement ever leaves the import alone before a simple statement).
    before = dedent("""\
        \"\"\"Doc.\"\"\"
        import torch
        y = torch.relu(x)
        """)
    instrumented = dedent("""\
        \"\"\"Doc.\"\"\"
        import msprobe_runtime as __msprobe__; import torch
        y = __msprobe__.call("Torch.relu", torch.relu, x)
        """)
    formatted = dedent("""\
        \"\"\"Doc.\"\"\"
        import msprobe_runtime as __msprobe__
        import torch
        y = __msprobe__.call("Torch.relu", torch.relu, x)
        """)
    assert rewrite_source(before.encode()).decode() == instrumented
    assert restore_source(formatted.encode()).decode() == before


def test_iterating_goes_through_the_runtime_where_a_tensor_may_be_iterated():
    """``for``, a comprehension's ``for`` and an unpacking assignment call iter() on their value, which for a
    tensor runs ``Tensor.unbind``; builtins that iterate or run tensor methods are called through
    ``builtin``. Left as written: literals, displays, builtins whose result is never a tensor (and, for a
    target that unpacks each item, whose items never are), ``in(t)``, ``async for``, a bare tuple, a yield."""
    check(
        """\
        import torch
        from helpers import shards

        def f(t, ts, pairs, sizes):
            for row in t:
                pass
            for i in range(3):
                pass
            for h, w in sizes:
                pass
            for i, row in enumerate(t):
                pass
            for a, b in zip(t, ts):
                pass
            for a, b in [(1, 2), (3, 4)]:
                pass
            for a, b in "ab", "cd":
                pass
            for x in(t):
                pass
            for x in (t):
                pass
            a, b = t
            first, *rest = shards(t)
            a, b = b, a
            c = [x * 2 for x in t for y in x]
            total = sum(x for x in ts)
            largest = max(ts, key=len)
            return list(t), abs(t), len(t), print(t)

        async def g(stream, t):
            async for x in stream:
                pass
            a, b = (yield)
            a, b = await t

        def h(t):
            def sum(values):
                return 0
            return sum(t)
        """,
        """\
        import msprobe_runtime as __msprobe__; import torch
        from helpers import shards

        def f(t, ts, pairs, sizes):
            for row in __msprobe__.iterate(t):
                pass
            for i in range(3):
                pass
            for h, w in __msprobe__.iterate_unpacked(sizes):
                pass
            for i, row in __msprobe__.builtin(enumerate)(t):
                pass
            for a, b in __msprobe__.builtin(zip)(t, ts):
                pass
            for a, b in [(1, 2), (3, 4)]:
                pass
            for a, b in "ab", "cd":
                pass
            for x in(t):
                pass
            for x in __msprobe__.iterate((t)):
                pass
            a, b = __msprobe__.iterate(t)
            first, *rest = __msprobe__.iterate(__msprobe__.dyn(shards, t))
            a, b = b, a
            c = [__msprobe__.mul(x, 2) for x in __msprobe__.iterate(t) for y in __msprobe__.iterate(x)]
            total = __msprobe__.builtin(sum)(x for x in __msprobe__.iterate(ts))
            largest = __msprobe__.builtin(max)(ts, key=len)
            return __msprobe__.builtin(list)(t), __msprobe__.builtin(abs)(t), len(t), print(t)

        async def g(stream, t):
            async for x in stream:
                pass
            a, b = (yield)
            a, b = __msprobe__.iterate(await t)

        def h(t):
            def sum(values):
                return 0
            return sum(t)
        """,
    )
