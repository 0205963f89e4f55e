"""config.json's scope and list, matched as msprobe matches them (its core/dump/data_dump/scope.py).

- ``scope``: two full entry names, the start and the end of a range. It opens at the entry named first and
  closes after the one named second; a module name opens when that module's forward begins and closes when
  it ends, so everything called inside the end module is in the range.
- ``list``: substrings of entry names (``"relu"``, ``"Torch.relu.1.forward"``, ``"Module.net1"``). At mix, an
  entry naming a module also selects every API called while that module's forward runs, as msprobe does.

Like msprobe's, the range is one state that moves through the entries in the order they are recorded: forward
entries as the calls run, backward entries as their gradients arrive. A range of forward names therefore selects
forward entries only, and a range of backward names (``Torch.relu.1.backward``) backward entries. A module's
forward entry is decided when its forward begins. A list entry is matched against each name, so one ending in
``.backward`` selects only that backward; at mix a listed module's forward selects the forward entries inside
it, while backward entries are matched by name only (as msprobe 26.2 does). An entry that matches no name by
the end of a step is reported once, never silently. Imports nothing heavy: the collector calls it per entry.
"""

from __future__ import annotations

import difflib
import logging

from . import dump_names

logger = logging.getLogger("msprobe_runtime")

_SEEN_CAP = 4096  # names kept per step, only to suggest the nearest one in a warning


class Selection:
    def __init__(self, scope, names, level, where="statistics"):
        self.scope = tuple(scope)
        self.names = tuple(names)
        self.list_modules = level == "mix"  # msprobe's MixRangeScope: a listed module selects the APIs inside
        self.where = where
        self._warned = set()
        # msprobe's range state lives for the whole session (a range left open runs into the next step)
        self.in_scope = not self.scope
        self.reset()

    def reset(self):
        """A new step: call indices restart."""
        self.open_modules = set()  # forward names of listed modules whose forward is running (mix)
        self.grad_modules = set()  # forward names of modules whose backward entry is selected
        self.matched = set()
        self.seen = []

    def _listed(self, name):
        hit = False
        for entry in self.names:
            if entry in name:
                self.matched.add(entry)
                hit = True
        return hit

    def _see(self, name):
        if len(self.seen) < _SEEN_CAP:
            self.seen.append(name)

    def _open(self, name):
        if self.scope and name == self.scope[0]:
            self.in_scope = True
            self.matched.add(name)

    def _close(self, name):
        if self.scope and name == self.scope[-1]:
            self.in_scope = False
            self.matched.add(name)

    def _forward(self, forward):
        if not self.in_scope:
            return False
        if not self.names:
            return True
        listed = self._listed(forward)
        return listed or bool(self.open_modules)

    def _hook_backward(self, backward):
        """Whether the call's backward may be selected: by list, known now; by scope, only when it runs."""
        return not self.names or self._listed(backward)

    def api(self, forward, backward):
        """(forward entry selected, backward worth hooking) for an API call, decided when it runs."""
        self._see(forward)
        self._open(forward)
        selected = self._forward(forward)
        self._close(forward)
        return selected, self._hook_backward(backward)

    def module_begin(self, forward, backward):
        """(forward entry selected, backward worth hooking) for a module call whose forward begins now
        (msprobe creates a module's entry when its forward begins)."""
        self._see(forward)
        self._open(forward)
        if self.list_modules and self.names and self._listed(forward):
            self.open_modules.add(forward)
        return self._forward(forward), self._hook_backward(backward)

    def module_end(self, forward):
        self._close(forward)
        self.open_modules.discard(forward)

    def backward(self, name):
        """Whether a backward entry is selected, asked when its first gradient arrives: the range moves in
        the order backward runs, as msprobe's hooks see it."""
        self._see(name)
        self._open(name)
        selected = self.in_scope
        self._close(name)
        if selected:
            forward = dump_names.forward_name(name)
            if forward is not None and dump_names.is_module(name):
                self.grad_modules.add(forward)
        return selected

    def parameters_grad(self, name):
        """A module's parameters_grad entry goes with its backward entry (msprobe's backward_module_names), or
        is listed itself."""
        self._see(name)
        return dump_names.forward_name(name) in self.grad_modules or (
            self.in_scope and bool(self.names) and self._listed(name)
        )

    def end_step(self):
        """Warn once per entry that matched no entry name in this step (when the step recorded any)."""
        if not self.seen:
            return
        for field, entries in (("scope", self.scope), ("list", self.names)):
            for entry in entries:
                if entry in self.matched or (field, entry) in self._warned:
                    continue
                self._warned.add((field, entry))
                close = difflib.get_close_matches(entry, self.seen, n=1, cutoff=0.6)
                hint = (
                    f"; the nearest name recorded is {close[0]!r}"
                    if close
                    else (f"; names recorded look like {self.seen[0]!r}")
                )
                logger.warning(
                    "msprobe_runtime: %s.%s entry %r matched no dump name in this step%s",
                    self.where,
                    field,
                    entry,
                    hint,
                )
