"""The worker's entry points by a module that imports no torch at load, so that the parent can name them
for a process pool without importing torch itself; torch is imported in the worker, on first use."""


def init(table, threads):
    from . import worker

    worker.init(table, threads)


def check(item):
    from . import worker

    return worker.check(item)
