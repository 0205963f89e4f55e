"""Installs the import hook at interpreter start for the packages named in ``$MSPROBE_REWRITE_PACKAGES``.

For launchers the user cannot change (a cluster job script, ``torchrun`` started by someone else's tool):
put this folder on ``PYTHONPATH`` (``msprobe-rewrite hook-path`` prints it) and name the packages in the
environment. Any other ``sitecustomize`` on ``sys.path`` still runs afterwards.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _install():
    if os.environ.get("MSPROBE_REWRITE_PACKAGES"):
        import warnings

        try:
            from msprobe_rewrite.import_hook import install_from_environment

            install_from_environment()
        except Exception as error:  # never stop the interpreter from starting
            warnings.warn(f"msprobe-rewrite: import hook not installed: {error}", RuntimeWarning)


def _chain():
    here = os.path.dirname(os.path.realpath(__file__))
    others = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_install()
_chain()
