"""The API catalogue: which callables are APIs, and the dump name of each.

Read from YAML in the sections of msprobe's ``support_wrap_ops.yaml`` (a user's own copy of that file is
accepted as it is) plus a ``custom`` section mapping fully qualified names to dump names. Shared by the
compiler (static resolution by qualified name) and the runtime (resolution by identity), so it imports
neither torch nor libcst.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

# section -> (module whose attributes the names are, dump-name prefix). msprobe's `aten` section lists
# kernels (its L2 level), which no call site names, so it is read and ignored.
SECTIONS: Mapping[str, Tuple[str, str]] = {
    "functional": ("torch.nn.functional", "Functional"),
    "tensor": ("torch.Tensor", "Tensor"),
    "torch": ("torch", "Torch"),
    "_VF": ("torch._VF", "VF"),
    "torch_npu": ("torch_npu", "NPU"),
    "distributed": ("torch.distributed", "Distributed"),
    "npu_distributed": ("torch_npu.distributed", "Distributed"),
    "mindspeed": ("mindspeed.ops", "MindSpeed"),
}
IGNORED_SECTIONS = frozenset({"aten"})

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FILES: Tuple[str, ...] = (
    os.path.join(_HERE, "catalogue", "support_wrap_ops.yaml"),
    os.path.join(_HERE, "catalogue", "custom_apis.yaml"),
)


class CatalogueError(ValueError):
    """A catalogue file that cannot be read or has an unknown shape."""


@dataclass(frozen=True)
class Catalogue:
    """Qualified name (``torch.nn.functional.gelu``) -> dump name (``Functional.gelu``)."""

    by_qualname: Mapping[str, str]
    digest: str = field(default="")

    def dump_name(self, qualname: str) -> Optional[str]:
        return self.by_qualname.get(qualname)

    @property
    def modules(self) -> frozenset:
        """Every module prefix under which some entry lives (``torch``, ``torch.nn``, ...)."""
        prefixes = set()
        for qualname in self.by_qualname:
            parts = qualname.split(".")
            for i in range(1, len(parts)):
                prefixes.add(".".join(parts[:i]))
        return frozenset(prefixes)


def _entries_of(data: Mapping, source: str) -> Dict[str, str]:
    entries: Dict[str, str] = {}
    if not isinstance(data, Mapping):
        raise CatalogueError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
    for section, names in data.items():
        if section in IGNORED_SECTIONS or names is None:
            continue
        if section == "custom":
            if not isinstance(names, Mapping):
                raise CatalogueError(f"{source}: section 'custom' must map qualified names to dump names")
            for qualname, dump_name in names.items():
                entries[str(qualname)] = str(dump_name)
            continue
        if section not in SECTIONS:
            raise CatalogueError(f"{source}: unknown section {section!r}; known: {', '.join(sorted(SECTIONS))}, custom")
        if not isinstance(names, Sequence) or isinstance(names, str):
            raise CatalogueError(f"{source}: section {section!r} must be a list of API names")
        module, prefix = SECTIONS[section]
        for name in names:
            entries[f"{module}.{name}"] = f"{prefix}.{name}"
    return entries


def load_catalogue(extra_files: Iterable[str] = (), *, defaults: bool = True) -> Catalogue:
    """Load the shipped catalogue, then each of ``extra_files`` on top (later entries replace earlier)."""
    import yaml  # deferred: the hot path of the runtime never needs it

    files = list(DEFAULT_FILES if defaults else ()) + [os.fspath(f) for f in extra_files]
    merged: Dict[str, str] = {}
    digest = hashlib.sha256()
    for path in files:
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError as error:
            raise CatalogueError(f"cannot read catalogue {path}: {error.strerror}") from error
        digest.update(raw)
        try:
            # libyaml's loader where it is built in: the pure-Python one is many times slower on a catalogue
            # this size, and every process that collects parses it.
            data = yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
        except yaml.YAMLError as error:
            raise CatalogueError(f"{path}: not valid YAML: {error}") from error
        merged.update(_entries_of(data, path))
    return Catalogue(by_qualname=merged, digest=digest.hexdigest())
