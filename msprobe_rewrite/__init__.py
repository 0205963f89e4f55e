"""msprobe_rewrite: the compiler that instruments PyTorch call sites for precision debugging.

``rewrite_source`` and ``restore_source`` are the whole compiler as functions on bytes; the CLI
(``msprobe-rewrite``) applies them to trees.
"""
__version__ = "0.1.0"
