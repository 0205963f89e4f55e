"""Sequence alignment of two runs' entries, so one extra or missing call leaves every other entry matched.

msprobe matches by exact name, call index included: one extra ``Torch.tanh`` shifts the index of every later
``Torch.tanh`` and nothing after it matches. Here an entry's key is its API or module, its direction and
its call site (``file:line`` from stack.json), without the index; the two key sequences are aligned by a
shortest edit script (Myers' O((N+M)D) diff), which costs almost nothing when the runs agree. Gaps that the
fine keys leave are aligned again by API and direction alone, so two runs of code whose line numbers moved
still pair up.
"""

from __future__ import annotations

from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

MAX_EDIT_DISTANCE = 2000  # beyond this the runs differ in structure, and a greedy pass is used instead
GREEDY_WINDOW = 256

Pair = Tuple[Optional[int], Optional[int]]


def _codes(a: Sequence[Hashable], b: Sequence[Hashable]) -> Tuple[List[int], List[int]]:
    table: Dict[Hashable, int] = {}
    return ([table.setdefault(k, len(table)) for k in a], [table.setdefault(k, len(table)) for k in b])


def _myers(a: List[int], b: List[int]) -> Optional[List[Tuple[int, int]]]:
    """Matched index pairs of a longest common subsequence, or None past MAX_EDIT_DISTANCE edits."""
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return []
    offset = n + m
    v = [0] * (2 * offset + 2)
    trace: List[List[int]] = []
    for d in range(min(n + m, MAX_EDIT_DISTANCE) + 1):
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]
            else:
                x = v[offset + k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[offset + k] = x
            if x >= n and y >= m:
                trace.append(v[offset - d : offset + d + 1])
                return _backtrack(trace, a, b, n, m)
        trace.append(v[offset - d : offset + d + 1])  # only the diagonals reachable at d: O(D^2) in all
    return None


def _backtrack(trace: List[List[int]], a, b, n: int, m: int) -> List[Tuple[int, int]]:
    matches: List[Tuple[int, int]] = []
    x, y = n, m
    for d in range(len(trace) - 1, -1, -1):
        k = x - y
        if d == 0:
            while x > 0 and y > 0:
                x, y = x - 1, y - 1
                matches.append((x, y))
            break
        previous = trace[d - 1]  # diagonals -(d-1)..(d-1) stored at 0..2d-2

        def at(diagonal):
            return previous[diagonal + d - 1]

        if k == -d or (k != d and at(k - 1) < at(k + 1)):
            prev_k = k + 1
        else:
            prev_k = k - 1
        prev_x = at(prev_k)
        prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y and a[x - 1] == b[y - 1]:
            x, y = x - 1, y - 1
            matches.append((x, y))
        x, y = prev_x, prev_y
    matches.reverse()
    return matches


def _greedy(a: List[int], b: List[int]) -> List[Tuple[int, int]]:
    """Pair each entry with the nearest equal one ahead on the other side (runs too different for Myers)."""
    matches = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            matches.append((i, j))
            i, j = i + 1, j + 1
            continue
        ahead_b = next((t for t in range(j + 1, min(len(b), j + GREEDY_WINDOW)) if b[t] == a[i]), None)
        ahead_a = next((t for t in range(i + 1, min(len(a), i + GREEDY_WINDOW)) if a[t] == b[j]), None)
        if ahead_b is not None and (ahead_a is None or ahead_b - j <= ahead_a - i):
            j = ahead_b
        elif ahead_a is not None:
            i = ahead_a
        else:
            i, j = i + 1, j + 1
    return matches


def lcs(a: Sequence[Hashable], b: Sequence[Hashable]) -> List[Tuple[int, int]]:
    """Index pairs (i, j) with a[i] == b[j], increasing on both sides, as many as the edit script allows."""
    ca, cb = _codes(a, b)
    head = 0
    while head < len(ca) and head < len(cb) and ca[head] == cb[head]:
        head += 1
    tail = 0
    while tail < len(ca) - head and tail < len(cb) - head and ca[-1 - tail] == cb[-1 - tail]:
        tail += 1
    mid_a, mid_b = ca[head : len(ca) - tail], cb[head : len(cb) - tail]
    middle = _myers(mid_a, mid_b)
    if middle is None:
        middle = _greedy(mid_a, mid_b)
    out = [(i, i) for i in range(head)]
    out.extend((i + head, j + head) for i, j in middle)
    out.extend((len(ca) - tail + t, len(cb) - tail + t) for t in range(tail))
    return out


def align(fine_a: Sequence[Hashable], fine_b: Sequence[Hashable], coarse: Callable[[Hashable], Hashable]) -> List[Pair]:
    """The merged order of both runs: (i, j) matched, (i, None) only in A, (None, j) only in B.

    Fine keys first; each gap between two fine matches is aligned again on ``coarse(key)``.
    """
    matches = lcs(fine_a, fine_b)
    merged: List[Pair] = []
    prev_i = prev_j = -1
    for i, j in matches + [(len(fine_a), len(fine_b))]:
        gap_a = range(prev_i + 1, i)
        gap_b = range(prev_j + 1, j)
        if gap_a and gap_b:
            inner = lcs([coarse(fine_a[t]) for t in gap_a], [coarse(fine_b[t]) for t in gap_b])
            merged.extend(_interleave(inner, gap_a.start, gap_b.start, len(gap_a), len(gap_b)))
        else:
            merged.extend((t, None) for t in gap_a)
            merged.extend((None, t) for t in gap_b)
        if i < len(fine_a):
            merged.append((i, j))
        prev_i, prev_j = i, j
    return merged


def _interleave(matches, start_a: int, start_b: int, len_a: int, len_b: int) -> List[Pair]:
    out: List[Pair] = []
    i = j = 0
    for mi, mj in matches + [(len_a, len_b)]:
        out.extend((start_a + t, None) for t in range(i, mi))
        out.extend((None, start_b + t) for t in range(j, mj))
        if mi < len_a:
            out.append((start_a + mi, start_b + mj))
        i, j = mi + 1, mj + 1
    return out
