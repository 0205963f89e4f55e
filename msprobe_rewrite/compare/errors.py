"""The one error type of the compare command: a problem with the user's input, reported with exit status 2."""


class CompareError(Exception):
    """Paths that are missing, files that are not dumps, or two runs that cannot be compared."""
