"""The grammar of dump entry names, built by the collector and taken apart by compare (one module for both).

    API call:        {api}.{n}                      Functional.gelu.3
      its entries:   {api}.{n}.forward              Functional.gelu.3.forward
                     {api}.{n}.backward             Functional.gelu.3.backward
    module prefix:   Module.{path}.{Class}.         Module.net1.ln1.Linear.
                     Module.{chunk}.{path}.{Class}. Module.0.decoder.layers.0.mlp.MLP.   (start([chunks]))
      its entries:   {prefix}forward.{n}            Module.net1.ln1.Linear.forward.0
                     {prefix}backward.{n}           Module.net1.ln1.Linear.backward.0
                     {prefix}parameters_grad.{n}    Module.net1.ln1.Linear.parameters_grad.0

A record's tensor files (``task: tensor``) extend an entry's name with the field and position:
``{entry}.input.0.pt``, ``{entry}.output.0.pt``, ``{entry}.parameters.weight.pt``, ``{entry}.{param}.pt``,
each made one plain file name by ``tensor_file_name``.
Imports nothing heavy: the runtime's hot path and the compiler's compare both use it.
"""

from __future__ import annotations

import hashlib
from typing import Optional, Tuple

FORWARD = "forward"
BACKWARD = "backward"
PARAMETERS_GRAD = "parameters_grad"
DIRECTIONS = (FORWARD, BACKWARD, PARAMETERS_GRAD)


# ----------------------------------------------------------------- building (the collector)


def api_call(api_name: str, index: int) -> str:
    return f"{api_name}.{index}"


def api_forward(call: str) -> str:
    return f"{call}.forward"


def api_call_forward(api_name: str, index: int) -> tuple:
    """``(api_call(...), api_forward(...))`` in one call: the collector names every API call so."""
    call = f"{api_name}.{index}"
    return call, f"{call}.forward"


def api_backward(call: str) -> str:
    return f"{call}.backward"


def module_prefix(path: str, class_name: str) -> str:
    return f"Module.{path}.{class_name}."


def module_forward(prefix: str, index: int) -> str:
    return f"{prefix}forward.{index}"


def module_backward(forward: str) -> str:
    """The backward entry of a module's forward entry (same call index)."""
    return forward.replace(".forward.", ".backward.")


def parameters_grad(prefix: str, index: int) -> str:
    return f"{prefix}parameters_grad.{index}"


def stem(entry: str, *fields: str) -> str:
    """The stem of a record's tensor files: ``stem("Functional.gelu.0.forward", "input")`` is
    ``Functional.gelu.0.forward.input`` (the position and ``.pt`` follow)."""
    return ".".join((entry, *fields))


_NOT_IN_FILE_NAMES = str.maketrans({"/": "_", "\\": "_", "\0": "_"})
_MAX_FILE_NAME = 255  # bytes: the limit of common file systems (ext4, xfs, NTFS, APFS)


def tensor_file_name(stem: str) -> str:
    """The file of a record's tensor, ``{stem}.pt``, as one plain name in the dump's tensor folder.

    Names come from the user (``save(t, "loss/train")``, a ``ModuleDict`` key ``"attn/q"``, a crafted
    ``"../../escaped"``): a separator or NUL becomes ``_``, so no name leaves the folder or needs a folder
    that is not there, and a name past the file system's limit keeps its head and a hash of the whole. The
    entry's own name in dump.json stays as the user wrote it; its record's ``data_name`` is this name."""
    name = stem.translate(_NOT_IN_FILE_NAMES) + ".pt"
    if len(name.encode("utf-8", "surrogatepass")) > _MAX_FILE_NAME:
        digest = hashlib.sha256(stem.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        head = name.encode("utf-8", "surrogatepass")[: _MAX_FILE_NAME - 24].decode("utf-8", "ignore")
        name = f"{head}.{digest}.pt"
    return name


def is_plain_file_name(name: str) -> bool:
    """Whether ``name`` is one file name in its folder (what ``tensor_file_name`` makes): the writer and
    compare's reader refuse any other, since a dump's names are not trusted to reach elsewhere."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def is_forward(name: str) -> bool:
    """``Functional.gelu.0.forward`` or ``Module.net1.Linear.forward.0`` (a module cannot be named "forward")."""
    return name.endswith(".forward") or ".forward." in name


# ----------------------------------------------------------------- parsing (compare)


def split_name(name: str) -> Tuple[str, str, Optional[int]]:
    """(base, direction, index); a name of no known shape is its own base with direction ''.

    ``Functional.gelu.3.forward`` -> (``Functional.gelu``, ``forward``, 3);
    ``Module.net1.ln1.Linear.backward.0`` -> (``Module.net1.ln1.Linear``, ``backward``, 0).
    """
    parts = name.split(".")
    if len(parts) >= 3:
        if parts[-1] in DIRECTIONS and parts[-2].isdigit():  # API: Prefix.api.N.direction
            return ".".join(parts[:-2]), parts[-1], int(parts[-2])
        if parts[-2] in DIRECTIONS and parts[-1].isdigit():  # module: Module.path.Class.direction.N
            return ".".join(parts[:-2]), parts[-2], int(parts[-1])
    return name, "", None


def forward_name(name: str) -> Optional[str]:
    """The forward entry whose stack a backward (or parameters_grad) entry shares, or None."""
    parts = name.split(".")
    if len(parts) >= 3:
        if parts[-1] == BACKWARD and parts[-2].isdigit():
            return ".".join(parts[:-1] + [FORWARD])
        if parts[-2] in (BACKWARD, PARAMETERS_GRAD) and parts[-1].isdigit():
            return ".".join(parts[:-2] + [FORWARD, parts[-1]])
    return None


def is_module(name: str) -> bool:
    return name.startswith("Module.") or name.startswith("Cell.")


def scope_kind(name: str) -> Optional[str]:
    """``"api"`` or ``"module"`` for a full dump name as msprobe's ``scope`` option takes it, an API's or a
    module's forward or backward entry (``Torch.relu.1.forward``, ``Module.net1.Linear.backward.0``); else
    None (``parameters_grad`` entries and partial names included)."""
    base, direction, index = split_name(name)
    if direction not in (FORWARD, BACKWARD) or index is None:
        return None
    prefix, dot, rest = base.partition(".")
    if not dot or not rest:
        return None
    module_shape = name.rsplit(".", 2)[-2] == direction  # Module.path.Class.forward.N, not Prefix.api.N.forward
    if is_module(name):
        return "module" if module_shape else None
    return "api" if not module_shape and prefix.isidentifier() else None
