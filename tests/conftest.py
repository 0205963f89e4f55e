"""Fixtures shared by every test directory."""
import pytest


@pytest.fixture(scope="session")
def msprobe_python():
    """An interpreter with mindstudio-probe 26.2 (fixtures/msprobe_env.py), or a skip that says why not."""
    from fixtures import msprobe_env

    try:
        return msprobe_env.msprobe_python()
    except msprobe_env.Unavailable as reason:
        pytest.skip(str(reason))
