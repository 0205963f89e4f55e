"""``msprobe-rewrite run``: run a script or module like ``python`` does, with the import hook installed.

``msprobe-rewrite run [--packages a,b] [--catalogue FILE] -- train.py args...`` and
``msprobe-rewrite run [...] -m package.module args...`` behave as ``python train.py args...`` and
``python -m package.module args...`` (the same ``sys.argv``, ``sys.path[0]``, ``__main__`` and exit code), with
the script itself, the modules beside it, and the named packages instrumented as they are imported. It works
as the program that ``torchrun`` starts: ``torchrun --nproc-per-node 2 -m msprobe_rewrite run -- train.py``.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import types
from typing import List, Optional, Sequence

from .markers import RUNTIME_NAME

USAGE = (
    "msprobe-rewrite run [--packages PKG[,PKG...]] [--catalogue FILE] [--skip-decorator NAME] "
    "(-- script.py | -m module) [args...]"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="msprobe-rewrite run", usage=USAGE, description="Run a Python program with its imports instrumented."
    )
    parser.add_argument(
        "--packages",
        action="append",
        default=[],
        metavar="PKG[,PKG...]",
        help="instrument these packages (by name prefix) as they are imported; $MSPROBE_REWRITE_PACKAGES adds more",
    )
    parser.add_argument(
        "--catalogue",
        action="append",
        default=[],
        metavar="FILE",
        help="catalogue YAML files added to the shipped one; repeatable",
    )
    parser.add_argument(
        "--skip-decorator",
        action="append",
        default=[],
        metavar="NAME",
        help="leave the bodies of functions with this decorator uninstrumented; repeatable",
    )
    return parser


def _split(argv: Sequence[str]):
    """(our options, '-m' module or None, script or None, program arguments)."""
    argv = list(argv)
    for index, arg in enumerate(argv):
        if arg == "--":
            rest = argv[index + 1 :]
            if rest[:1] == ["-m"]:
                return argv[:index], (rest[1] if len(rest) > 1 else None), None, rest[2:]
            return argv[:index], None, (rest[0] if rest else None), rest[1:]
        if arg == "-m":
            return argv[:index], (argv[index + 1] if index + 1 < len(argv) else None), None, argv[index + 2 :]
        if not arg.startswith("-") and (
            index == 0 or argv[index - 1] not in ("--packages", "--catalogue", "--skip-decorator")
        ):
            return argv[:index], None, arg, argv[index + 1 :]
    return argv, None, None, []


def _exit_code(exit_: SystemExit) -> int:
    code = exit_.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _report(error: BaseException, is_users_frame) -> None:
    """Print a traceback as ``python`` would: from the user's first frame, not from this launcher."""
    tb = error.__traceback__
    while tb is not None and not is_users_frame(tb.tb_frame):
        tb = tb.tb_next
    tb = tb or error.__traceback__
    sys.excepthook(type(error), error.with_traceback(tb), tb)


def _run_script(script: str, args: List[str], hook_options) -> int:
    import msprobe_runtime

    from .import_hook import install_import_hook, instrumented_code

    if not os.path.exists(script):
        print(f"msprobe-rewrite run: can't open file {script!r}: no such file", file=sys.stderr)
        return 2
    # python names a script's code and __file__ by its absolute path (3.9+), as stack.json and tracebacks
    # then do; argv[0] stays as typed (tests/runtime/test_tool_frames.py)
    path = os.path.abspath(script)
    directory = os.path.dirname(path)
    sys.path[0] = directory
    hook = install_import_hook(
        hook_options["packages"],
        paths=[directory],
        catalogue_files=hook_options["catalogue"],
        skip_decorators=hook_options["skip_decorators"],
    )
    catalogue, _ = hook.finder.options.prepare()
    with open(script, "rb") as handle:
        source = handle.read()
    try:
        code = instrumented_code(source, path, "", catalogue, hook_options["skip_decorators"])
    except Exception as error:
        from .api import RewriteError

        if not isinstance(error, RewriteError):
            raise
        print(f"msprobe-rewrite run: running {script} uninstrumented: {error}", file=sys.stderr)
        code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __builtins__=__builtins__,
        __cached__=None,
        __spec__=None,
        __package__=None,
        **{RUNTIME_NAME: msprobe_runtime},
    )
    main.__loader__ = None
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    sys.argv = [script, *args]
    try:
        exec(code, main.__dict__)
    except SystemExit as exit_:
        return _exit_code(exit_)
    except Exception as error:
        _report(error, lambda frame: frame.f_code.co_filename == path)
        return 1
    finally:
        sys.modules["__main__"] = saved_main if saved_main is not None else main
    return 0


def _run_module(module: str, args: List[str], hook_options) -> int:
    import msprobe_runtime

    from .import_hook import install_import_hook

    sys.path[0] = os.getcwd()
    install_import_hook(
        [*hook_options["packages"], module.partition(".")[0]],
        catalogue_files=hook_options["catalogue"],
        skip_decorators=hook_options["skip_decorators"],
    )
    sys.argv = [module, *args]  # runpy replaces argv[0] with the module's file, as `python -m` does
    try:
        # runpy runs the loader's code in a namespace of its own, so the runtime is bound there too.
        runpy.run_module(module, init_globals={RUNTIME_NAME: msprobe_runtime}, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        return _exit_code(exit_)
    except ImportError as error:
        if getattr(error, "name", None) == module or "No module named" in str(error):
            print(f"msprobe-rewrite run: {error}", file=sys.stderr)
            return 1
        raise
    except Exception as error:
        _report(error, lambda frame: frame.f_globals.get("__name__") == "__main__")
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    from msprobe_runtime import call_stacks

    from .import_hook import packages_from_environment

    # stack.json shows the program's frames as under ``python``: this launcher's and whatever started it
    # (cli.py, the console script, runpy) are the tool's (tests/runtime/test_tool_frames.py)
    call_stacks.hide_launcher(_run_script.__code__, _run_module.__code__)

    ours, module, script, args = _split(sys.argv[1:] if argv is None else argv)
    options = _parser().parse_args(ours)
    if module is None and script is None:
        print(f"usage: {USAGE}", file=sys.stderr)
        return 2
    packages = [p for group in options.packages for p in group.split(",") if p.strip()]
    hook_options = dict(
        packages=[*packages, *packages_from_environment()],
        catalogue=options.catalogue,
        skip_decorators=options.skip_decorator,
    )
    from msprobe_runtime.catalogue import CatalogueError

    try:
        if module is not None:
            return _run_module(module, args, hook_options)
        return _run_script(script, args, hook_options)
    except CatalogueError as error:
        print(f"msprobe-rewrite run: {error}", file=sys.stderr)
        return 2
