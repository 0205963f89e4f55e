"""msprobe_rewrite: the compiler that instruments PyTorch call sites for precision debugging.

``api.rewrite_source`` and ``api.restore_source`` are the whole compiler as functions on bytes; the CLI
(``msprobe-rewrite``) applies them to trees, and ``install_import_hook`` applies them as modules are imported.
"""

from ._version import __version__  # noqa: F401  (a leaf: cache.py reads it too)


def install_import_hook(packages=(), **options):
    """Instrument ``packages`` as they are imported; see ``msprobe_rewrite.import_hook``."""
    from .import_hook import install_import_hook as install

    return install(packages, **options)
