"""The folder ``msprobe-rewrite hook-path`` prints: its ``sitecustomize`` installs the hook from the environment."""
