#!/usr/bin/env python3
"""The commit-msg hook: a subject of at most 72 characters, then a blank line and a body that says why.

    python tools/check_commit_message.py .git/COMMIT_EDITMSG     # what pre-commit's commit-msg stage runs

The subject is what ``git log --oneline`` and review tools show, cut at 72 characters; the body is where a
commit says why, which the diff cannot. Lines git strips from the message are ignored: comments (``#``, or
``core.commentChar`` where set) and everything below the scissors line of ``git commit -v``. Merge commits
(``Merge ...``, git's own subject, or any message while ``MERGE_HEAD`` exists) and ``fixup!``, ``squash!`` and
``amend!`` commits, which ``git rebase --autosquash`` folds into another commit, are let through. Exit status
0 accepted, 1 refused (the reasons on stderr), 2 unreadable. Standard library only: it runs without the
project installed (tests/test_commit_message.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List, Optional

MAX_SUBJECT = 72
SCISSORS = "------------------------ >8 ------------------------"
EXEMPT_PREFIXES = ("Merge ", "fixup! ", "squash! ", "amend! ")


def git_output(*args: str) -> str:
    """What ``git args`` prints, stripped; empty where git is missing or fails (outside a repository)."""
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def merging() -> bool:
    """Whether git is concluding a merge (``MERGE_HEAD`` exists), whatever the message's subject."""
    path = git_output("rev-parse", "--git-path", "MERGE_HEAD")
    return bool(path) and os.path.exists(path)


def comment_char() -> str:
    """git's ``core.commentChar`` ('#' unless set; 'auto' is treated as '#')."""
    value = git_output("config", "core.commentChar")
    return value if len(value) == 1 else "#"


def message_lines(text: str, comment: str = "#") -> List[str]:
    """The message as git records it: lines up to the scissors line, comments dropped, trailing space kept off."""
    lines = []
    for line in text.splitlines():
        if line.startswith(comment) and line.lstrip(comment).strip() == SCISSORS:
            break
        if line.startswith(comment):
            continue
        lines.append(line.rstrip())
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def problems(text: str, comment: str = "#") -> List[str]:
    """Why ``text`` is refused as a commit message; empty where it is accepted."""
    lines = message_lines(text, comment)
    if not lines:
        return ["the message is empty"]
    subject = lines[0]
    if subject.startswith(EXEMPT_PREFIXES):
        return []
    found = []
    if len(subject) > MAX_SUBJECT:
        found.append(f"the subject is {len(subject)} characters, more than {MAX_SUBJECT}: {subject!r}")
    if len(lines) == 1:
        found.append("there is no body: add a blank line after the subject, then say why")
    elif lines[1]:
        found.append("the second line is not blank: a blank line separates the subject from the body")
    return found


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: check_commit_message.py COMMIT_MESSAGE_FILE", file=sys.stderr)
        return 2
    try:
        with open(args[0], encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError as error:
        print(f"check_commit_message: cannot read {args[0]}: {error.strerror}", file=sys.stderr)
        return 2
    if merging():
        return 0
    found = problems(text, comment_char())
    for reason in found:
        print(f"commit message: {reason}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
