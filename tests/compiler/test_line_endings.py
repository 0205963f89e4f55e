"""Every line-ending convention Python accepts, through the command line with the real compiler: ``\\n``, ``\\r\\n``,
a lone ``\\r`` (old Mac) and a mix of the three, each with and without a final newline. The rewrite instruments
the file without moving a line or changing an ending, and ``--restore`` gives back its bytes exactly.

libcst counts only ``\\n`` as a final newline, so a file ending in a lone ``\\r`` lost that byte in the rewrite
(and in the libcst restore); ``api._keeping_final_carriage_return`` puts it back.
"""

from __future__ import annotations

import re

import pytest

from msprobe_rewrite import api, cli

LINES = [
    b'"""A module\xc3\xa9,',
    b'its docstring on two lines."""',
    b"import torch",
    b"",
    b"def f(x, w):",
    b"    y = torch.matmul(",
    b"        x, w) + 1",
    b"    if y.sum() > 0:",
    b"        y += x",
    b"    return -y  # negated",
]

ENDINGS = {
    "lf": [b"\n"],
    "crlf": [b"\r\n"],
    "cr": [b"\r"],
    # the last line ends in a lone \r (len(LINES) is a multiple of 3 plus 1), the ending libcst dropped
    "mixed": [b"\r", b"\n", b"\r\n"],
}


def _source(convention: str, final_newline: bool) -> bytes:
    endings = ENDINGS[convention]
    text = b"".join(line + endings[number % len(endings)] for number, line in enumerate(LINES))
    return text if final_newline else text[: -len(endings[(len(LINES) - 1) % len(endings)])]


def _line_endings(data: bytes):
    return re.findall(rb"\r\n|\r|\n", data)


@pytest.mark.parametrize("final_newline", [True, False], ids=["final newline", "no final newline"])
@pytest.mark.parametrize("convention", ENDINGS)
def test_rewrite_then_restore_gives_back_every_byte(convention, final_newline, tmp_path, monkeypatch):
    monkeypatch.setenv("MSPROBE_REWRITE_CACHE_DIR", str(tmp_path / "cache"))
    source = _source(convention, final_newline)
    assert source.endswith(b"\r") == (convention in ("cr", "mixed") and final_newline)
    target = tmp_path / "module.py"
    target.write_bytes(source)

    assert cli.main([str(target), "--jobs", "1"]) == 0
    rewritten = target.read_bytes()
    assert api.RUNTIME_IMPORT.encode() in rewritten and b"__msprobe__.iadd(y, x)" in rewritten
    compile(rewritten, str(target), "exec")
    assert _line_endings(rewritten) == _line_endings(source)  # no line moved, no ending changed or lost

    assert cli.main([str(target), "--restore", "--jobs", "1"]) == 0
    assert target.read_bytes() == source
