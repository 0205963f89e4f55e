"""The rewritten copy of megatron-core these tests share is tests/conftest.py's ``megatron_copy``."""
