"""The compiler's version, in a leaf: ``cache`` keys its entries by it and the CLI prints it, and reading it from
the package's ``__init__`` closed a cycle through ``install_import_hook`` (tests/test_import_graph.py)."""

__version__ = "0.1.0"
