"""Every restore in the compiler's tests also runs the libcst restore, its reference, and must agree with it.

The restore inverts the forms on text (``msprobe_rewrite.text_restore``) and falls back to libcst where it
cannot be sure; wherever it did not fall back, its bytes and notes must be the reference's.
"""

import pytest

from msprobe_rewrite import api, guard, text_restore


@pytest.fixture(autouse=True)
def restores_agree_with_libcst(monkeypatch):
    text_path = api.restore_report

    def checked(source, path="<string>"):
        before = sum(text_restore.FALLBACKS.values())
        result = text_path(source, path)
        if sum(text_restore.FALLBACKS.values()) == before and api.is_instrumented(source):
            reference = api.restore_report_cst(source, path)
            assert result == reference, f"{path}: the text restore differs from the libcst restore"
        return result

    checked.__wrapped__ = text_path
    monkeypatch.setattr(api, "restore_report", checked)
    monkeypatch.setattr(guard, "restore_report", checked)
