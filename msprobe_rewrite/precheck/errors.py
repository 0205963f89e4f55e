"""The pre-check's error types: a dump that cannot be checked at all, and one entry that cannot be replayed."""


class PrecheckError(Exception):
    """The dump as a whole cannot be checked (no dump, a statistics-only dump): exit status 2, no traceback."""


class Unreplayable(Exception):
    """One entry cannot be replayed; the message says why and goes into its row.

    ``input_problem`` marks a fault of the dump (a missing or truncated tensor file, an API the catalogue
    does not know), which the command also reports on stderr and in its exit status; the rest (random ops,
    communication, ops the CPU build lacks) are limits of replaying, reported in the row only.
    """

    def __init__(self, message: str, input_problem: bool = False):
        super().__init__(message)
        self.input_problem = input_problem
