"""Token sequences stored as runs of consecutive ids.

A Mooncake prompt of 12,000 tokens is a chain of 512-token blocks whose ids are
``hash_id * 512 + i``: a handful of runs, not 12,000 Python ints. Every manager works on
the canonical run form (maximal runs of consecutive ids), so a plain token list and a lazily
expanded trace prompt with the same ids behave identically, token for token.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence

Run = tuple[int, int]  # (first token id, number of tokens), ids first, first+1, ...

# Generated (reply) token ids live far above any vocabulary or trace-derived id.
GENERATED_ID_BASE = 1 << 52
GENERATED_ID_STRIDE = 1 << 24  # at most 16.7 M generated tokens per request


def canonical_runs(runs: Iterable[Run]) -> tuple[Run, ...]:
    """Merge adjacent runs that continue each other and drop empty ones."""
    out: list[list[int]] = []
    for start, n in runs:
        if n <= 0:
            continue
        if out and out[-1][0] + out[-1][1] == start:
            out[-1][1] += n
        else:
            out.append([start, n])
    return tuple((s, n) for s, n in out)


def runs_of_list(ids: Sequence[int]) -> tuple[Run, ...]:
    """Canonical runs of an explicit id list."""
    if isinstance(ids, range) and ids.step == 1:
        return ((ids.start, len(ids)),) if len(ids) else ()
    out: list[Run] = []
    it = iter(ids)
    for first in it:
        start = prev = first
        break
    else:
        return ()
    for t in it:
        if t == prev + 1:
            prev = t
            continue
        out.append((start, prev - start + 1))
        start = prev = t
    out.append((start, prev - start + 1))
    return tuple(out)


class RunTokens(Sequence[int]):
    """An immutable token-id sequence held as runs; expands lazily (``list(x)``, ``x[i]``)."""

    __slots__ = ("runs", "_len")

    def __init__(self, runs: Iterable[Run]):
        self.runs = canonical_runs(runs)
        self._len = sum(n for _, n in self.runs)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        for s, n in self.runs:
            yield from range(s, s + n)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return list(self)[i]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(i)
        for s, n in self.runs:
            if i < n:
                return s + i
            i -= n
        raise IndexError(i)  # pragma: no cover

    def __eq__(self, other) -> bool:
        if isinstance(other, RunTokens):
            return self.runs == other.runs
        if isinstance(other, (list, tuple)):
            return self.runs == runs_of_list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.runs)

    def __add__(self, other: Sequence[int]) -> RunTokens:
        return RunTokens(self.runs + to_runs(other))

    def __repr__(self) -> str:
        return f"RunTokens({len(self)} tokens in {len(self.runs)} runs)"


def to_runs(seq: Sequence[int]) -> tuple[Run, ...]:
    """Canonical runs of any token sequence (RunTokens keeps its own)."""
    if isinstance(seq, RunTokens):
        return seq.runs
    return runs_of_list(list(seq))


def concat(*parts: tuple[Run, ...]) -> tuple[Run, ...]:
    return canonical_runs(r for p in parts for r in p)


def slice_runs(runs: Sequence[Run], lo: int, hi: int) -> tuple[Run, ...]:
    """Tokens [lo, hi) of a run list, as runs."""
    out: list[Run] = []
    pos = 0
    for s, n in runs:
        end = pos + n
        if end > lo and pos < hi:
            a, b = max(lo, pos), min(hi, end)
            out.append((s + a - pos, b - a))
        if end >= hi:
            break
        pos = end
    return tuple(out)


def lcp(a: Sequence[Run], b: Sequence[Run], limit: int | None = None) -> int:
    """Length of the longest common prefix of two run lists (token-exact)."""
    i = j = oi = oj = 0
    total = 0
    na, nb = len(a), len(b)
    while i < na and j < nb:
        sa, la = a[i]
        sb, lb = b[j]
        if sa + oi != sb + oj:
            break
        step = min(la - oi, lb - oj)
        total += step
        if limit is not None and total >= limit:
            return limit
        oi += step
        oj += step
        if oi == la:
            i, oi = i + 1, 0
        if oj == lb:
            j, oj = j + 1, 0
    return total if limit is None else min(total, limit)


def lcp_at(a: Sequence[Run], b: Sequence[Run], bi: int, boff: int, limit: int) -> tuple[int, int, int]:
    """LCP of ``a`` with ``b`` read from run ``bi``, offset ``boff``, at most ``limit`` tokens.

    Returns (length, bi, boff) with the cursor in ``b`` advanced past the common part, so a walk
    down a tree never re-slices the key it matches.
    """
    i = oi = total = 0
    na, nb = len(a), len(b)
    while i < na and bi < nb and total < limit:
        sa, la = a[i]
        sb, lb = b[bi]
        if sa + oi != sb + boff:
            break
        step = min(la - oi, lb - boff, limit - total)
        total += step
        oi += step
        boff += step
        if oi == la:
            i, oi = i + 1, 0
        if boff == lb:
            bi, boff = bi + 1, 0
    return total, bi, boff


def first_tokens_key(runs: Sequence[Run], n: int) -> int | tuple[int, ...]:
    """A canonical key for the first n tokens: the first id when they are one run, else the tuple."""
    if runs and runs[0][1] >= n:
        return runs[0][0]
    return tuple(expand(slice_runs(runs, 0, n)))


def expand(runs: Sequence[Run]) -> list[int]:
    return [t for s, n in runs for t in range(s, s + n)]


def generated_output(request_id: object, n: int) -> RunTokens:
    """The deterministic reply ids used when a Request gives none: a run unique to the id."""
    slot = zlib.crc32(repr(request_id).encode()) & 0x0FFFFFFF
    return RunTokens([(GENERATED_ID_BASE + slot * GENERATED_ID_STRIDE, n)])
