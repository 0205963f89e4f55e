"""What a module's source text says about its rewrite, read without parsing it and without libcst: the opt-out
markers, the runtime import that marks it instrumented, spellings libcst does not reproduce, and its package.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from msprobe_runtime.contract import RUNTIME_MODULE, RUNTIME_NAME

RUNTIME_IMPORT = f"import {RUNTIME_MODULE} as {RUNTIME_NAME}"
SKIP_FILE_MARKER = re.compile(rb"^[ \t]*#[ \t]*msprobe:[ \t]*skip-file\b", re.MULTILINE)
SKIP_MARKER = re.compile(r"#\s*msprobe:\s*skip\b(?!-)")  # on a def/class: its body is left as written
# Spellings that libcst 1.x does not reproduce byte for byte (a form feed before an indented statement,
# `except E :`, indented blank or comment lines after blank lines at the end of the file, and Python 3.12's
# `f"{x!r }"`); a file with one is checked whole.
SPACED_EXCEPT_COLON = re.compile(rb"except\b[^\n:#]*[ \t]:")
SPACED_CONVERSION = re.compile(rb"![rsa][ \t]+[}:]")
# A call of a runtime entry point (`__msprobe__.call(`, `__msprobe__.add(`): an instrumented form, which marks
# a file as instrumented even after its runtime import was deleted.
_RUNTIME_DOT = RUNTIME_NAME.encode() + b"."
RUNTIME_FORM = re.compile(rb"(?<![\w.])" + re.escape(RUNTIME_NAME.encode()) + rb"\.[A-Za-z_]\w*\(")


def maybe_lossy(source: bytes) -> bool:
    if b"\x0c" in source or SPACED_EXCEPT_COLON.search(source) or SPACED_CONVERSION.search(source):
        return True
    for line in reversed(source[-4096:].split(b"\n")[1:]):  # the blank and comment lines at the end
        stripped = line.lstrip(b" \t")
        if stripped and not stripped.startswith(b"#"):
            return False
        if stripped != line:
            return True
    return False


def is_instrumented(source: bytes) -> bool:
    """Whether ``source`` may be instrumented: it carries the runtime import that ``rewrite_source`` adds, or a
    call of a runtime entry point (a form whose import was deleted). A text test, so a string that spells either
    passes it too; ``restore_source`` parses and says for sure."""
    if RUNTIME_IMPORT.encode() in source:
        return True
    return _RUNTIME_DOT in source and RUNTIME_FORM.search(source) is not None


def package_of(path: str) -> Optional[str]:
    """The dotted package a file belongs to, from the ``__init__.py`` files above it (for relative imports)."""
    if path.startswith("<"):
        return None
    directory = os.path.dirname(os.path.abspath(path))
    parts = []
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        parts.append(os.path.basename(directory))
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return ".".join(reversed(parts)) or None


def module_of(path: str, package: Optional[str]) -> Optional[str]:
    """The dotted name of the module at ``path`` in ``package`` (``package`` itself for its ``__init__.py``): the
    qualified names of the functions it defines, which the catalogue may name (apex's ``fused_rms_norm_affine``
    called by ``FusedRMSNorm.forward`` in the same file)."""
    if path.startswith("<"):
        return None
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem == "__init__":
        return package
    return f"{package}.{stem}" if package else stem
